// Region-wide operations over flat arrays: one pass each, mirroring the GPU RANGE kernels that update a
// whole arena range (DESIGN §6). All run on the thread pool; results do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

namespace renaissance::cpu {

/// p[0:bytes] = 0.
void range_clear(void* p, std::size_t bytes);
/// dst[0:bytes] = src[0:bytes] (the ranges must not overlap).
void range_copy(void* dst, const void* src, std::size_t bytes);
/// dst[i] = half(src[i]), IEEE round-to-nearest-even (kernels/cpu/half.h; with F16C instructions when the
/// CPU has them: the same bits, except that signalling NaNs come out quiet).
void range_cast_f32_to_f16(const float* src, std::uint16_t* dst, std::int64_t n);
/// dst[i] = float(src[i]), exact (F16C likewise).
void range_cast_f16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n);
/// Sets *flag = 1 when any p[i] is NaN or ±inf (leaves it alone otherwise, so several ranges can share
/// one flag); returns whether this range had one. Bit tests, so it works under -ffast-math too.
bool range_check_finite(const float* p, std::int64_t n, std::int32_t* flag);
bool range_check_finite_f16(const std::uint16_t* p, std::int64_t n, std::int32_t* flag);
/// g[i] *= s (gradient unscaling by 1/loss_scale).
void range_scale(float* g, std::int64_t n, float s);
/// e[i] = d·e[i] + (1 − d)·w[i] (exponential moving average of the weights, decay d).
void range_ema_update(float* e, const float* w, std::int64_t n, float decay);

}  // namespace renaissance::cpu
