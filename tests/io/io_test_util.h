// Helpers shared by the io tests: temp directories, small datasets with known contents, and ways to damage a
// file (raw HDF5 edits, byte flips, truncation) the way a bad disk or an interrupted copy would.
#pragma once

#include <renaissance/core/error.h>
#include <renaissance/io/dataset.h>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace renaissance::io::testing {

namespace fs = std::filesystem;

/// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    m_path = fs::temp_directory_path() / fmt::format("rn_io_{}_{}_{}", static_cast<long>(getpid()),
                                                     info ? info->test_suite_name() : "x", info ? info->name() : "y");
    fs::remove_all(m_path);
    fs::create_directories(m_path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(m_path, ec);
  }
  std::string file(const std::string& name) const { return (m_path / name).string(); }
  const fs::path& path() const { return m_path; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(m_path)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  fs::path m_path;
};

/// Pixel values that identify the sample, so any mix-up shows.
inline std::uint8_t pixel_of(Split s, std::int64_t i, std::int64_t p) {
  return static_cast<std::uint8_t>((i * 31 + p * 7 + (s == Split::val ? 101 : 0)) & 0xff);
}
inline std::int32_t label_of(Split s, std::int64_t i, int classes) {
  return static_cast<std::int32_t>((i * 7 + (s == Split::val ? 3 : 0)) % classes);
}

struct SmallSpec {
  std::int64_t n_train = 50, n_val = 13, h = 5, w = 4, c = 3;
  int classes = 10;
  DatasetWriterOptions options{7, 2};  // small chunks: several chunks even for tiny splits
};

/// Writes a dataset with pixel_of/label_of contents, appending in uneven pieces.
inline void write_small(const std::string& path, const SmallSpec& spec = {}) {
  DatasetWriter w(path, spec.h, spec.w, spec.c, spec.classes, spec.options);
  std::vector<std::string> names;
  for (int k = 0; k < spec.classes; ++k) names.push_back(fmt::format("class {}", k));
  w.set_class_names(names);
  const std::int64_t sb = spec.h * spec.w * spec.c;
  for (Split s : kAllSplits) {
    const std::int64_t n = s == Split::train ? spec.n_train : spec.n_val;
    std::int64_t start = 0, piece = 1;
    while (start < n) {
      const std::int64_t count = std::min(piece, n - start);
      std::vector<std::uint8_t> img(static_cast<size_t>(count * sb));
      std::vector<std::int32_t> lab(static_cast<size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) {
        for (std::int64_t p = 0; p < sb; ++p) img[i * sb + p] = pixel_of(s, start + i, p);
        lab[i] = label_of(s, start + i, spec.classes);
      }
      w.append(s, img.data(), lab.data(), count);
      start += count;
      piece = piece * 2 + 1;
    }
  }
  w.finish();
}

/// Runs `fn`, expects a renaissance::Error, returns its message.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected renaissance::Error, got std::exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected renaissance::Error, nothing was thrown";
  return {};
}

// ---- raw HDF5 edits (the library refuses to write such files, so tests make them by hand) ------------------------

inline hid_t open_rw(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(f, 0) << path;
  return f;
}

inline void set_int_attr(const std::string& path, const char* name, int value) {
  const hid_t f = open_rw(path);
  if (H5Aexists(f, name) > 0) H5Adelete(f, name);
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(f, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT, &value), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Fclose(f);
}

/// A fixed-length string, as h5py writes numpy bytes: the reader accepts both string kinds.
inline void set_string_attr(const std::string& path, const char* name, const std::string& value) {
  const hid_t f = open_rw(path);
  if (H5Aexists(f, name) > 0) H5Adelete(f, name);
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, value.size() + 1);
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Awrite(a, t, value.c_str()), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  H5Fclose(f);
}

inline void delete_attr(const std::string& path, const char* name) {
  const hid_t f = open_rw(path);
  EXPECT_GE(H5Adelete(f, name), 0) << name;
  H5Fclose(f);
}

inline void delete_link(const std::string& path, const char* link) {
  const hid_t f = open_rw(path);
  EXPECT_GE(H5Ldelete(f, link, H5P_DEFAULT), 0) << link;
  H5Fclose(f);
}

/// Replaces /split/name with a contiguous dataset of the given type and dims.
inline void replace_dataset(const std::string& path, const std::string& link, hid_t type, std::vector<hsize_t> dims) {
  const hid_t f = open_rw(path);
  EXPECT_GE(H5Ldelete(f, link.c_str(), H5P_DEFAULT), 0) << link;
  const hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t d = H5Dcreate2(f, link.c_str(), type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(d, 0) << link;
  H5Dclose(d);
  H5Sclose(sp);
  H5Fclose(f);
}

/// After editing a format-2 checkpoint or weights file with HDF5 (an attribute changed, a link deleted): recomputes
/// its checksum header (hdf5_util.h documents it) the way a writer would, so the reader's checks behind the header
/// see the edit. Written from the documented layout with zlib, not with the library's code. No-op without a header.
inline void reseal_checksum_header(const std::string& path) {
  std::vector<std::uint8_t> b;
  {
    std::ifstream f(path, std::ios::binary);
    b.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  if (b.size() < 40 || std::string(b.begin(), b.begin() + 8) != std::string("RNSUMS1\n", 8)) return;
  auto get = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(b[at + i]) << (8 * i);
    return v;
  };
  auto put = [&](std::size_t at, int n, std::uint64_t v) {
    for (int i = 0; i < n; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
  };
  auto crc = [&](std::size_t at, std::size_t n) {
    return static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0), b.data() + at, static_cast<uInt>(n)));
  };
  const std::size_t header = get(8, 4), table = get(28, 4);
  std::size_t at = 40;
  for (std::uint64_t i = 0, n = get(12, 4); i < n; ++i) {
    const std::uint64_t off = get(at, 8), len = get(at + 8, 8);
    if (off + len <= b.size()) put(at + 16, 4, crc(off, len));
    at += 22 + get(at + 20, 2);
  }
  put(16, 8, b.size());
  put(24, 4, crc(header, b.size() - header));
  put(32, 4, crc(40, table));
  put(36, 4, crc(0, 36));
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()),
                                                                static_cast<std::streamsize>(b.size()));
}

/// File offset and size of chunk `index` of a chunked dataset.
inline std::pair<haddr_t, hsize_t> chunk_location(const std::string& path, const std::string& link, hsize_t index) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, link.c_str(), H5P_DEFAULT);
  const hid_t sp = H5Dget_space(d);
  hsize_t offset[4] = {0};
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  EXPECT_GE(H5Dget_chunk_info(d, sp, index, offset, &mask, &addr, &size), 0);
  H5Sclose(sp);
  H5Dclose(d);
  H5Fclose(f);
  return {addr, size};
}

inline void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

/// Flips one byte in the middle of chunk `index` of `link` (e.g. "/train/images").
inline void corrupt_chunk(const std::string& path, const std::string& link, hsize_t index) {
  const auto [addr, size] = chunk_location(path, link, index);
  ASSERT_GT(size, 0u);
  flip_byte(path, addr + size / 2);
}

inline void truncate_file(const std::string& path, double keep_fraction) {
  const auto size = fs::file_size(path);
  fs::resize_file(path, static_cast<std::uintmax_t>(size * keep_fraction));
}

// ---- idx files ---------------------------------------------------------------------------------------------------

inline void put_be32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}

inline std::vector<std::uint8_t> idx_images_bytes(std::uint32_t n, std::uint32_t rows, std::uint32_t cols,
                                                  std::uint32_t seed) {
  std::vector<std::uint8_t> b;
  put_be32(b, 2051);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (std::uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(static_cast<std::uint8_t>(i * 13 + seed));
  return b;
}

inline std::vector<std::uint8_t> idx_labels_bytes(std::uint32_t n, std::uint32_t classes, std::uint32_t seed) {
  std::vector<std::uint8_t> b;
  put_be32(b, 2049);
  put_be32(b, n);
  for (std::uint32_t i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>((i * 3 + seed) % classes));
  return b;
}

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& b, bool gzip) {
  if (gzip) {
    gzFile g = gzopen(path.c_str(), "wb");
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(gzwrite(g, b.data(), static_cast<unsigned>(b.size())), static_cast<int>(b.size()));
    gzclose(g);
  } else {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
}

}  // namespace renaissance::io::testing
