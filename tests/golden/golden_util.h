// Helpers of the golden and gradient-check tests: a reader for the golden HDF5 files scripts/golden_pytorch.py
// writes, and one tensor comparison with a per-dtype tolerance that names what fails (STYLE habits 6 and 7).
#pragma once

#include <renaissance/core/error.h>
#include <renaissance/io/hdf5_util.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::golden {

/// |got − ref| ≤ abs · max|ref| + rel · |ref| for every element (abs is relative to the tensor's largest value, so one
/// number serves tensors of any scale); NaN or inf never passes.
struct Tolerance {
  double abs = 0;
  double rel = 0;
};

/// What a comparison measured: the worst error relative to max|ref| (the number the docs quote), where it is.
struct Measured {
  double max_abs = 0;         ///< max |got − ref|
  double max_rel_to_max = 0;  ///< max |got − ref| / max|ref|
  double ref_max = 0;         ///< max |ref|
  std::size_t worst = 0;      ///< index of the largest |got − ref| / (abs · max|ref| + rel · |ref|)
  double worst_ratio = 0;     ///< that ratio: > 1 fails
};

inline Measured measure(const std::vector<double>& got, const std::vector<double>& ref, Tolerance tol) {
  Measured m;
  for (double r : ref) m.ref_max = std::max(m.ref_max, std::abs(r));
  for (std::size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double d = std::abs(got[i] - ref[i]);
    const double bound = tol.abs * m.ref_max + tol.rel * std::abs(ref[i]);
    const bool finite = std::isfinite(got[i]) && std::isfinite(ref[i]);  // a NaN on either side never passes
    const double ratio = finite ? (bound > 0 ? d / bound : (d > 0 ? HUGE_VAL : 0.0)) : HUGE_VAL;
    m.max_abs = std::max(m.max_abs, finite ? d : HUGE_VAL);
    if (ratio > m.worst_ratio) {
      m.worst_ratio = ratio;
      m.worst = i;
    }
  }
  m.max_rel_to_max = m.ref_max > 0 ? m.max_abs / m.ref_max : m.max_abs;
  return m;
}

/// The comparison as a gtest assertion: the message names the tensor, the worst element, both values, the bound.
inline ::testing::AssertionResult close(const std::string& what, const std::vector<double>& got,
                                        const std::vector<double>& ref, Tolerance tol, Measured* out = nullptr) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, the reference has " << ref.size();
  if (ref.empty()) return ::testing::AssertionFailure() << what << ": no values";
  const Measured m = measure(got, ref, tol);
  if (out) *out = m;
  if (m.worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  const std::size_t i = m.worst;
  return ::testing::AssertionFailure() << fmt::format(
             "{}: element {} is {:.9g}, the reference {:.9g} (|diff| {:.3g} > {:.3g}·max|ref| + {:.3g}·|ref| = {:.3g}; "
             "max|ref| {:.4g}; max|diff|/max|ref| {:.3g})",
             what, i, got[i], ref[i], std::abs(got[i] - ref[i]), tol.abs, tol.rel,
             tol.abs * m.ref_max + tol.rel * std::abs(ref[i]), m.ref_max, m.max_rel_to_max);
}

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

/// A golden file (format "renaissance-golden", version 1; scripts/golden_pytorch.py documents its layout).
class GoldenFile {
 public:
  explicit GoldenFile(std::string path) : m_path(std::move(path)) {
    io::hdf5_init();
    io::H5Handle fapl(io::make_file_access_plist(), H5Pclose);
    m_file = io::H5Handle(H5_CHECK(H5Fopen(m_path.c_str(), H5F_ACC_RDONLY, fapl), m_path, "opening"), H5Fclose);
    RN_CHECK_CTX(text("format") == "renaissance-golden", m_path, "not a golden file (format '{}')", text("format"));
    RN_CHECK_CTX(number("version") == 1, m_path, "golden format version {} (this test reads 1)", number("version"));
  }

  const std::string& path() const { return m_path; }

  bool has(const std::string& object) const {
    // Each path component in turn (H5Lexists needs the parents to exist).
    std::size_t at = 0;
    while (at != std::string::npos) {
      at = object.find('/', at + 1);
      if (H5Lexists(m_file, object.substr(0, at).c_str(), H5P_DEFAULT) <= 0) return false;
    }
    return true;
  }

  bool has_attribute(const char* name) const { return H5Aexists(m_file, name) > 0; }

  std::string text(const char* name) const {
    const std::string ctx = fmt::format("{}: attribute {}", m_path, name);
    io::H5Handle a(H5_CHECK(H5Aopen(m_file, name, H5P_DEFAULT), ctx, "opening"), H5Aclose);
    io::H5Handle type(H5_CHECK(H5Aget_type(a), ctx, "type"), H5Tclose);
    RN_CHECK_CTX(H5Tget_class(type) == H5T_STRING, ctx, "not a string");
    if (H5Tis_variable_str(type) > 0) {
      char* s = nullptr;
      io::H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem, H5T_VARIABLE);
      H5Tset_cset(mem, H5Tget_cset(type));
      H5_CHECK(H5Aread(a, mem, &s), ctx, "reading");
      std::string out = s ? s : "";
      io::H5Handle space(H5Aget_space(a), H5Sclose);
      H5Dvlen_reclaim(mem, space, H5P_DEFAULT, &s);
      return out;
    }
    std::string out(H5Tget_size(type), '\0');
    H5_CHECK(H5Aread(a, type, out.data()), ctx, "reading");
    return out.substr(0, out.find('\0'));
  }

  double number(const char* name) const {
    const std::string ctx = fmt::format("{}: attribute {}", m_path, name);
    io::H5Handle a(H5_CHECK(H5Aopen(m_file, name, H5P_DEFAULT), ctx, "opening"), H5Aclose);
    double v = 0;
    H5_CHECK(H5Aread(a, H5T_NATIVE_DOUBLE, &v), ctx, "reading as a number");
    return v;
  }

  /// Every value of a dataset, in storage order, converted to double.
  std::vector<double> values(const std::string& name) const {
    const std::string ctx = fmt::format("{}: /{}", m_path, name);
    RN_CHECK_CTX(has(name), ctx, "missing (regenerate the goldens: tests/golden/README.md)");
    io::H5Handle ds(H5_CHECK(H5Dopen2(m_file, name.c_str(), H5P_DEFAULT), ctx, "opening"), H5Dclose);
    io::H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "dataspace"), H5Sclose);
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    std::vector<double> out(static_cast<std::size_t>(std::max<hssize_t>(n, 0)));
    H5_CHECK(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), ctx, "reading");
    return out;
  }

  /// The names in a group, sorted.
  std::vector<std::string> names(const std::string& group) const {
    const std::string ctx = fmt::format("{}: /{}", m_path, group);
    RN_CHECK_CTX(has(group), ctx, "missing");
    io::H5Handle g(H5_CHECK(H5Gopen2(m_file, group.c_str(), H5P_DEFAULT), ctx, "opening"), H5Gclose);
    H5G_info_t info;
    H5_CHECK(H5Gget_info(g, &info), ctx, "info");
    std::vector<std::string> out;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
      std::string s(static_cast<std::size_t>(std::max<ssize_t>(len, 0)) + 1, '\0');
      H5_CHECK(H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT), ctx,
               "name {}", i);
      s.resize(static_cast<std::size_t>(len));
      out.push_back(s);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string m_path;
  io::H5Handle m_file;
};

}  // namespace renaissance::golden
