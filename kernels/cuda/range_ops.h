// Region-wide RANGE operations on the GPU (DESIGN §6): one grid-stride, 16-byte-vector pass per arena range,
// mirroring kernels/cpu/range_ops.h and the RANGE entries of lib/renaissance/runtime/cpu_ops.cpp. Everything a step
// decides (loss scale, overflow flag, decay, momentum) is read from device memory, and no launcher synchronises
// or reads device memory on the host, so every launcher is safe inside a CUDA graph capture.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::cuda {

/// p[0:bytes] = 0 (cudaMemsetAsync).
void range_clear(cudaStream_t stream, void* p, std::size_t bytes);
/// dst[0:bytes] = src[0:bytes] (non-overlapping device ranges).
void range_copy(cudaStream_t stream, void* dst, const void* src, std::size_t bytes);

/// dst[i] = half(src[i]) (IEEE round-to-nearest-even: kernels/cpu/half.h's bits for every non-NaN input).
void range_cast_f32_to_f16(cudaStream_t stream, const float* src, std::uint16_t* dst, std::int64_t n);
/// dst[i] = float(src[i]) (exact).
void range_cast_f16_to_f32(cudaStream_t stream, const std::uint16_t* src, float* dst, std::int64_t n);

/// An FP32 range of the arena.
struct FloatRange {
  const float* ptr = nullptr;
  std::int64_t n = 0;
};
/// The NAN_CHECK op: *flag = 0 (cudaMemsetAsync), then *flag = 1 when any element of any range is NaN or ±inf
/// (exponent bits all ones). `ranges` is a host array of device ranges (read at launch/capture time). One kernel per range; writers only ever store 1, so the result does not depend on order.
void range_check_finite(cudaStream_t stream, const FloatRange* ranges, std::size_t count, std::int32_t* flag);
/// Sets *flag = 1 when p[0:n] has a NaN or ±inf; leaves it alone otherwise (several ranges can share a flag).
void range_mark_nonfinite(cudaStream_t stream, const float* p, std::int64_t n, std::int32_t* flag);
void range_mark_nonfinite_f16(cudaStream_t stream, const std::uint16_t* p, std::int64_t n, std::int32_t* flag);

/// GRAD_SCALE: g[i] *= 1/loss_scale[0] (the reciprocal taken in FP32 first, as the CPU), unless *skip != 0.
void range_grad_scale(cudaStream_t stream, float* g, std::int64_t n, const float* loss_scale,
                      const std::int32_t* skip);

/// Layout of the loss-scale state (plan::LossScaleSlot): {scale, clean steps, growth interval, growth factor}.
constexpr int kLossScaleValue = 0, kLossScaleCleanSteps = 1, kLossScaleInterval = 2, kLossScaleFactor = 3;
/// LOSS_SCALE_UPDATE (one thread): on overflow (*overflow != 0) scale = max(1, scale/factor), clean = 0 (-1 when the
/// scale was already 1: the host's mark of a diverged run); otherwise clean = max(clean, 0) + 1 and, once
/// clean >= interval, scale = min(2^24, scale·factor), clean = 0.
void loss_scale_update(cudaStream_t stream, float* state, const std::int32_t* overflow);

/// EMA_UPDATE: e[i] = d·e[i] + (1 − d)·w[i] with d = *decay, unless *skip != 0 (skip may be null).
void range_ema_update(cudaStream_t stream, float* e, const float* w, std::int64_t n, const float* decay,
                      const std::int32_t* skip);

/// BN_RUNNING_UPDATE: prev[i] = (1 − m)·prev[i] + m·next[i] with m = *momentum, unless *skip != 0 (the step's
/// non-finite flag; skip may be null).
void range_bn_running_update(cudaStream_t stream, float* prev, const float* next, std::int64_t n, const float* momentum,
                             const std::int32_t* skip);

/// METRIC_ACCUMULATE: dst[i] += src[i] (e.g. the 4 result floats).
void range_metric_accumulate(cudaStream_t stream, float* dst, const float* src, std::int64_t n);

}  // namespace renaissance::cuda
