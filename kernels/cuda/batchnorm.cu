// Batch normalisation: three kernels per direction.
//   partials  (one memory pass over x [and dy]): a (channel tile × row block) grid; each thread owns V consecutive
//             channels and walks its block's rows with a stride of ty rows, kUnroll loads in flight, FP32 sums;
//             a fixed tree over the block's rows gives one FP32 partial per (row block, channel) in the workspace.
//   finalize  (reads the partials only): per channel, the row-block partials in FP64 (128 fixed slices, then a fixed
//             tree), then the statistics (forward) or dγ, dβ and the dx coefficients (backward).
//   apply     (one pass reading x [and dy], writing y or dx): same tiling; each thread loads its channels'
//             coefficients once into registers.
// The blocking depends only on (rows, c_stride, vector width), so results are bit-reproducible on any device.
// Formulas and their evaluation order follow kernels/cpu/batchnorm.cpp (this file is built with -fmad=false).
#include <kernels/cuda/batchnorm.h>

#include <kernels/cuda/elementwise.h>
#include <kernels/cuda/pointwise_common.cuh>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace renaissance::cuda {

namespace {

using detail::kThreads;
using detail::load_packed;
using detail::load_vec;
using detail::Packed;
using detail::store_vec;
using detail::unpack;

// Channel tiles × row blocks aimed at: ~2 blocks on each of 132 SMs. Fewer, longer row blocks mean fewer partials
// to write and combine (the finalize's time grows with them): on one H100 (docs/benchmarks.md, 2026-12-06, with the
// 8-channel finalize below) resnet18_cifar b512 AMP ran at 75,849 img/s aiming at 1,024 blocks, 77,969 at 512,
// 78,827-78,865 at 256, 75,280 at 128 (71,348 at 2,048); ResNet-50 b256 at 6,399 / 6,440 / 6,467-6,475 / 6,145.
constexpr int kTargetBlocks = 256;
constexpr int kUnroll = 4;  // rows loaded before the first use
// The finalize combine: a block of kFinalizeChannels channels × kSlices FP64 slices (1,024 threads); slice k walks
// row blocks k, k + kSlices, ... one dependent load after another, so the slices, not the bandwidth, set its time.
// 8 slices of 32 channels (the first version) → 32 slices of 32 channels (2026-12-05: resnet18_cifar +3.2 %) →
// 128 slices of 8 channels (2026-12-06, one H100: resnet18_cifar 75,112 → 75,713 img/s, 16 channels 75,622; ResNet-50
// 6,377 → 6,397 with 16).
constexpr int kFinalizeChannels = 8;
constexpr int kFinalizeThreads = 1024;
constexpr int kSlices = kFinalizeThreads / kFinalizeChannels;

struct Tiling {
  int vec = 1;
  int tx = 1;      // threads across a row (power of two ≤ 32), each owning `vec` channels
  int ty = 1;      // rows a block covers per step (kThreads / tx)
  int tiles = 1;   // channel tiles (grid.x)
  std::int64_t rows_per_block = 1;
  std::int64_t row_blocks = 1;  // grid.y
};

Tiling make_tiling(std::int64_t rows, std::int64_t c_stride, int vec) {
  Tiling t;
  t.vec = vec;
  const std::int64_t nv = c_stride / vec;
  t.tx = detail::next_pow2(nv, 32);
  t.ty = kThreads / t.tx;
  t.tiles = static_cast<int>((nv + t.tx - 1) / t.tx);
  const std::int64_t want = std::max<std::int64_t>(1, kTargetBlocks / t.tiles);
  std::int64_t rpb = (rows + want - 1) / want;
  rpb = (rpb + t.ty - 1) / t.ty * t.ty;
  t.rows_per_block = rpb;
  t.row_blocks = (rows + rpb - 1) / rpb;
  return t;
}

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

std::size_t partial_bytes(const Tiling& t, std::int64_t c_stride) {
  return align256(static_cast<std::size_t>(t.row_blocks * 2 * c_stride) * sizeof(float));
}

// ---- partials -------------------------------------------------------------------------------------------

/// The ReLU mask of a fused BN → ReLU backward, recomputed from x exactly as the forward apply computed its output:
/// the forward stored relu(round(o)) with o = (x − mean)·(invstd·γ) + β, so round(o) > 0 is the mask the stored output
/// gives (the ReLU output is never read).
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return detail::to_float(detail::from_float<T>(v));
}

/// The residual sum's ReLU backward formed inside a BN backward's statistics pass (plan ADD_RELU_BN_BWD): the pass
/// reads y (the block's ReLU output), dy and the addend a, stores g = relu'(y)·round(dy + a) (elementwise.cu's
/// relu_backward_sum, bit for bit) and uses g as the BN's gradient.
/// With `bits` (plan_relu_masks; V = 8 only), relu'(y) is bit j of byte bits[row·cs/8 + c0/8] instead of y > 0.
/// With `x2` (plan ADD_RELU_BN_BN_BWD), the pass also sums g·(x2 − mean2) for the projection shortcut's BN, whose
/// partials (Σg again, then that sum) go to partials2 in the layout of `partials`.
template <typename T>
struct SumRelu {
  const T* y = nullptr;
  const T* a = nullptr;
  T* g = nullptr;
  const std::uint8_t* bits = nullptr;
  const T* x2 = nullptr;
  const float* mean2 = nullptr;
  float* partials2 = nullptr;
};

/// Forward: s1 = Σ (x − x[row 0]), s2 = Σ (x − x[row 0])². Backward: s1 = Σ dy, s2 = Σ dy·(x − mean), with dy masked
/// by the recomputed ReLU mask when kMask, or dy the residual sum's ReLU gradient formed (and stored) here when kSum.
/// partials[(block_y·2 + k)·cs + c] = s_k over the block's rows.
template <typename T, int V, bool kBwd, bool kMask = false, bool kGivenRef = false, bool kSum = false,
          bool kSumBits = false, bool kSecond = false>
__global__ void __launch_bounds__(kThreads)
    bn_partials_kernel(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ mean,
                       std::int64_t rows, int cs, int c, int tx_n, std::int64_t rows_per_block,
                       float* __restrict__ partials, ReluMask mask = {}, SumRelu<T> sum = {}) {
  constexpr int kSums = kSecond ? 3 : 2;
  __shared__ float red[kSums][V][kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % tx_n, ty = tid / tx_n, ty_n = kThreads / tx_n;
  const int c0 = (static_cast<int>(blockIdx.x) * tx_n + tx) * V;
  float s1[V], s2[V], s3[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = s3[j] = 0.0f;

  if (c0 < c) {
    float ref[V], mb[V], md[V], ref2[V];
    if constexpr (kBwd) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        ref[j] = c0 + j < c ? mean[c0 + j] : 0.0f;
        if constexpr (kSecond) ref2[j] = c0 + j < c ? sum.mean2[c0 + j] : 0.0f;
        if constexpr (kMask) {
          mb[j] = c0 + j < c ? mask.invstd[c0 + j] * mask.gamma[c0 + j] : 0.0f;
          md[j] = c0 + j < c ? mask.beta[c0 + j] : 0.0f;
        }
      }
    } else if constexpr (kGivenRef) {
      // Synchronised BN: a shift every rank shares (0, or the global mean of the first pass).
#pragma unroll
      for (int j = 0; j < V; ++j) ref[j] = mean != nullptr && c0 + j < c ? mean[c0 + j] : 0.0f;
    } else {
      load_vec<V>(x + c0, ref);  // the shift: row 0 keeps the one-pass variance free of cancellation
    }
    const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_block;
    const std::int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    for (std::int64_t r = r0 + ty; r < r1; r += kUnroll * ty_n) {
      Packed<T, V> xp[kUnroll], gp[kUnroll], yp[kUnroll], ap[kUnroll], x2p[kUnroll];
      unsigned bp[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t rr = r + u * ty_n;
        if (rr < r1) {
          xp[u] = load_packed<V>(x + rr * cs + c0);
          if constexpr (kBwd) gp[u] = load_packed<V>(dy + rr * cs + c0);
          if constexpr (kSumBits) {
            static_assert(V == 8, "ReLU mask bytes cover 8 channels");
            bp[u] = sum.bits[rr * (cs / V) + c0 / V];
          } else if constexpr (kSum) {
            yp[u] = load_packed<V>(sum.y + rr * cs + c0);
          }
          if constexpr (kSum) ap[u] = load_packed<V>(sum.a + rr * cs + c0);
          if constexpr (kSecond) x2p[u] = load_packed<V>(sum.x2 + rr * cs + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (r + u * ty_n >= r1) break;
        float xv[V], gv[V];
        unpack<V>(xp[u], xv);
        if constexpr (kBwd) unpack<V>(gp[u], gv);
        if constexpr (kSum) {
          float yv[V], av[V];
          if constexpr (kSumBits) {
#pragma unroll
            for (int j = 0; j < V; ++j) yv[j] = (bp[u] >> j) & 1u ? 1.0f : 0.0f;
          } else {
            unpack<V>(yp[u], yv);
          }
          unpack<V>(ap[u], av);
#pragma unroll
          for (int j = 0; j < V; ++j) gv[j] = yv[j] > 0.0f ? round_to<T>(gv[j] + av[j]) : 0.0f;
          store_vec<V>(sum.g + (r + u * ty_n) * cs + c0, gv);
          if constexpr (kSecond) {
            float x2v[V];
            unpack<V>(x2p[u], x2v);
#pragma unroll
            for (int j = 0; j < V; ++j) s3[j] += gv[j] * (x2v[j] - ref2[j]);
          }
        }
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if constexpr (kMask) {
            if (!(round_to<T>((xv[j] - ref[j]) * mb[j] + md[j]) > 0.0f)) gv[j] = 0.0f;
          }
          if constexpr (kBwd) {
            s1[j] += gv[j];
            s2[j] += gv[j] * (xv[j] - ref[j]);
          } else {
            const float d = xv[j] - ref[j];
            s1[j] += d;
            s2[j] += d * d;
          }
        }
      }
    }
  }

  // Fixed tree over the block's ty rows (tx stays put: red[k][j][ty·tx_n + tx]).
#pragma unroll
  for (int j = 0; j < V; ++j) {
    red[0][j][tid] = s1[j];
    red[1][j][tid] = s2[j];
    if constexpr (kSecond) red[2][j][tid] = s3[j];
  }
  __syncthreads();
  for (int s = ty_n / 2; s > 0; s >>= 1) {
    if (ty < s) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        red[0][j][tid] += red[0][j][tid + s * tx_n];
        red[1][j][tid] += red[1][j][tid + s * tx_n];
        if constexpr (kSecond) red[2][j][tid] += red[2][j][tid + s * tx_n];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && c0 < c) {
    float* p = partials + static_cast<std::int64_t>(blockIdx.y) * 2 * cs;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (c0 + j < c) {
        p[c0 + j] = red[0][j][tx];
        p[cs + c0 + j] = red[1][j][tx];
      }
    }
    if constexpr (kSecond) {
      float* q = sum.partials2 + static_cast<std::int64_t>(blockIdx.y) * 2 * cs;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (c0 + j < c) {
          q[c0 + j] = red[0][j][tx];
          q[cs + c0 + j] = red[2][j][tx];
        }
      }
    }
  }
}

// ---- finalize --------------------------------------------------------------------------------------------

/// Block of kFinalizeChannels channels × kSlices: slice k adds row blocks k, k + kSlices, ... in FP64, then a fixed
/// tree. Returns true on the thread (slice 0) that owns channel `ch` < c, with the two sums.
__device__ bool combine_partials(const float* __restrict__ partials, int row_blocks, int cs, int c, int* ch_out,
                                 double* s1_out, double* s2_out) {
  __shared__ double red[2][kSlices][kFinalizeChannels];
  const int lane = static_cast<int>(threadIdx.x) % kFinalizeChannels;
  const int slice = static_cast<int>(threadIdx.x) / kFinalizeChannels;
  const int ch = static_cast<int>(blockIdx.x) * kFinalizeChannels + lane;
  double s1 = 0.0, s2 = 0.0;
  if (ch < c) {
#pragma unroll 4
    for (int g = slice; g < row_blocks; g += kSlices) {
      const float* p = partials + static_cast<std::int64_t>(g) * 2 * cs;
      s1 += p[ch];
      s2 += p[cs + ch];
    }
  }
  red[0][slice][lane] = s1;
  red[1][slice][lane] = s2;
  __syncthreads();
  for (int s = kSlices / 2; s > 0; s >>= 1) {
    if (slice < s) {
      red[0][slice][lane] += red[0][slice + s][lane];
      red[1][slice][lane] += red[1][slice + s][lane];
    }
    __syncthreads();
  }
  *ch_out = ch;
  *s1_out = red[0][0][lane];
  *s2_out = red[1][0][lane];
  return slice == 0 && ch < c;
}

template <typename T>
__global__ void __launch_bounds__(kFinalizeThreads)
    bn_finalize_forward_kernel(const float* __restrict__ partials, int row_blocks, int cs, int c, std::int64_t rows,
                               const T* __restrict__ x, const float* __restrict__ eps, float* __restrict__ mean,
                               float* __restrict__ var_unbiased, float* __restrict__ invstd) {
  int ch;
  double s1, s2;
  if (!combine_partials(partials, row_blocks, cs, c, &ch, &s1, &s2)) return;
  const double inv_rows = 1.0 / static_cast<double>(rows);
  const double dm = s1 * inv_rows;
  const double v = s2 * inv_rows - dm * dm;
  const double var = 0.0 < v ? v : 0.0;  // std::max(0.0, v): NaN gives 0, as on the CPU
  mean[ch] = static_cast<float>(static_cast<double>(detail::to_float(x[ch])) + dm);
  invstd[ch] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(*eps)));
  var_unbiased[ch] = static_cast<float>(var * static_cast<double>(rows) / static_cast<double>(rows - 1));
}

/// batchnorm_statistics_from_sums: Σx in mean, Σx² in var_unbiased, replaced in place.
__global__ void bn_stats_from_sums_kernel(int c, std::int64_t rows, const float* __restrict__ eps,
                                          float* __restrict__ mean, float* __restrict__ var_unbiased,
                                          float* __restrict__ invstd) {
  const int ch = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (ch >= c) return;
  const double r = static_cast<double>(rows);
  const double dm = static_cast<double>(mean[ch]) / r;
  const double v = static_cast<double>(var_unbiased[ch]) / r - dm * dm;
  const double var = 0.0 < v ? v : 0.0;  // NaN gives 0, as batchnorm_train_statistics
  mean[ch] = static_cast<float>(dm);
  invstd[ch] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(*eps)));
  var_unbiased[ch] = static_cast<float>(var * r / (r - 1.0));
}

/// dβ += Σdy, dγ += Σdy·x̂ (FP64 add, then float); coeff = {γ·invstd, Σdy/R, Σdy·x̂·invstd/R} for the dx pass.
__global__ void __launch_bounds__(kFinalizeThreads)
    bn_finalize_backward_kernel(const float* __restrict__ partials, int row_blocks, int cs, int c, std::int64_t rows,
                                const float* __restrict__ gamma, const float* __restrict__ invstd,
                                float* __restrict__ dgamma, float* __restrict__ dbeta, float* __restrict__ coeff) {
  int ch;
  double sdy, sdyx;
  if (!combine_partials(partials, row_blocks, cs, c, &ch, &sdy, &sdyx)) return;
  const double inv = invstd[ch];
  const double dg = sdyx * inv;
  if (dbeta != nullptr) dbeta[ch] = static_cast<float>(static_cast<double>(dbeta[ch]) + sdy);
  if (dgamma != nullptr) dgamma[ch] = static_cast<float>(static_cast<double>(dgamma[ch]) + dg);
  if (coeff != nullptr) {
    coeff[ch] = static_cast<float>(static_cast<double>(gamma[ch]) * inv);
    coeff[cs + ch] = static_cast<float>(sdy / static_cast<double>(rows));
    coeff[2 * cs + ch] = static_cast<float>(dg * inv / static_cast<double>(rows));
  }
}

// ---- synchronised BN (--sync-bn on GPU ranks) --------------------------------------------------------------
// The per-channel sums of this rank (combined in FP64 like the local path, then stored as FP32: what the CPU path
// all-reduces), summed over the ranks by the caller's ncclAllReduce between the kernels, then turned into the
// statistics of the global batch of R_g = rows × ranks values per channel. Same formulas as the CPU path
// (runtime/cpu_ops.cpp, sync_bn_forward/backward): mean = Σx/R_g, then var = Σ(x − mean)²/R_g (two passes).

/// sums[ch] = s1 (out1) and/or s2 (out2) of the partials, as floats.
__global__ void __launch_bounds__(kFinalizeThreads)
    bn_sync_sums_kernel(const float* __restrict__ partials, int row_blocks, int cs, int c, float* __restrict__ out1,
                        float* __restrict__ out2) {
  int ch;
  double s1, s2;
  if (!combine_partials(partials, row_blocks, cs, c, &ch, &s1, &s2)) return;
  if (out1 != nullptr) out1[ch] = static_cast<float>(s1);
  if (out2 != nullptr) out2[ch] = static_cast<float>(s2);
}

/// mean[ch] = Σx / R_g from the all-reduced sums.
__global__ void bn_sync_mean_kernel(const float* __restrict__ sums, int c, double global_rows, float* __restrict__ mean) {
  const int ch = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (ch < c) mean[ch] = static_cast<float>(static_cast<double>(sums[ch]) / global_rows);
}

/// From the all-reduced Σ(x − mean)²: invstd and the unbiased variance of the global batch.
__global__ void bn_sync_var_kernel(const float* __restrict__ sq, int c, double global_rows, const float* __restrict__ eps,
                                   float* __restrict__ var_unbiased, float* __restrict__ invstd) {
  const int ch = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (ch >= c) return;
  const double var = static_cast<double>(sq[ch]) / global_rows;
  invstd[ch] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(*eps)));
  var_unbiased[ch] = static_cast<float>(var * global_rows / (global_rows - 1.0));
}

/// Backward, before the all-reduce: dβ += Σdy, dγ += Σdy·x̂ (this rank's: they are averaged with the other gradients
/// later); buf = {Σdy, Σdy·x̂} as floats, to be summed over the ranks.
__global__ void __launch_bounds__(kFinalizeThreads)
    bn_sync_backward_local_kernel(const float* __restrict__ partials, int row_blocks, int cs, int c,
                                  const float* __restrict__ invstd, float* __restrict__ dgamma,
                                  float* __restrict__ dbeta, float* __restrict__ buf) {
  int ch;
  double sdy, sdyx;
  if (!combine_partials(partials, row_blocks, cs, c, &ch, &sdy, &sdyx)) return;
  const double dg = sdyx * static_cast<double>(invstd[ch]);
  if (dbeta != nullptr) dbeta[ch] = static_cast<float>(static_cast<double>(dbeta[ch]) + sdy);
  if (dgamma != nullptr) dgamma[ch] = static_cast<float>(static_cast<double>(dgamma[ch]) + dg);
  buf[ch] = static_cast<float>(sdy);
  buf[cs + ch] = static_cast<float>(dg);
}

/// Backward, after the all-reduce: the dx coefficients from the global sums.
__global__ void bn_sync_backward_coeff_kernel(const float* __restrict__ buf, int cs, int c, double global_rows,
                                              const float* __restrict__ gamma, const float* __restrict__ invstd,
                                              float* __restrict__ coeff) {
  const int ch = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (ch >= c) return;
  const double inv = invstd[ch];
  coeff[ch] = static_cast<float>(static_cast<double>(gamma[ch]) * inv);
  coeff[cs + ch] = static_cast<float>(static_cast<double>(buf[ch]) / global_rows);
  coeff[2 * cs + ch] = static_cast<float>(static_cast<double>(buf[cs + ch]) * inv / global_rows);
}

// ---- apply -----------------------------------------------------------------------------------------------

enum class Mode { kTrain, kInfer, kBackward };

struct ApplyParams {
  const float* mean = nullptr;   // batch mean (train, backward) or running mean (infer)
  const float* spread = nullptr; // save_invstd (train) or running var (infer)
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* eps = nullptr;    // infer
  const float* coeff = nullptr;  // backward: k1 | mdy | k2, each cs floats
};

/// Per-channel a, b, d of a forward apply, out = (x − a)·b + d.
template <Mode M>
__device__ __forceinline__ void forward_coeffs(const ApplyParams& p, int ch, float& a, float& b, float& d) {
  a = p.mean[ch];
  if constexpr (M == Mode::kTrain)
    b = p.spread[ch] * p.gamma[ch];
  else
    b = static_cast<float>(1.0 / sqrt(static_cast<double>(p.spread[ch]) + static_cast<double>(*p.eps))) * p.gamma[ch];
  d = p.beta[ch];
}

/// Train/infer: o = (x − a)·b + d; with a shortcut, o = round(round(o) + s') where s' = s or round(BN₂(s)) (the
/// roundings of the plain parts: BN output, shortcut BN output and sum are each stored in T there); then
/// o = max(o, 0) when relu. Backward: dy' = dy masked by the recomputed ReLU mask when kMask; v = b·(dy' − d − (x − a)·k);
/// out (=|+=) v. Padding channels: 0, or unchanged when accumulating. x, s, dy, out may alias (element-wise in place).
/// kBits (forward, V = 8): bits[row·cs/8 + c0/8] = the sign of the stored output, bit j for channel c0 + j
/// (plan_relu_masks: what a later ADD_RELU_BN_BWD reads instead of the output).
template <typename T, int V, Mode M, bool kAcc, Shortcut kSc = Shortcut::kNone, bool kMask = false, bool kBits = false>
__global__ void __launch_bounds__(kThreads)
    bn_apply_kernel(const T* x, const T* dy, T* out, std::int64_t rows, int cs, int c, int tx_n,
                    std::int64_t rows_per_block, ApplyParams p, const T* s = nullptr, ApplyParams p2 = {},
                    bool relu = false, ReluMask mask = {}, std::uint8_t* bits = nullptr) {
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % tx_n, ty = tid / tx_n, ty_n = kThreads / tx_n;
  const int c0 = (static_cast<int>(blockIdx.x) * tx_n + tx) * V;
  if (c0 >= cs) return;
  float a[V], b[V], d[V], k[V], a2[V], b2[V], d2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    a[j] = b[j] = d[j] = k[j] = a2[j] = b2[j] = d2[j] = 0.0f;
    const int ch = c0 + j;
    if (ch >= c) continue;
    if constexpr (M == Mode::kBackward) {
      a[j] = p.mean[ch];
      b[j] = p.coeff[ch];
      d[j] = p.coeff[cs + ch];
      k[j] = p.coeff[2 * cs + ch];
      if constexpr (kMask) {
        b2[j] = mask.invstd[ch] * mask.gamma[ch];
        d2[j] = mask.beta[ch];
      }
    } else {
      forward_coeffs<M>(p, ch, a[j], b[j], d[j]);
      if constexpr (kSc == Shortcut::kBatchNorm) forward_coeffs<M>(p2, ch, a2[j], b2[j], d2[j]);
    }
  }
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_block;
  const std::int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  for (std::int64_t r = r0 + ty; r < r1; r += kUnroll * ty_n) {
    Packed<T, V> xp[kUnroll], gp[kUnroll], op[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t rr = r + u * ty_n;
      if (rr < r1) {
        xp[u] = load_packed<V>(x + rr * cs + c0);
        if constexpr (M == Mode::kBackward) gp[u] = load_packed<V>(dy + rr * cs + c0);
        if constexpr (kSc != Shortcut::kNone) gp[u] = load_packed<V>(s + rr * cs + c0);
        if constexpr (kAcc) op[u] = load_packed<V>(out + rr * cs + c0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t rr = r + u * ty_n;
      if (rr >= r1) break;
      float xv[V], gv[V] = {}, ov[V] = {}, o[V];
      unpack<V>(xp[u], xv);
      if constexpr (M == Mode::kBackward || kSc != Shortcut::kNone) unpack<V>(gp[u], gv);
      if constexpr (kAcc) unpack<V>(op[u], ov);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (c0 + j >= c) {
          o[j] = kAcc ? ov[j] : 0.0f;
        } else if constexpr (M == Mode::kBackward) {
          float g = gv[j];
          if constexpr (kMask) {
            if (!(round_to<T>((xv[j] - a[j]) * b2[j] + d2[j]) > 0.0f)) g = 0.0f;
          }
          const float v = b[j] * (g - d[j] - (xv[j] - a[j]) * k[j]);
          o[j] = kAcc ? ov[j] + v : v;
        } else {
          float v = (xv[j] - a[j]) * b[j] + d[j];
          if constexpr (kSc == Shortcut::kTensor) v = round_to<T>(round_to<T>(v) + gv[j]);
          if constexpr (kSc == Shortcut::kBatchNorm)
            v = round_to<T>(round_to<T>(v) + round_to<T>((gv[j] - a2[j]) * b2[j] + d2[j]));
          o[j] = relu && !(v > 0.0f) ? 0.0f : v;
        }
      }
      store_vec<V>(out + rr * cs + c0, o);
      if constexpr (kBits) {
        static_assert(V == 8, "ReLU mask bytes cover 8 channels");
        unsigned b = 0;
#pragma unroll
        for (int j = 0; j < V; ++j) b |= round_to<T>(o[j]) > 0.0f ? 1u << j : 0u;
        bits[rr * (cs / V) + c0 / V] = static_cast<std::uint8_t>(b);
      }
    }
  }
}

/// plan ADD_RELU_BN_BN_BWD: the dx passes of two BN backwards that read the same dy (a projection block's main and
/// shortcut BN): out = b·(dy − d − (x − a)·k), out2 likewise from x2 and p2, dy read once; the formula and its order
/// are bn_apply_kernel's (kBackward, not accumulating), so each output equals that kernel's bit for bit.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_apply_backward2_kernel(const T* x, const T* x2, const T* dy, T* out, T* out2, std::int64_t rows, int cs, int c,
                              int tx_n, std::int64_t rows_per_block, ApplyParams p, ApplyParams p2) {
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % tx_n, ty = tid / tx_n, ty_n = kThreads / tx_n;
  const int c0 = (static_cast<int>(blockIdx.x) * tx_n + tx) * V;
  if (c0 >= cs) return;
  float a[V], b[V], d[V], k[V], a2[V], b2[V], d2[V], k2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    a[j] = b[j] = d[j] = k[j] = a2[j] = b2[j] = d2[j] = k2[j] = 0.0f;
    const int ch = c0 + j;
    if (ch >= c) continue;
    a[j] = p.mean[ch];
    b[j] = p.coeff[ch];
    d[j] = p.coeff[cs + ch];
    k[j] = p.coeff[2 * cs + ch];
    a2[j] = p2.mean[ch];
    b2[j] = p2.coeff[ch];
    d2[j] = p2.coeff[cs + ch];
    k2[j] = p2.coeff[2 * cs + ch];
  }
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_block;
  const std::int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  for (std::int64_t r = r0 + ty; r < r1; r += kUnroll * ty_n) {
    Packed<T, V> xp[kUnroll], x2p[kUnroll], gp[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t rr = r + u * ty_n;
      if (rr < r1) {
        xp[u] = load_packed<V>(x + rr * cs + c0);
        x2p[u] = load_packed<V>(x2 + rr * cs + c0);
        gp[u] = load_packed<V>(dy + rr * cs + c0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t rr = r + u * ty_n;
      if (rr >= r1) break;
      float xv[V], x2v[V], gv[V], o[V], o2[V];
      unpack<V>(xp[u], xv);
      unpack<V>(x2p[u], x2v);
      unpack<V>(gp[u], gv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (c0 + j >= c) {
          o[j] = o2[j] = 0.0f;
        } else {
          o[j] = b[j] * (gv[j] - d[j] - (xv[j] - a[j]) * k[j]);
          o2[j] = b2[j] * (gv[j] - d2[j] - (x2v[j] - a2[j]) * k2[j]);
        }
      }
      store_vec<V>(out + rr * cs + c0, o);
      store_vec<V>(out2 + rr * cs + c0, o2);
    }
  }
}

// ---- launch helpers --------------------------------------------------------------------------------------

void check_common(const TensorRef& x, const char* what) {
  detail::check_float_tensor(x, what, "x");
  RN_CHECK(x.c_stride < (std::int64_t{1} << 28), "{}: c_stride {} is too large", what, x.c_stride);
}

void check_workspace(const void* workspace, std::size_t bytes, std::size_t need, const char* what) {
  RN_CHECK(workspace != nullptr && detail::aligned16(workspace), "{}: workspace is null or not 16-byte aligned", what);
  RN_CHECK(bytes >= need, "{}: workspace has {} bytes, needs {} (batchnorm_workspace_bytes)", what, bytes, need);
}

dim3 grid_of(const Tiling& t) {
  return dim3(static_cast<unsigned>(t.tiles), static_cast<unsigned>(t.row_blocks));
}

unsigned finalize_blocks(std::int64_t c) {
  return static_cast<unsigned>((c + kFinalizeChannels - 1) / kFinalizeChannels);
}

}  // namespace

std::size_t batchnorm_workspace_bytes(const TensorRef& x) {
  const std::int64_t rows = x.rows(), cs = x.c_stride;
  if (rows <= 0 || cs <= 0) return 0;
  std::size_t part = partial_bytes(make_tiling(rows, cs, 1), cs);
  const int w = x.dtype == DType::F32 ? 4 : 8;
  if (cs % w == 0) part = std::max(part, partial_bytes(make_tiling(rows, cs, w), cs));
  return part + align256(static_cast<std::size_t>(3 * cs) * sizeof(float));
}

std::size_t batchnorm_sync_workspace_bytes(const TensorRef& x) {
  const std::size_t local = batchnorm_workspace_bytes(x);
  return local == 0 ? 0 : local + align256(static_cast<std::size_t>(2 * x.c_stride) * sizeof(float));
}

namespace {
/// The sums buffer of the synchronised paths (2·c_stride floats), after the partials and the dx coefficients.
float* sync_sums(void* workspace, std::size_t part, std::int64_t cs) {
  return reinterpret_cast<float*>(static_cast<char*>(workspace) + part +
                                  align256(static_cast<std::size_t>(3 * cs) * sizeof(float)));
}
unsigned channel_blocks(std::int64_t c) { return static_cast<unsigned>((c + kThreads - 1) / kThreads); }
void check_sync(const SyncReduce* sync, std::int64_t rows, const char* what) {
  if (!sync) return;
  RN_CHECK(static_cast<bool>(sync->sum), "{}: the synchronised path needs a sum over the ranks", what);
  RN_CHECK(sync->global_rows >= static_cast<double>(rows) && sync->global_rows > 1,
           "{}: the global batch has {} values per channel, fewer than this rank's {} (or one)", what,
           sync->global_rows, rows);
}
}  // namespace

void batchnorm_statistics_from_sums(cudaStream_t stream, std::int64_t channels, std::int64_t rows, const float* eps,
                                    float* batch_mean, float* batch_var_unbiased, float* save_invstd) {
  RN_CHECK(channels > 0 && channels <= std::numeric_limits<int>::max() && rows > 1,
           "batchnorm_statistics_from_sums: {} channels of {} rows (batch statistics need more than one row)",
           channels, rows);
  RN_CHECK(eps && batch_mean && batch_var_unbiased && save_invstd,
           "batchnorm_statistics_from_sums: eps or a statistics pointer is null");
  bn_stats_from_sums_kernel<<<channel_blocks(channels), kThreads, 0, stream>>>(
      static_cast<int>(channels), rows, eps, batch_mean, batch_var_unbiased, save_invstd);
  CUDA_CHECK_LAUNCH();
}

void batchnorm_train_statistics(cudaStream_t stream, const TensorRef& x, const float* eps, float* batch_mean,
                                 float* batch_var_unbiased, float* save_invstd, void* workspace,
                                 std::size_t workspace_bytes, const SyncReduce* sync) {
  const char* what = "batchnorm_train_statistics";
  check_common(x, what);
  RN_CHECK(eps && batch_mean && batch_var_unbiased && save_invstd, "{}: eps or a statistics pointer is null", what);
  RN_CHECK(x.rows() > 1 || (sync && sync->global_rows > 1), "{}: {} has one value per channel; batch statistics need more",
           what, x.shape.str());
  check_sync(sync, x.rows(), what);
  const std::int64_t rows = x.rows(), cs = x.c_stride, c = x.shape.c;
  const bool vec = detail::vectorisable(x.dtype, cs, {x.ptr});
  detail::dispatch_storage(x.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const Tiling t = make_tiling(rows, cs, V);
    const std::size_t part = partial_bytes(t, cs);
    auto* partials = static_cast<float*>(workspace);
    const T* px = static_cast<const T*>(x.ptr);
    const int ics = static_cast<int>(cs), ic = static_cast<int>(c);
    if (sync) {
      // Pass 1: Σx → all ranks → the global mean; pass 2: Σ(x − mean)² → all ranks → var, invstd.
      check_workspace(workspace, workspace_bytes, batchnorm_sync_workspace_bytes(x), what);
      float* sums = sync_sums(workspace, part, cs);
      bn_partials_kernel<T, V, false, false, true><<<grid_of(t), kThreads, 0, stream>>>(
          px, nullptr, nullptr, rows, ics, ic, t.tx, t.rows_per_block, partials);
      CUDA_CHECK_LAUNCH();
      bn_sync_sums_kernel<<<finalize_blocks(c), kFinalizeThreads, 0, stream>>>(
          partials, static_cast<int>(t.row_blocks), ics, ic, sums, nullptr);
      CUDA_CHECK_LAUNCH();
      sync->sum(sums, c);
      bn_sync_mean_kernel<<<channel_blocks(c), kThreads, 0, stream>>>(sums, ic, sync->global_rows, batch_mean);
      CUDA_CHECK_LAUNCH();
      bn_partials_kernel<T, V, false, false, true><<<grid_of(t), kThreads, 0, stream>>>(
          px, nullptr, batch_mean, rows, ics, ic, t.tx, t.rows_per_block, partials);
      CUDA_CHECK_LAUNCH();
      bn_sync_sums_kernel<<<finalize_blocks(c), kFinalizeThreads, 0, stream>>>(
          partials, static_cast<int>(t.row_blocks), ics, ic, nullptr, sums + cs);
      CUDA_CHECK_LAUNCH();
      sync->sum(sums + cs, c);
      bn_sync_var_kernel<<<channel_blocks(c), kThreads, 0, stream>>>(sums + cs, ic, sync->global_rows, eps,
                                                                       batch_var_unbiased, save_invstd);
      CUDA_CHECK_LAUNCH();
      return;
    }
    check_workspace(workspace, workspace_bytes, part, what);
    bn_partials_kernel<T, V, false><<<grid_of(t), kThreads, 0, stream>>>(
        px, nullptr, nullptr, rows, static_cast<int>(cs), static_cast<int>(c), t.tx, t.rows_per_block, partials);
    CUDA_CHECK_LAUNCH();
    bn_finalize_forward_kernel<T><<<finalize_blocks(c), kFinalizeThreads, 0, stream>>>(
        partials, static_cast<int>(t.row_blocks), static_cast<int>(cs), static_cast<int>(c), rows, px, eps,
        batch_mean, batch_var_unbiased, save_invstd);
    CUDA_CHECK_LAUNCH();
  });
}

namespace {

ApplyParams apply_params(const BnApply& a) {
  ApplyParams p;
  p.mean = a.mean;
  p.spread = a.spread;
  p.gamma = a.gamma;
  p.beta = a.beta;
  p.eps = a.eps;
  return p;
}

void check_apply(const BnApply& a, bool inference, const char* what, const char* name) {
  check_common(a.x, what);
  RN_CHECK(a.gamma && a.beta && a.mean && a.spread && (!inference || a.eps),
           "{}: a parameter or statistics pointer of {} is null", what, name);
}

}  // namespace

void batchnorm_apply_fused(cudaStream_t stream, bool inference, const BnApply& main, Shortcut shortcut,
                           const TensorRef& s, const BnApply* s_bn, bool relu, const TensorRef& y,
                           std::uint8_t* mask) {
  const char* what = "batchnorm_apply_fused";
  check_apply(main, inference, what, "the main branch");
  detail::check_float_tensor(y, what, "y");
  detail::check_same_layout(main.x, y, what, "x", "y");
  const void* ps = nullptr;
  if (shortcut == Shortcut::kTensor) {
    detail::check_float_tensor(s, what, "the shortcut");
    detail::check_same_layout(s, y, what, "the shortcut", "y");
    ps = s.ptr;
  } else if (shortcut == Shortcut::kBatchNorm) {
    RN_CHECK(s_bn != nullptr, "{}: a batch-norm shortcut needs its parameters", what);
    check_apply(*s_bn, inference, what, "the shortcut");
    detail::check_same_layout(s_bn->x, y, what, "the shortcut", "y");
    ps = s_bn->x.ptr;
  }
  const std::int64_t rows = y.rows(), cs = y.c_stride, c = y.shape.c;
  const bool vec = detail::vectorisable(y.dtype, cs, {main.x.ptr, ps, y.ptr});
  const ApplyParams p = apply_params(main);
  const ApplyParams p2 = shortcut == Shortcut::kBatchNorm ? apply_params(*s_bn) : ApplyParams{};
  RN_CHECK(mask == nullptr || (relu && y.dtype == DType::F16 && vec && cs % 8 == 0),
           "{}: a ReLU mask needs the ReLU and 16-byte aligned FP16 tensors of 8-channel groups ({} {}, c_stride {})",
           what, dtype_name(y.dtype), y.shape.str(), cs);
  detail::dispatch_storage(y.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const Tiling t = make_tiling(rows, cs, V);
    const T* px = static_cast<const T*>(main.x.ptr);
    const T* pss = static_cast<const T*>(ps);
    T* py = static_cast<T*>(y.ptr);
    auto launch = [&](auto mode, auto sc) {
      constexpr Mode M = decltype(mode)::value;
      constexpr Shortcut S = decltype(sc)::value;
      if constexpr (V == 8) {
        if (mask != nullptr) {
          bn_apply_kernel<T, V, M, false, S, false, true><<<grid_of(t), kThreads, 0, stream>>>(
              px, nullptr, py, rows, static_cast<int>(cs), static_cast<int>(c), t.tx, t.rows_per_block, p, pss, p2,
              relu, ReluMask{}, mask);
          CUDA_CHECK_LAUNCH();
          return;
        }
      }
      bn_apply_kernel<T, V, M, false, S><<<grid_of(t), kThreads, 0, stream>>>(
          px, nullptr, py, rows, static_cast<int>(cs), static_cast<int>(c), t.tx, t.rows_per_block, p, pss, p2, relu);
      CUDA_CHECK_LAUNCH();
    };
    auto with_mode = [&](auto sc) {
      if (inference)
        launch(std::integral_constant<Mode, Mode::kInfer>{}, sc);
      else
        launch(std::integral_constant<Mode, Mode::kTrain>{}, sc);
    };
    switch (shortcut) {
      case Shortcut::kNone: with_mode(std::integral_constant<Shortcut, Shortcut::kNone>{}); break;
      case Shortcut::kTensor: with_mode(std::integral_constant<Shortcut, Shortcut::kTensor>{}); break;
      case Shortcut::kBatchNorm: with_mode(std::integral_constant<Shortcut, Shortcut::kBatchNorm>{}); break;
    }
  });
}

void batchnorm_forward_train(cudaStream_t stream, const TensorRef& x, const float* gamma, const float* beta,
                             const float* eps, const TensorRef& y, float* batch_mean, float* batch_var_unbiased,
                             float* save_invstd, void* workspace, std::size_t workspace_bytes, const SyncReduce* sync) {
  RN_CHECK(gamma && beta, "batchnorm_forward_train: gamma or beta is null");
  batchnorm_train_statistics(stream, x, eps, batch_mean, batch_var_unbiased, save_invstd, workspace, workspace_bytes,
                             sync);
  batchnorm_apply_fused(stream, false, BnApply{x, gamma, beta, batch_mean, save_invstd, nullptr}, Shortcut::kNone, {},
                        nullptr, false, y);
}

void batchnorm_forward_inference(cudaStream_t stream, const TensorRef& x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, const float* eps,
                                 const TensorRef& y) {
  batchnorm_apply_fused(stream, true, BnApply{x, gamma, beta, running_mean, running_var, eps}, Shortcut::kNone, {},
                        nullptr, false, y);
}

namespace {

/// The residual sum's ReLU backward of batchnorm_add_relu_backward: the tensors it reads and g, which it writes.
struct SumReluRefs {
  TensorRef y, dy, addend, g;
  const std::uint8_t* mask = nullptr;
  const ShortcutBnBackward* second = nullptr;  ///< run fused here (the caller checked it can)
};

/// batchnorm_relu_backward, and with `sum` batchnorm_add_relu_backward (dy is then sum->g, formed by the partials).
void bn_backward(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, const float* gamma,
                 const float* save_mean, const float* save_invstd, const ReluMask* mask, const SumReluRefs* sum,
                 const TensorRef& dx, bool accumulate_dx, float* dgamma, float* dbeta, void* workspace,
                 std::size_t workspace_bytes, const SyncReduce* sync) {
  const char* what = sum ? "batchnorm_add_relu_backward" : mask ? "batchnorm_relu_backward" : "batchnorm_backward";
  check_sync(sync, x.rows(), what);
  check_common(x, what);
  detail::check_float_tensor(dy, what, "dy");
  detail::check_same_layout(x, dy, what, "x", "dy");
  if (dx) {
    detail::check_float_tensor(dx, what, "dx");
    detail::check_same_layout(x, dx, what, "x", "dx");
  }
  RN_CHECK(gamma && save_mean && save_invstd, "{}: gamma, save_mean or save_invstd is null", what);
  RN_CHECK(!mask || (mask->invstd && mask->gamma && mask->beta), "{}: a ReLU-mask pointer is null", what);
  const std::int64_t rows = x.rows(), cs = x.c_stride, c = x.shape.c;
  const bool vec = detail::vectorisable(x.dtype, cs,
                                        {x.ptr, dy.ptr, dx.ptr, sum ? sum->y.ptr : nullptr, sum ? sum->dy.ptr : nullptr,
                                         sum ? sum->addend.ptr : nullptr});
  const ReluMask m = mask ? *mask : ReluMask{};
  detail::dispatch_storage(x.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const Tiling t = make_tiling(rows, cs, V);
    const std::size_t part = partial_bytes(t, cs);
    check_workspace(workspace, workspace_bytes,
                    sync ? batchnorm_sync_workspace_bytes(x) : part + static_cast<std::size_t>(3 * cs) * sizeof(float),
                    what);
    auto* partials = static_cast<float*>(workspace);
    float* coeff = dx || sync ? reinterpret_cast<float*>(static_cast<char*>(workspace) + part) : nullptr;
    const T* px = static_cast<const T*>(x.ptr);
    const T* pdy = static_cast<const T*>(dy.ptr);
    const int ics = static_cast<int>(cs), ic = static_cast<int>(c);
    // The statistics pass covers the channels of vectors that start below C: where a vector (or a lone padding
    // channel) lies wholly in the padding, g's padding would not be written there, so the sum's pass runs apart.
    if (sum && (c + V - 1) / V * V < cs) {
      relu_backward_sum(stream, sum->y, sum->dy, sum->addend, sum->g);
      sum = nullptr;
    }
    if (sum) {
      SumRelu<T> sr{static_cast<const T*>(sum->y.ptr), static_cast<const T*>(sum->addend.ptr),
                    static_cast<T*>(sum->g.ptr), sum->mask};
      bool done = false;
      if constexpr (V == 8) {
        if (sum->second != nullptr) {  // the shortcut BN's sums too, into the second half of the workspace
          sr.x2 = static_cast<const T*>(sum->second->x.ptr);
          sr.mean2 = sum->second->save_mean;
          sr.partials2 = reinterpret_cast<float*>(static_cast<char*>(workspace) + batchnorm_workspace_bytes(x));
          auto launch = [&](auto bits) {
            bn_partials_kernel<T, V, true, false, false, true, decltype(bits)::value, true>
                <<<grid_of(t), kThreads, 0, stream>>>(px, static_cast<const T*>(sum->dy.ptr), save_mean, rows, ics,
                                                      ic, t.tx, t.rows_per_block, partials, ReluMask{}, sr);
          };
          if (sum->mask != nullptr)
            launch(std::true_type{});
          else
            launch(std::false_type{});
          done = true;
        } else if (sum->mask != nullptr) {  // the ReLU's sign from its 1-bit mask instead of y
          bn_partials_kernel<T, V, true, false, false, true, true><<<grid_of(t), kThreads, 0, stream>>>(
              px, static_cast<const T*>(sum->dy.ptr), save_mean, rows, ics, ic, t.tx, t.rows_per_block, partials,
              ReluMask{}, sr);
          done = true;
        }
      }
      if (!done)
        bn_partials_kernel<T, V, true, false, false, true><<<grid_of(t), kThreads, 0, stream>>>(
            px, static_cast<const T*>(sum->dy.ptr), save_mean, rows, ics, ic, t.tx, t.rows_per_block, partials,
            ReluMask{}, sr);
    } else if (mask)
      bn_partials_kernel<T, V, true, true><<<grid_of(t), kThreads, 0, stream>>>(px, pdy, save_mean, rows, ics, ic, t.tx,
                                                                              t.rows_per_block, partials, m);
    else
      bn_partials_kernel<T, V, true><<<grid_of(t), kThreads, 0, stream>>>(px, pdy, save_mean, rows, ics, ic, t.tx,
                                                                        t.rows_per_block, partials);
    CUDA_CHECK_LAUNCH();
    if (sync) {
      // This rank's dγ, dβ and {Σdy, Σdy·x̂}; the sums over all ranks give dx's coefficients. Every rank runs the
      // all-reduce, with a data gradient or without (the same collectives everywhere).
      float* buf = sync_sums(workspace, part, cs);
      bn_sync_backward_local_kernel<<<finalize_blocks(c), kFinalizeThreads, 0, stream>>>(
          partials, static_cast<int>(t.row_blocks), ics, ic, save_invstd, dgamma, dbeta, buf);
      CUDA_CHECK_LAUNCH();
      sync->sum(buf, 2 * cs);
      if (!dx) return;
      bn_sync_backward_coeff_kernel<<<channel_blocks(c), kThreads, 0, stream>>>(buf, ics, ic, sync->global_rows, gamma,
                                                                                 save_invstd, coeff);
      CUDA_CHECK_LAUNCH();
    } else {
      bn_finalize_backward_kernel<<<finalize_blocks(c), kFinalizeThreads, 0, stream>>>(
          partials, static_cast<int>(t.row_blocks), ics, ic, rows, gamma, save_invstd, dgamma, dbeta, coeff);
      CUDA_CHECK_LAUNCH();
    }
    if constexpr (V == 8) {
      if (sum != nullptr && sum->second != nullptr) {
        const ShortcutBnBackward& sc = *sum->second;
        char* base2 = static_cast<char*>(workspace) + batchnorm_workspace_bytes(x);
        auto* coeff2 = reinterpret_cast<float*>(base2 + part);
        bn_finalize_backward_kernel<<<finalize_blocks(c), kFinalizeThreads, 0, stream>>>(
            reinterpret_cast<const float*>(base2), static_cast<int>(t.row_blocks), ics, ic, rows, sc.gamma,
            sc.save_invstd, sc.dgamma, sc.dbeta, coeff2);
        CUDA_CHECK_LAUNCH();
        ApplyParams p, p2;
        p.mean = save_mean;
        p.coeff = coeff;
        p2.mean = sc.save_mean;
        p2.coeff = coeff2;
        bn_apply_backward2_kernel<T, V><<<grid_of(t), kThreads, 0, stream>>>(
            px, static_cast<const T*>(sc.x.ptr), pdy, static_cast<T*>(dx.ptr), static_cast<T*>(sc.dx.ptr), rows, ics,
            ic, t.tx, t.rows_per_block, p, p2);
        CUDA_CHECK_LAUNCH();
        return;
      }
    }
    if (!dx) return;
    ApplyParams p;
    p.mean = save_mean;
    p.coeff = coeff;
    T* pdx = static_cast<T*>(dx.ptr);
    auto launch = [&](auto acc, auto masked) {
      constexpr bool kAcc = decltype(acc)::value, kMask = decltype(masked)::value;
      bn_apply_kernel<T, V, Mode::kBackward, kAcc, Shortcut::kNone, kMask><<<grid_of(t), kThreads, 0, stream>>>(
          px, pdy, pdx, rows, ics, ic, t.tx, t.rows_per_block, p, nullptr, ApplyParams{}, false, m);
      CUDA_CHECK_LAUNCH();
    };
    using True = std::true_type;
    using False = std::false_type;
    if (accumulate_dx)
      mask ? launch(True{}, True{}) : launch(True{}, False{});
    else
      mask ? launch(False{}, True{}) : launch(False{}, False{});
  });
}

}  // namespace

void batchnorm_relu_backward(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, const float* gamma,
                             const float* save_mean, const float* save_invstd, const ReluMask* mask,
                             const TensorRef& dx, bool accumulate_dx, float* dgamma, float* dbeta, void* workspace,
                             std::size_t workspace_bytes, const SyncReduce* sync) {
  bn_backward(stream, x, dy, gamma, save_mean, save_invstd, mask, nullptr, dx, accumulate_dx, dgamma, dbeta, workspace,
              workspace_bytes, sync);
}

void batchnorm_add_relu_backward(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& addend,
                                 const TensorRef& g, const TensorRef& x, const float* gamma, const float* save_mean,
                                 const float* save_invstd, const TensorRef& dx, bool accumulate_dx, float* dgamma,
                                 float* dbeta, void* workspace, std::size_t workspace_bytes, const SyncReduce* sync,
                                 const std::uint8_t* mask, const ShortcutBnBackward* shortcut) {
  const char* what = "batchnorm_add_relu_backward";
  for (const TensorRef* t : {&y, &dy, &addend}) {
    detail::check_float_tensor(*t, what, "input");
    detail::check_same_layout(*t, g, what, "input", "g");
  }
  detail::check_float_tensor(g, what, "g");
  detail::check_same_layout(x, g, what, "x", "g");
  RN_CHECK(mask == nullptr || y.dtype == DType::F16, "{}: a ReLU mask stands for an FP16 y only", what);
  bool joined = false;  // the shortcut's backward inside these passes (else after them, as its own call)
  if (shortcut != nullptr) {
    detail::check_float_tensor(shortcut->x, what, "the shortcut's x");
    detail::check_same_layout(shortcut->x, g, what, "the shortcut's x", "g");
    detail::check_float_tensor(shortcut->dx, what, "the shortcut's dx");
    detail::check_same_layout(shortcut->dx, g, what, "the shortcut's dx", "g");
    RN_CHECK(shortcut->gamma && shortcut->save_mean && shortcut->save_invstd,
             "{}: a parameter or statistics pointer of the shortcut is null", what);
    const std::int64_t cs = x.c_stride, c = x.shape.c;
    const int w = x.dtype == DType::F32 ? 4 : 8;
    const bool vec = detail::vectorisable(x.dtype, cs,
                                          {x.ptr, y.ptr, dy.ptr, addend.ptr, g.ptr, dx.ptr, shortcut->x.ptr,
                                           shortcut->dx.ptr});
    joined = vec && w == 8 && (c + w - 1) / w * w >= cs && !accumulate_dx && sync == nullptr && dx.ptr != nullptr &&
             workspace_bytes >= 2 * batchnorm_workspace_bytes(x);
  }
  const SumReluRefs sum{y, dy, addend, g, mask, joined ? shortcut : nullptr};
  bn_backward(stream, x, g, gamma, save_mean, save_invstd, nullptr, &sum, dx, accumulate_dx, dgamma, dbeta, workspace,
              workspace_bytes, sync);
  if (shortcut != nullptr && !joined)
    batchnorm_backward(stream, shortcut->x, g, shortcut->gamma, shortcut->save_mean, shortcut->save_invstd,
                       shortcut->dx, false, shortcut->dgamma, shortcut->dbeta, workspace, workspace_bytes, sync);
}

void batchnorm_backward(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, const float* gamma,
                        const float* save_mean, const float* save_invstd, const TensorRef& dx, bool accumulate_dx,
                        float* dgamma, float* dbeta, void* workspace, std::size_t workspace_bytes,
                        const SyncReduce* sync) {
  batchnorm_relu_backward(stream, x, dy, gamma, save_mean, save_invstd, nullptr, dx, accumulate_dx, dgamma, dbeta,
                          workspace, workspace_bytes, sync);
}

}  // namespace renaissance::cuda
