// Two passes each way (statistics, then the elementwise map). Per-channel sums use the deterministic
// block scheme of reduce.h: fixed row blocks summed in float, blocks combined in order in double.
#include <kernels/cpu/batchnorm.h>

#include <kernels/cpu/reduce.h>
#include <kernels/cpu/thread_pool.h>
#include <kernels/cpu/vectorize.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace renaissance::cpu {

namespace {

using detail::kReduceRowBlock;

// Two per-channel sums in one pass over fixed row blocks: s1 = Σ f1(x, dy), s2 = Σ f2(x, dy).
template <class F>
void block_sums2(std::int64_t rows, std::int64_t c, F&& accumulate_row, std::vector<double>& s1,
                 std::vector<double>& s2) {
  const std::int64_t blocks = (rows + kReduceRowBlock - 1) / kReduceRowBlock;
  std::vector<float> part(static_cast<std::size_t>(blocks * 2 * c), 0.0f);
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      float* p1 = part.data() + b * 2 * c;
      const std::int64_t r1 = std::min(rows, (b + 1) * kReduceRowBlock);
      for (std::int64_t r = b * kReduceRowBlock; r < r1; ++r) accumulate_row(r, p1, p1 + c);
    }
  });
  s1.assign(static_cast<std::size_t>(c), 0.0);
  s2.assign(static_cast<std::size_t>(c), 0.0);
  for (std::int64_t b = 0; b < blocks; ++b)
    for (std::int64_t j = 0; j < c; ++j) {
      s1[j] += part[b * 2 * c + j];
      s2[j] += part[b * 2 * c + c + j];
    }
}

void check_shape(const Shape& s, const char* what) {
  RN_CHECK(s.valid(), "{}: shape {} is empty", what, s.str());
}

}  // namespace

void batchnorm_forward_train(const float* x, const Shape& s, const float* gamma, const float* beta, float* y,
                             float* save_mean, float* save_invstd, float* running_mean, float* running_var,
                             float momentum, float eps) {
  check_shape(s, "batchnorm_forward_train");
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  RN_CHECK(rows > 1, "batchnorm_forward_train: {} has one value per channel; batch statistics need more", s.str());
  // Sums of (x − x[0]) and its square: shifting by a sample of the channel keeps the one-pass variance
  // free of cancellation when |mean| ≫ std.
  const float* shift = x;
  std::vector<double> s1, s2;
  block_sums2(
      rows, c,
      [&](std::int64_t r, float* a1, float* a2) {
        const float* xr = x + r * c;
        for (std::int64_t j = 0; j < c; ++j) {
          const float d = xr[j] - shift[j];
          a1[j] += d;
          a2[j] += d * d;
        }
      },
      s1, s2);
  std::vector<float> mean(static_cast<std::size_t>(c)), invstd(static_cast<std::size_t>(c));
  const double inv_rows = 1.0 / static_cast<double>(rows);
  for (std::int64_t j = 0; j < c; ++j) {
    const double dm = s1[j] * inv_rows;
    const double var = std::max(0.0, s2[j] * inv_rows - dm * dm);
    mean[j] = static_cast<float>(shift[j] + dm);
    invstd[j] = static_cast<float>(1.0 / std::sqrt(var + eps));
    save_mean[j] = mean[j];
    save_invstd[j] = invstd[j];
    if (running_mean) running_mean[j] = (1.0f - momentum) * running_mean[j] + momentum * mean[j];
    if (running_var) {
      const auto unbiased = static_cast<float>(var * static_cast<double>(rows) / static_cast<double>(rows - 1));
      running_var[j] = (1.0f - momentum) * running_var[j] + momentum * unbiased;
    }
  }
  std::vector<float> scale(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) scale[j] = invstd[j] * gamma[j];
  parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      RN_IVDEP for (std::int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mean[j]) * scale[j] + beta[j];
    }
  });
}

void batchnorm_forward_inference(const float* x, const Shape& s, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y, float eps) {
  check_shape(s, "batchnorm_forward_inference");
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  std::vector<float> scale(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j)
    scale[j] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[j]) + eps)) * gamma[j];
  parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      RN_IVDEP for (std::int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - running_mean[j]) * scale[j] + beta[j];
    }
  });
}

void batchnorm_backward(const float* x, const float* dy, const Shape& s, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, bool accumulate_dx,
                        bool accumulate_params) {
  check_shape(s, "batchnorm_backward");
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  const float* mean = save_mean;
  std::vector<double> sdy, sdyx;  // Σ dy, Σ dy·(x − mean)
  block_sums2(
      rows, c,
      [&](std::int64_t r, float* a1, float* a2) {
        const float* xr = x + r * c;
        const float* gr = dy + r * c;
        for (std::int64_t j = 0; j < c; ++j) {
          a1[j] += gr[j];
          a2[j] += gr[j] * (xr[j] - mean[j]);
        }
      },
      sdy, sdyx);
  std::vector<float> k1(static_cast<std::size_t>(c)), mdy(static_cast<std::size_t>(c)), k2(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) {
    const double inv = save_invstd[j];
    const double dg = sdyx[j] * inv;  // Σ dy·x̂
    if (dbeta) dbeta[j] = static_cast<float>(accumulate_params ? dbeta[j] + sdy[j] : sdy[j]);
    if (dgamma) dgamma[j] = static_cast<float>(accumulate_params ? dgamma[j] + dg : dg);
    k1[j] = static_cast<float>(gamma[j] * inv);
    mdy[j] = static_cast<float>(sdy[j] / static_cast<double>(rows));
    k2[j] = static_cast<float>(dg * inv / static_cast<double>(rows));  // multiplies (x − mean)
  }
  if (!dx) return;
  parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      const float* gr = dy + r * c;
      float* dr = dx + r * c;
      RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
        const float v = k1[j] * (gr[j] - mdy[j] - (xr[j] - mean[j]) * k2[j]);
        dr[j] = accumulate_dx ? dr[j] + v : v;
      }
    }
  });
}

}  // namespace renaissance::cpu
