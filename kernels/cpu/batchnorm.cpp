// Two passes each way (statistics, then the elementwise map). Per-channel sums use the deterministic
// block scheme of reduce.h: fixed row blocks summed in float, blocks combined in order in double.
#include <kernels/cpu/batchnorm.h>

#include <kernels/cpu/half.h>
#include <kernels/cpu/reduce.h>
#include <kernels/cpu/thread_pool.h>
#include <kernels/cpu/vectorize.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <cmath>
#include <vector>

// Compiled once per instruction-set level (isa.h): everything below is in namespace RN_ISA_NS.
#include <kernels/cpu/isa_target.h>

namespace renaissance::cpu::RN_ISA_NS {

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

void batchnorm_train_statistics(const float* x, const Shape& s, float* save_mean, float* save_invstd,
                                float* running_mean, float* running_var, float momentum, float eps) {
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
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
          const float d = xr[j] - shift[j];
          a1[j] += d;
          a2[j] += d * d;
        }
      },
      s1, s2);
  const double inv_rows = 1.0 / static_cast<double>(rows);
  for (std::int64_t j = 0; j < c; ++j) {
    const double dm = s1[j] * inv_rows;
    const double var = std::max(0.0, s2[j] * inv_rows - dm * dm);
    const auto mean = static_cast<float>(shift[j] + dm);
    const auto invstd = static_cast<float>(1.0 / std::sqrt(var + eps));
    save_mean[j] = mean;
    save_invstd[j] = invstd;
    if (running_mean) running_mean[j] = (1.0f - momentum) * running_mean[j] + momentum * mean;
    if (running_var) {
      const auto unbiased = static_cast<float>(var * static_cast<double>(rows) / static_cast<double>(rows - 1));
      running_var[j] = (1.0f - momentum) * running_var[j] + momentum * unbiased;
    }
  }
}

void batchnorm_forward_train(const float* x, const Shape& s, const float* gamma, const float* beta, float* y,
                             float* save_mean, float* save_invstd, float* running_mean, float* running_var,
                             float momentum, float eps) {
  batchnorm_train_statistics(x, s, save_mean, save_invstd, running_mean, running_var, momentum, eps);
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  std::vector<float> mean(save_mean, save_mean + c), scale(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) scale[j] = save_invstd[j] * gamma[j];
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
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
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
      if (accumulate_dx) {
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) dr[j] += k1[j] * (gr[j] - mdy[j] - (xr[j] - mean[j]) * k2[j]);
      } else {
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) dr[j] = k1[j] * (gr[j] - mdy[j] - (xr[j] - mean[j]) * k2[j]);
      }
    }
  });
}

namespace {

/// Rounds to binary16 and back (the value an FP16 store keeps). F16C where the CPU has it would give the same bits
/// for every non-signalling value; the software conversion keeps this file free of ISA flags.
inline float to_half_value(float v) { return half_to_float(float_to_half(v)); }

/// The per-channel scale and shift of one BN in a fused pass: y = (x − mean)·scale + β as the plain forward has it.
struct ChannelAffine {
  std::vector<float> mean, scale, beta;
  ChannelAffine(const BnApply& a, std::int64_t c) : mean(a.mean, a.mean + c), scale(c), beta(a.beta, a.beta + c) {
    for (std::int64_t j = 0; j < c; ++j)
      scale[j] = a.running_var
                     ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.running_var[j]) + a.eps)) * a.gamma[j]
                     : a.invstd[j] * a.gamma[j];
  }
};

}  // namespace

void batchnorm_apply_fused(const BnApply& a, const Shape& s, BnShortcut kind, const float* shortcut,
                           const BnApply* b, bool relu, bool round_f16, float* y) {
  check_shape(s, "batchnorm_apply_fused");
  RN_CHECK(kind != BnShortcut::kTensor || shortcut, "batchnorm_apply_fused: a tensor shortcut without its tensor");
  RN_CHECK(kind != BnShortcut::kBatchNorm || b, "batchnorm_apply_fused: a BN shortcut without its BN");
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  const ChannelAffine fa(a, c);
  const ChannelAffine fb = kind == BnShortcut::kBatchNorm ? ChannelAffine(*b, c) : ChannelAffine(a, 0);
  const float* xa = a.x;
  const float* xb = kind == BnShortcut::kBatchNorm ? b->x : shortcut;
  const float *ma = fa.mean.data(), *sa = fa.scale.data(), *ba = fa.beta.data();
  const float *mb = fb.mean.data(), *sb = fb.scale.data(), *bb = fb.beta.data();
  // One loop per combination, so each inner loop is branch-free and vectorises (relu as the plain kernel's select).
  parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* x1 = xa + r * c;
      const float* x2 = xb ? xb + r * c : nullptr;
      float* yr = y + r * c;
      if (round_f16) {  // AMP on the CPU: scalar, rounding where the FP16 parts store
        for (std::int64_t j = 0; j < c; ++j) {
          float v = to_half_value((x1[j] - ma[j]) * sa[j] + ba[j]);
          if (kind == BnShortcut::kTensor) v = to_half_value(v + x2[j]);
          if (kind == BnShortcut::kBatchNorm) v = to_half_value(v + to_half_value((x2[j] - mb[j]) * sb[j] + bb[j]));
          yr[j] = relu ? (v > 0.0f ? v : 0.0f) : v;
        }
        continue;
      }
      switch (kind) {
        case BnShortcut::kNone:
          if (relu) {
            RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
              const float v = (x1[j] - ma[j]) * sa[j] + ba[j];
              yr[j] = v > 0.0f ? v : 0.0f;
            }
          } else {
            RN_IVDEP for (std::int64_t j = 0; j < c; ++j) yr[j] = (x1[j] - ma[j]) * sa[j] + ba[j];
          }
          break;
        case BnShortcut::kTensor:
          if (relu) {
            RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
              const float v = ((x1[j] - ma[j]) * sa[j] + ba[j]) + x2[j];
              yr[j] = v > 0.0f ? v : 0.0f;
            }
          } else {
            RN_IVDEP for (std::int64_t j = 0; j < c; ++j) yr[j] = ((x1[j] - ma[j]) * sa[j] + ba[j]) + x2[j];
          }
          break;
        case BnShortcut::kBatchNorm:
          if (relu) {
            RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
              const float v = ((x1[j] - ma[j]) * sa[j] + ba[j]) + ((x2[j] - mb[j]) * sb[j] + bb[j]);
              yr[j] = v > 0.0f ? v : 0.0f;
            }
          } else {
            RN_IVDEP for (std::int64_t j = 0; j < c; ++j)
              yr[j] = ((x1[j] - ma[j]) * sa[j] + ba[j]) + ((x2[j] - mb[j]) * sb[j] + bb[j]);
          }
          break;
      }
    }
  });
}

void batchnorm_relu_backward(const float* x, const float* dy, const Shape& s, const float* gamma, const float* beta,
                             const float* save_mean, const float* save_invstd, bool round_f16, float* dx,
                             float* dgamma, float* dbeta, bool accumulate_dx, bool accumulate_params) {
  check_shape(s, "batchnorm_relu_backward");
  const std::int64_t rows = s.n * s.h * s.w, c = s.c;
  const float* mean = save_mean;
  // The forward's own normalisation (batchnorm_forward_train: scale = invstd·γ) decides the ReLU's mask.
  std::vector<float> fscale(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) fscale[j] = save_invstd[j] * gamma[j];
  const float* sc = fscale.data();
  // The ReLU gradient of one row into g (what relu_backward would have stored; dy loaded unconditionally), for the
  // binary16 path; the FP32 loops below form it inline.
  auto masked_f16 = [&](std::int64_t r, float* g) {
    const float* xr = x + r * c;
    const float* gr = dy + r * c;
    for (std::int64_t j = 0; j < c; ++j) g[j] = to_half_value((xr[j] - mean[j]) * sc[j] + beta[j]) > 0.0f ? gr[j] : 0.0f;
  };
  const float* be = beta;
  std::vector<double> sdy, sdyx;  // Σ g, Σ g·(x − mean): batchnorm_backward's sums, over g
  {
    const std::int64_t blocks = (rows + kReduceRowBlock - 1) / kReduceRowBlock;
    std::vector<float> part(static_cast<std::size_t>(blocks * 2 * c), 0.0f);
    parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
      std::vector<float> g(static_cast<std::size_t>(c));
      for (std::int64_t b = b0; b < b1; ++b) {
        float* a1 = part.data() + b * 2 * c;
        float* a2 = a1 + c;
        const std::int64_t r1 = std::min(rows, (b + 1) * kReduceRowBlock);
        for (std::int64_t r = b * kReduceRowBlock; r < r1; ++r) {
          const float* xr = x + r * c;
          if (round_f16) {
            masked_f16(r, g.data());
            for (std::int64_t j = 0; j < c; ++j) {
              a1[j] += g[j];
              a2[j] += g[j] * (xr[j] - mean[j]);
            }
            continue;
          }
          const float* gr = dy + r * c;
          RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
            const float xm = xr[j] - mean[j];
            const float d = gr[j];
            const float gj = xm * sc[j] + be[j] > 0.0f ? d : 0.0f;
            a1[j] += gj;
            a2[j] += gj * xm;
          }
        }
      }
    });
    sdy.assign(static_cast<std::size_t>(c), 0.0);
    sdyx.assign(static_cast<std::size_t>(c), 0.0);
    for (std::int64_t b = 0; b < blocks; ++b)
      for (std::int64_t j = 0; j < c; ++j) {
        sdy[j] += part[b * 2 * c + j];
        sdyx[j] += part[b * 2 * c + c + j];
      }
  }
  std::vector<float> k1(static_cast<std::size_t>(c)), mdy(static_cast<std::size_t>(c)), k2(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) {
    const double inv = save_invstd[j];
    const double dg = sdyx[j] * inv;
    if (dbeta) dbeta[j] = static_cast<float>(accumulate_params ? dbeta[j] + sdy[j] : sdy[j]);
    if (dgamma) dgamma[j] = static_cast<float>(accumulate_params ? dgamma[j] + dg : dg);
    k1[j] = static_cast<float>(gamma[j] * inv);
    mdy[j] = static_cast<float>(sdy[j] / static_cast<double>(rows));
    k2[j] = static_cast<float>(dg * inv / static_cast<double>(rows));
  }
  if (!dx) return;
  parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> g(static_cast<std::size_t>(c));
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      const float* gr = dy + r * c;
      float* dr = dx + r * c;
      if (round_f16) {
        masked_f16(r, g.data());
        for (std::int64_t j = 0; j < c; ++j) {
          const float v = k1[j] * (g[j] - mdy[j] - (xr[j] - mean[j]) * k2[j]);
          dr[j] = accumulate_dx ? dr[j] + v : v;
        }
        continue;
      }
      if (accumulate_dx) {
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
          const float xm = xr[j] - mean[j];
          const float d = gr[j];
          const float gj = xm * sc[j] + be[j] > 0.0f ? d : 0.0f;
          dr[j] += k1[j] * (gj - mdy[j] - xm * k2[j]);
        }
      } else {
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
          const float xm = xr[j] - mean[j];
          const float d = gr[j];
          const float gj = xm * sc[j] + be[j] > 0.0f ? d : 0.0f;
          dr[j] = k1[j] * (gj - mdy[j] - xm * k2[j]);
        }
      }
    }
  });
}

}  // namespace renaissance::cpu::RN_ISA_NS
