// Shared pieces of the CPU kernel tests: random data, double-precision reference forwards, tolerance
// checks (STYLE habit 6) and central-difference gradient checks in double (STYLE habit 5).
#pragma once

#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/pooling.h>
#include <renaissance/core/shape.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace renaissance::cpu::test {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

inline Vec random_vec(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Vec v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

inline DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }

/// The Winograd setting (set_conv2d_winograd) for a scope: tests of the direct kernels' layouts and tolerances pin
/// it off, whatever RENAISSANCE_CPU_WINOGRAD says.
class WinogradSetting {
 public:
  explicit WinogradSetting(bool on) : m_was(conv2d_winograd()) { set_conv2d_winograd(on); }
  ~WinogradSetting() { set_conv2d_winograd(m_was); }
  WinogradSetting(const WinogradSetting&) = delete;
  WinogradSetting& operator=(const WinogradSetting&) = delete;

 private:
  bool m_was;
};

inline Vec to_float(const DVec& v) {
  Vec f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

/// FP32 result against a double reference: |got − ref| ≤ tol·(1 + |ref|) everywhere; NaN never passes.
inline void expect_close(const Vec& got, const DVec& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref[i]) / (1.0 + std::abs(ref[i]));
    if (!(err <= worst)) {  // NaN lands here and stays the worst
      worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": element " << worst_i << " got " << got[worst_i] << " want " << ref[worst_i];
}

inline void expect_bits_equal(const Vec& a, const Vec& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    ASSERT_EQ(ua, ub) << what << ": element " << i << " differs: " << a[i] << " vs " << b[i];
  }
}

inline double dot(const DVec& a, const DVec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Central differences of a double-valued loss at x, step h·max(1, |x_i|).
inline DVec numeric_grad(const std::function<double(const DVec&)>& loss, DVec x, double h = 1e-5) {
  DVec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i], step = h * std::max(1.0, std::abs(x0));
    x[i] = x0 + step;
    const double up = loss(x);
    x[i] = x0 - step;
    const double down = loss(x);
    x[i] = x0;
    g[i] = (up - down) / (2.0 * step);
  }
  return g;
}

/// Analytic (FP32 kernel) against numeric gradient: |a − n| ≤ tol·max(|n|, 1); `skip(i)` marks
/// non-smooth points (ReLU kinks, max-pool near-ties).
inline void expect_grad(const Vec& analytic, const DVec& numeric, double tol, const std::string& what,
                        const std::function<bool(std::size_t)>& skip = {}) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  std::size_t checked = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    if (skip && skip(i)) continue;
    ++checked;
    const double bound = tol * std::max(std::abs(numeric[i]), 1.0);
    ASSERT_LE(std::abs(analytic[i] - numeric[i]), bound)
        << what << ": element " << i << " analytic " << analytic[i] << " numeric " << numeric[i];
  }
  EXPECT_GT(checked, analytic.size() / 2) << what << ": too many points skipped";
}

// ---- double-precision reference forwards (straight from the definitions) ----------------------------------

inline DVec conv_ref(const DVec& x, const Shape& xs, const DVec& w, const DVec* b, const Shape& ys,
                     const Conv2dParams& p) {
  const std::int64_t cg = xs.c / p.groups, og = ys.c / p.groups;
  DVec y(static_cast<std::size_t>(ys.elems()));
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t oy = 0; oy < ys.h; ++oy)
      for (std::int64_t ox = 0; ox < ys.w; ++ox)
        for (std::int64_t o = 0; o < ys.c; ++o) {
          const std::int64_t g = o / og;
          double s = b ? (*b)[o] : 0.0;
          for (std::int64_t ky = 0; ky < p.kernel_h; ++ky)
            for (std::int64_t kx = 0; kx < p.kernel_w; ++kx) {
              const std::int64_t iy = oy * p.stride_h - p.pad_h + ky, ix = ox * p.stride_w - p.pad_w + kx;
              if (iy < 0 || iy >= xs.h || ix < 0 || ix >= xs.w) continue;
              for (std::int64_t i = 0; i < cg; ++i)
                s += x[((n * xs.h + iy) * xs.w + ix) * xs.c + g * cg + i] *
                     w[((o * p.kernel_h + ky) * p.kernel_w + kx) * cg + i];
            }
          y[((n * ys.h + oy) * ys.w + ox) * ys.c + o] = s;
        }
  return y;
}

/// Adjoints of conv_ref (for shapes too large for finite differences): dx and dw from dy.
inline void conv_backward_ref(const DVec& x, const Shape& xs, const DVec& w, const DVec& dy, const Shape& ys,
                              const Conv2dParams& p, DVec& dx, DVec& dw, DVec& db) {
  const std::int64_t cg = xs.c / p.groups, og = ys.c / p.groups;
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  db.assign(static_cast<std::size_t>(ys.c), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t oy = 0; oy < ys.h; ++oy)
      for (std::int64_t ox = 0; ox < ys.w; ++ox)
        for (std::int64_t o = 0; o < ys.c; ++o) {
          const double g = dy[((n * ys.h + oy) * ys.w + ox) * ys.c + o];
          db[o] += g;
          for (std::int64_t ky = 0; ky < p.kernel_h; ++ky)
            for (std::int64_t kx = 0; kx < p.kernel_w; ++kx) {
              const std::int64_t iy = oy * p.stride_h - p.pad_h + ky, ix = ox * p.stride_w - p.pad_w + kx;
              if (iy < 0 || iy >= xs.h || ix < 0 || ix >= xs.w) continue;
              for (std::int64_t i = 0; i < cg; ++i) {
                const std::size_t xi = ((n * xs.h + iy) * xs.w + ix) * xs.c + (o / og) * cg + i;
                const std::size_t wi = ((o * p.kernel_h + ky) * p.kernel_w + kx) * cg + i;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
            }
        }
}

/// Training batch norm: y and the batch mean / biased variance.
inline DVec bn_train_ref(const DVec& x, const Shape& s, const DVec& gamma, const DVec& beta, double eps,
                         DVec* mean_out = nullptr, DVec* var_out = nullptr) {
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  DVec mean(c, 0.0), var(c, 0.0), y(x.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j) mean[j] += x[r * c + j];
  for (auto& m : mean) m /= static_cast<double>(rows);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j) var[j] += (x[r * c + j] - mean[j]) * (x[r * c + j] - mean[j]);
  for (auto& v : var) v /= static_cast<double>(rows);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j)
      y[r * c + j] = (x[r * c + j] - mean[j]) / std::sqrt(var[j] + eps) * gamma[j] + beta[j];
  if (mean_out) *mean_out = mean;
  if (var_out) *var_out = var;
  return y;
}

inline DVec maxpool_ref(const DVec& x, const Shape& xs, const Shape& ys, const Pool2dParams& p) {
  DVec y(static_cast<std::size_t>(ys.elems()), -std::numeric_limits<double>::infinity());
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t oy = 0; oy < ys.h; ++oy)
      for (std::int64_t ox = 0; ox < ys.w; ++ox)
        for (std::int64_t c = 0; c < ys.c; ++c) {
          double& m = y[((n * ys.h + oy) * ys.w + ox) * ys.c + c];
          for (std::int64_t ky = 0; ky < p.kernel_h; ++ky)
            for (std::int64_t kx = 0; kx < p.kernel_w; ++kx) {
              const std::int64_t iy = oy * p.stride_h - p.pad_h + ky, ix = ox * p.stride_w - p.pad_w + kx;
              if (iy < 0 || iy >= xs.h || ix < 0 || ix >= xs.w) continue;
              m = std::max(m, x[((n * xs.h + iy) * xs.w + ix) * xs.c + c]);
            }
        }
  return y;
}

/// Mean over the batch of the label-smoothed cross-entropy of softmax(logits).
inline double ce_ref(const DVec& z, const std::vector<std::int32_t>& labels, std::int64_t classes, double eps) {
  const std::int64_t batch = static_cast<std::int64_t>(labels.size());
  double total = 0.0;
  for (std::int64_t i = 0; i < batch; ++i) {
    double mx = z[i * classes];
    for (std::int64_t k = 1; k < classes; ++k) mx = std::max(mx, z[i * classes + k]);
    double s = 0.0;
    for (std::int64_t k = 0; k < classes; ++k) s += std::exp(z[i * classes + k] - mx);
    const double lse = mx + std::log(s);
    double smooth = 0.0;
    for (std::int64_t k = 0; k < classes; ++k) smooth += lse - z[i * classes + k];
    total += (1.0 - eps) * (lse - z[i * classes + labels[i]]) + eps * smooth / static_cast<double>(classes);
  }
  return total / static_cast<double>(batch);
}

}  // namespace renaissance::cpu::test
