// Warp-collective statistics of one row of logits, shared by the softmax cross-entropy and metric kernels (CUDA
// sources only). One warp owns one sample; lanes stride the classes, so loads are coalesced.
#pragma once

#include <kernels/cuda/pointwise_common.cuh>

#include <cstdint>

namespace renaissance::cuda::detail {

struct RowStats {
  float mx;     ///< max_k z_k (FP32, exact; NaNs ignored: they reach the sums and make every result NaN)
  double sum;   ///< Σ_k exp(z_k − mx), FP64 like the CPU
  double lse;   ///< mx + log(sum)
  double zsum;  ///< Σ_k z_k, FP64
};

/// All 32 lanes must call it; every lane gets the same bits.
template <typename T>
__device__ RowStats row_stats(const T* __restrict__ z, int classes, int lane) {
  float m = -INFINITY;
  double zs = 0.0;
  for (int k = lane; k < classes; k += 32) {
    const float v = to_float(z[k]);
    m = v > m ? v : m;
    zs += v;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, m, off);
    m = o > m ? o : m;
  }
  m = __shfl_sync(0xffffffffu, m, 0);  // one signed zero for all lanes
  double s = 0.0;
  for (int k = lane; k < classes; k += 32) s += exp(static_cast<double>(to_float(z[k])) - static_cast<double>(m));
  s = warp_sum(s);
  RowStats r;
  r.mx = m;
  r.sum = s;
  r.lse = static_cast<double>(m) + log(s);
  r.zsum = warp_sum(zs);
  return r;
}

/// The smoothed cross-entropy of one sample: (1−ε)·(lse − z_t) + ε·(lse − Σz/K) (kernels/cpu/softmax_ce.cpp).
__device__ __forceinline__ double sample_ce(const RowStats& r, float z_t, int classes, float smoothing) {
  const double eps = smoothing;
  return (1.0 - eps) * (r.lse - static_cast<double>(z_t)) + eps * (r.lse - r.zsum / static_cast<double>(classes));
}

/// A label outside [0, classes) cannot throw on the device: it is clamped into range and counted (lane 0 adds 1 to
/// *errors when errors is not null; integer atomics, so the count is exact).
__device__ __forceinline__ int checked_label(const std::int32_t* labels, std::int64_t n, int classes,
                                             std::int32_t* errors, bool count) {
  int t = labels[n];
  if (t < 0 || t >= classes) {
    if (count && errors != nullptr) atomicAdd(errors, 1);
    t = t < 0 ? 0 : classes - 1;
  }
  return t;
}

}  // namespace renaissance::cuda::detail
