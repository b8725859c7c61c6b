// RANGE ops: each a single memory-bound pass, 16-byte vectors when the pointers allow (arena ranges are 256-byte
// aligned, so the scalar paths only serve odd callers and the < 16-byte tails). Device scalars are read once per
// thread; a set skip flag makes the whole grid return before touching memory. Built with -fmad=false, so each
// formula is evaluated as kernels/cpu/range_ops.cpp writes it.
#include <kernels/cuda/range_ops.h>

#include <kernels/cuda/pointwise_common.cuh>

namespace renaissance::cuda {

namespace {

using detail::kThreads;

// ---- bytes -------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    copy16_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, std::int64_t nvec,
                  unsigned char* __restrict__ dst_tail, const unsigned char* __restrict__ src_tail, int tail) {
  const std::int64_t tid = detail::thread_index();
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) dst[i] = src[i];
  if (tid < tail) dst_tail[tid] = src_tail[tid];
}

// ---- casts ---------------------------------------------------------------------------------------------------

template <int V>
__global__ void __launch_bounds__(kThreads)
    cast_f32_f16_kernel(const float* __restrict__ src, __half* __restrict__ dst, std::int64_t n) {
  const std::int64_t nvec = n / V, tid = detail::thread_index();
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) {
    float v[V];
    if constexpr (V == 8) {
      const float4 a = reinterpret_cast<const float4*>(src)[2 * i];
      const float4 b = reinterpret_cast<const float4*>(src)[2 * i + 1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      detail::store_vec<8>(dst + i * 8, v);
    } else {
      dst[i] = __float2half_rn(src[i]);
    }
  }
  if constexpr (V > 1) {
    const std::int64_t t = nvec * V + tid;
    if (t < n) dst[t] = __float2half_rn(src[t]);
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads)
    cast_f16_f32_kernel(const __half* __restrict__ src, float* __restrict__ dst, std::int64_t n) {
  const std::int64_t nvec = n / V, tid = detail::thread_index();
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) {
    if constexpr (V == 8) {
      float v[8];
      detail::load_vec<8>(src + i * 8, v);
      reinterpret_cast<float4*>(dst)[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      dst[i] = __half2float(src[i]);
    }
  }
  if constexpr (V > 1) {
    const std::int64_t t = nvec * V + tid;
    if (t < n) dst[t] = __half2float(src[t]);
  }
}

// ---- NaN/inf checks (bit tests: exponent all ones) --------------------------------------------------------

__device__ __forceinline__ bool bad_f32(unsigned u) { return (u & 0x7f800000u) == 0x7f800000u; }
__device__ __forceinline__ bool bad_f16x2(unsigned u) {
  return (u & 0x7c00u) == 0x7c00u || (u & 0x7c000000u) == 0x7c000000u;
}

template <int V>
__global__ void __launch_bounds__(kThreads)
    mark_nonfinite_f32_kernel(const unsigned* __restrict__ p, std::int64_t n, std::int32_t* flag) {
  const std::int64_t nvec = n / V, tid = detail::thread_index();
  bool bad = false;
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) {
    if constexpr (V == 4) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      bad |= bad_f32(u.x) | bad_f32(u.y) | bad_f32(u.z) | bad_f32(u.w);
    } else {
      bad |= bad_f32(p[i]);
    }
  }
  if (V > 1 && nvec * V + tid < n) bad |= bad_f32(p[nvec * V + tid]);
  if (bad) *flag = 1;
}

__global__ void __launch_bounds__(kThreads)
    mark_nonfinite_f16_kernel(const std::uint16_t* __restrict__ p, std::int64_t n, bool vec, std::int32_t* flag) {
  const std::int64_t tid = detail::thread_index();
  bool bad = false;
  std::int64_t done = 0;
  if (vec) {  // 8 halves per 16-byte load
    const std::int64_t nvec = n / 8;
    for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      bad |= bad_f16x2(u.x) | bad_f16x2(u.y) | bad_f16x2(u.z) | bad_f16x2(u.w);
    }
    done = nvec * 8;
  }
  for (std::int64_t i = done + tid; i < n; i += detail::grid_stride()) bad |= (p[i] & 0x7c00u) == 0x7c00u;
  if (bad) *flag = 1;
}

// ---- float maps: a[i] = op(a[i], b[i]) -------------------------------------------------------------------------

struct GradScale {
  const float* loss_scale;
  float s = 0.0f;
  __device__ void load() { s = 1.0f / *loss_scale; }
  __device__ float operator()(float g, float) const { return g * s; }
};
struct Ema {
  const float* decay;
  float keep = 0.0f, take = 0.0f;
  __device__ void load() {
    keep = *decay;
    take = 1.0f - keep;
  }
  __device__ float operator()(float e, float w) const { return keep * e + take * w; }
};
struct BnRunning {
  const float* momentum;
  float m = 0.0f, keep = 0.0f;
  __device__ void load() {
    m = *momentum;
    keep = 1.0f - m;
  }
  __device__ float operator()(float prev, float next) const { return keep * prev + m * next; }
};
struct AddInto {
  __device__ void load() {}
  __device__ float operator()(float dst, float src) const { return dst + src; }
};

template <int V, typename Op>
__global__ void __launch_bounds__(kThreads)
    float_map_kernel(float* a, const float* b, std::int64_t n, Op op, const std::int32_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  op.load();
  const std::int64_t nvec = n / V, tid = detail::thread_index();
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) {
    if constexpr (V == 4) {
      float4 x = reinterpret_cast<float4*>(a)[i];
      float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (b != nullptr) y = reinterpret_cast<const float4*>(b)[i];
      x.x = op(x.x, y.x);
      x.y = op(x.y, y.y);
      x.z = op(x.z, y.z);
      x.w = op(x.w, y.w);
      reinterpret_cast<float4*>(a)[i] = x;
    } else {
      a[i] = op(a[i], b != nullptr ? b[i] : 0.0f);
    }
  }
  if constexpr (V > 1) {
    const std::int64_t t = nvec * V + tid;
    if (t < n) a[t] = op(a[t], b != nullptr ? b[t] : 0.0f);
  }
}

template <typename Op>
void launch_float_map(cudaStream_t stream, float* a, const float* b, std::int64_t n, Op op, const std::int32_t* skip,
                      const char* what) {
  RN_CHECK(n >= 0 && (n == 0 || a != nullptr), "{}: {} elements at a null pointer", what, n);
  if (n == 0) return;
  if (detail::aligned16(a) && (b == nullptr || detail::aligned16(b)))
    float_map_kernel<4><<<grid_for(n / 4), kThreads, 0, stream>>>(a, b, n, op, skip);
  else
    float_map_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(a, b, n, op, skip);
  CUDA_CHECK_LAUNCH();
}

__global__ void loss_scale_update_kernel(float* s, const std::int32_t* overflow) {
  if (*overflow != 0) {
    const bool at_floor = s[kLossScaleValue] <= 1.0f;
    const float down = s[kLossScaleValue] / s[kLossScaleFactor];
    s[kLossScaleValue] = 1.0f < down ? down : 1.0f;  // std::max(1.0f, down)
    s[kLossScaleCleanSteps] = at_floor ? -1.0f : 0.0f;
  } else {
    const float clean = s[kLossScaleCleanSteps];
    s[kLossScaleCleanSteps] = (clean > 0.0f ? clean : 0.0f) + 1.0f;
    if (s[kLossScaleCleanSteps] >= s[kLossScaleInterval]) {
      const float up = s[kLossScaleValue] * s[kLossScaleFactor];
      constexpr float kMax = 65536.0f * 256.0f;
      s[kLossScaleValue] = up < kMax ? up : kMax;  // std::min(kMax, up)
      s[kLossScaleCleanSteps] = 0.0f;
    }
  }
}

void check_range(const void* p, std::int64_t n, const char* what) {
  RN_CHECK(n >= 0 && (n == 0 || p != nullptr), "{}: {} elements at a null pointer", what, n);
}

}  // namespace

void range_clear(cudaStream_t stream, void* p, std::size_t bytes) {
  RN_CHECK(bytes == 0 || p != nullptr, "range_clear: {} bytes at a null pointer", bytes);
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

void range_copy(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  RN_CHECK(bytes == 0 || (dst != nullptr && src != nullptr), "range_copy: {} bytes with a null pointer", bytes);
  if (bytes == 0) return;
  if (!detail::aligned16(dst) || !detail::aligned16(src)) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const auto nvec = static_cast<std::int64_t>(bytes / 16);
  const int tail = static_cast<int>(bytes % 16);
  copy16_kernel<<<grid_for(nvec), kThreads, 0, stream>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(src), nvec, static_cast<unsigned char*>(dst) + nvec * 16,
      static_cast<const unsigned char*>(src) + nvec * 16, tail);
  CUDA_CHECK_LAUNCH();
}

void range_cast_f32_to_f16(cudaStream_t stream, const float* src, std::uint16_t* dst, std::int64_t n) {
  check_range(src, n, "range_cast_f32_to_f16");
  check_range(dst, n, "range_cast_f32_to_f16");
  if (n == 0) return;
  auto* d = reinterpret_cast<__half*>(dst);
  if (detail::aligned16(src) && detail::aligned16(dst))
    cast_f32_f16_kernel<8><<<grid_for(n / 8), kThreads, 0, stream>>>(src, d, n);
  else
    cast_f32_f16_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(src, d, n);
  CUDA_CHECK_LAUNCH();
}

void range_cast_f16_to_f32(cudaStream_t stream, const std::uint16_t* src, float* dst, std::int64_t n) {
  check_range(src, n, "range_cast_f16_to_f32");
  check_range(dst, n, "range_cast_f16_to_f32");
  if (n == 0) return;
  const auto* s = reinterpret_cast<const __half*>(src);
  if (detail::aligned16(src) && detail::aligned16(dst))
    cast_f16_f32_kernel<8><<<grid_for(n / 8), kThreads, 0, stream>>>(s, dst, n);
  else
    cast_f16_f32_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(s, dst, n);
  CUDA_CHECK_LAUNCH();
}

void range_mark_nonfinite(cudaStream_t stream, const float* p, std::int64_t n, std::int32_t* flag) {
  check_range(p, n, "range_mark_nonfinite");
  RN_CHECK(flag != nullptr, "range_mark_nonfinite: flag is null");
  if (n == 0) return;
  const auto* u = reinterpret_cast<const unsigned*>(p);
  if (detail::aligned16(p))
    mark_nonfinite_f32_kernel<4><<<grid_for(n / 4), kThreads, 0, stream>>>(u, n, flag);
  else
    mark_nonfinite_f32_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(u, n, flag);
  CUDA_CHECK_LAUNCH();
}

void range_mark_nonfinite_f16(cudaStream_t stream, const std::uint16_t* p, std::int64_t n, std::int32_t* flag) {
  check_range(p, n, "range_mark_nonfinite_f16");
  RN_CHECK(flag != nullptr, "range_mark_nonfinite_f16: flag is null");
  if (n == 0) return;
  const bool vec = detail::aligned16(p);
  mark_nonfinite_f16_kernel<<<grid_for(vec ? n / 8 : n), kThreads, 0, stream>>>(p, n, vec, flag);
  CUDA_CHECK_LAUNCH();
}

void range_check_finite(cudaStream_t stream, const FloatRange* ranges, std::size_t count, std::int32_t* flag) {
  RN_CHECK(flag != nullptr, "range_check_finite: flag is null");
  RN_CHECK(count == 0 || ranges != nullptr, "range_check_finite: {} ranges but the list is null", count);
  CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(std::int32_t), stream));
  for (std::size_t i = 0; i < count; ++i) range_mark_nonfinite(stream, ranges[i].ptr, ranges[i].n, flag);
}

void range_grad_scale(cudaStream_t stream, float* g, std::int64_t n, const float* loss_scale,
                      const std::int32_t* skip) {
  RN_CHECK(loss_scale != nullptr, "range_grad_scale: loss_scale is null");
  launch_float_map(stream, g, nullptr, n, GradScale{loss_scale}, skip, "range_grad_scale");
}

void loss_scale_update(cudaStream_t stream, float* state, const std::int32_t* overflow) {
  RN_CHECK(state != nullptr && overflow != nullptr, "loss_scale_update: state or overflow flag is null");
  loss_scale_update_kernel<<<1, 1, 0, stream>>>(state, overflow);
  CUDA_CHECK_LAUNCH();
}

void range_ema_update(cudaStream_t stream, float* e, const float* w, std::int64_t n, const float* decay,
                      const std::int32_t* skip) {
  RN_CHECK(decay != nullptr && (n == 0 || w != nullptr), "range_ema_update: decay or weights null");
  launch_float_map(stream, e, w, n, Ema{decay}, skip, "range_ema_update");
}

void range_bn_running_update(cudaStream_t stream, float* prev, const float* next, std::int64_t n,
                             const float* momentum, const std::int32_t* skip) {
  RN_CHECK(momentum != nullptr && (n == 0 || next != nullptr), "range_bn_running_update: momentum or batch stats null");
  launch_float_map(stream, prev, next, n, BnRunning{momentum}, skip, "range_bn_running_update");
}

void range_metric_accumulate(cudaStream_t stream, float* dst, const float* src, std::int64_t n) {
  RN_CHECK(n == 0 || src != nullptr, "range_metric_accumulate: source is null");
  launch_float_map(stream, dst, src, n, AddInto{}, nullptr, "range_metric_accumulate");
}

}  // namespace renaissance::cuda
