// Shared by the element-wise, BN, pooling, loss, metric, range and optimizer kernels (CUDA sources only):
// FP32/FP16 storage access with FP32 arithmetic, 16-byte vector loads/stores, warp reductions, and the host-side
// precondition checks of their launchers.
#pragma once

#include <kernels/cuda/common.h>

#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace renaissance::cuda::detail {

// ---- device: storage <-> FP32 ----------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return __half2float(v);
}

/// FP32 -> storage; FP16 rounds to nearest even (the same bits as kernels/cpu/half.h for every non-NaN value).
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return __float2half_rn(v);
}

/// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

/// V elements of T as they sit in memory: one register per 4 bytes (a 16-byte vector is 4 registers whether it
/// holds 4 floats or 8 halves), so unrolled loops keep several loads in flight without widening them first.
template <typename T, int V>
struct Packed;
template <typename T>
struct Packed<T, 1> {
  T v;
};
template <>
struct Packed<float, 4> {
  float4 v;
};
template <>
struct Packed<__half, 8> {
  uint4 v;
};

template <int V, typename T>
__device__ __forceinline__ Packed<T, V> load_packed(const T* p) {
  Packed<T, V> r;
  if constexpr (V == 1)
    r.v = *p;
  else if constexpr (std::is_same_v<T, float>)
    r.v = *reinterpret_cast<const float4*>(p);
  else
    r.v = *reinterpret_cast<const uint4*>(p);
  return r;
}

template <int V, typename T>
__device__ __forceinline__ void unpack(const Packed<T, V>& r, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = to_float(r.v);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(V == 4, "float vectors are float4");
    v[0] = r.v.x;
    v[1] = r.v.y;
    v[2] = r.v.z;
    v[3] = r.v.w;
  } else {
    static_assert(V == 8, "half vectors are 8 x half");
    const unsigned w[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      *reinterpret_cast<unsigned*>(&h) = w[i];
      const float2 f = __half22float2(h);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

/// v[0:V] = p[0:V] as FP32. V is 1 (any alignment) or kVec<T> (p 16-byte aligned).
template <int V, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[V]) {
  unpack<V>(load_packed<V>(p), v);
}

/// p[0:V] = v[0:V] in storage precision (alignment as load_vec).
template <int V, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    *p = from_float<T>(v[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(V == 4, "float vectors are float4");
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    static_assert(V == 8, "half vectors are 8 x half");
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const unsigned*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/// Global thread index and grid stride for grid-stride loops.
__device__ __forceinline__ std::int64_t thread_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

/// Warp-wide sums with an xor butterfly: IEEE addition is commutative, so every lane ends with the same
/// bits, and the order depends only on the lane count (deterministic).
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// ---- host: dispatch and launcher preconditions ---------------------------------------------------------

constexpr int kThreads = 256;

template <typename T>
struct TypeTag {
  using type = T;
};

/// Calls f(TypeTag<T>{}, std::integral_constant<int, V>{}) with T the storage type of `dtype` (F32 or F16) and
/// V = kVec<T> when `vectorised`, else 1.
template <typename F>
void dispatch_storage(DType dtype, bool vectorised, F&& f) {
  if (dtype == DType::F32) {
    if (vectorised)
      f(TypeTag<float>{}, std::integral_constant<int, kVec<float>>{});
    else
      f(TypeTag<float>{}, std::integral_constant<int, 1>{});
  } else {
    if (vectorised)
      f(TypeTag<__half>{}, std::integral_constant<int, kVec<__half>>{});
    else
      f(TypeTag<__half>{}, std::integral_constant<int, 1>{});
  }
}

/// 16-byte vectors are usable for rows of `c_stride` elements of `dtype` when every pointer is aligned.
inline bool vectorisable(DType dtype, std::int64_t c_stride, std::initializer_list<const void*> ptrs) {
  const std::int64_t w = dtype == DType::F32 ? 4 : 8;
  if (c_stride % w != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && (reinterpret_cast<std::uintptr_t>(p) & 15u) != 0) return false;
  return true;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

inline int next_pow2(std::int64_t v, int cap) {
  int p = 1;
  while (p < v && p < cap) p <<= 1;
  return p;
}

/// A float tensor argument: non-null, non-empty, F32 or F16, c_stride >= C.
inline void check_float_tensor(const TensorRef& t, const char* what, const char* name) {
  RN_CHECK(t.ptr != nullptr, "{}: {} is null", what, name);
  RN_CHECK(t.shape.valid(), "{}: {} has empty shape {}", what, name, t.shape.str());
  RN_CHECK(t.dtype == DType::F32 || t.dtype == DType::F16, "{}: {} must be f32 or f16 storage, got {}", what, name,
           dtype_name(t.dtype));
  RN_CHECK(t.c_stride >= t.shape.c, "{}: {} has c_stride {} < C {}", what, name, t.c_stride, t.shape.c);
}

/// Kernels that index rows·c_stride elements with 32-bit arithmetic.
inline void check_index32(const TensorRef& t, const char* what, const char* name) {
  RN_CHECK(t.rows() * t.c_stride < (std::int64_t{1} << 32), "{}: {} ({} rows x stride {}) exceeds 2^32 elements", what,
           name, t.rows(), t.c_stride);
}

inline void check_same_layout(const TensorRef& a, const TensorRef& b, const char* what, const char* na,
                              const char* nb) {
  RN_CHECK(a.shape == b.shape, "{}: {} shape {} differs from {} shape {}", what, na, a.shape.str(), nb, b.shape.str());
  RN_CHECK(a.dtype == b.dtype, "{}: {} is {} but {} is {}", what, na, dtype_name(a.dtype), nb, dtype_name(b.dtype));
  RN_CHECK(a.c_stride == b.c_stride, "{}: {} c_stride {} differs from {} c_stride {}", what, na, a.c_stride, nb,
           b.c_stride);
}

inline std::size_t storage_bytes(const TensorRef& t) {
  return static_cast<std::size_t>(t.rows() * t.c_stride) * dtype_size(t.dtype);
}

}  // namespace renaissance::cuda::detail
