// Element-wise passes. Tensors of one layout run as one flat pass over rows·c_stride elements (padding stays zero
// because every op maps zeros to zero), 16-byte vectors when every pointer is 16-byte aligned, scalar tail.
// Copies between layouts and channel padding run per output element with 32-bit index arithmetic.
#include <kernels/cuda/elementwise.h>

#include <kernels/cuda/pointwise_common.cuh>

namespace renaissance::cuda {

namespace {

using detail::from_float;
using detail::kThreads;
using detail::kVec;
using detail::load_vec;
using detail::store_vec;
using detail::to_float;

// ---- flat maps: out = op(a, b, out_old) ---------------------------------------------------------------

struct ReluFwd {
  static constexpr int kInputs = 1;
  static constexpr bool kReadsOut = false;
  __device__ float operator()(float x, float, float) const { return x > 0.0f ? x : 0.0f; }
};
template <bool kAcc>
struct ReluBwd {
  static constexpr int kInputs = 2;
  static constexpr bool kReadsOut = kAcc;
  __device__ float operator()(float y, float dy, float dx) const {
    const float g = y > 0.0f ? dy : 0.0f;
    return kAcc ? dx + g : g;
  }
};
struct TanhFwd {
  static constexpr int kInputs = 1;
  static constexpr bool kReadsOut = false;
  __device__ float operator()(float x, float, float) const { return tanhf(x); }
};
template <bool kAcc>
struct TanhBwd {
  static constexpr int kInputs = 2;
  static constexpr bool kReadsOut = kAcc;
  __device__ float operator()(float y, float dy, float dx) const {
    const float g = dy * (1.0f - y * y);
    return kAcc ? dx + g : g;
  }
};
template <typename F>
struct ActFwd {
  static constexpr int kInputs = 1;
  static constexpr bool kReadsOut = false;
  __device__ float operator()(float x, float, float) const { return F::forward(x); }
};
template <typename F, bool kAcc>
struct ActBwd {
  static constexpr int kInputs = 2;
  static constexpr bool kReadsOut = kAcc;
  __device__ float operator()(float x, float dy, float dx) const {
    const float g = F::backward(x, dy);
    return kAcc ? dx + g : g;
  }
};
struct Add2 {
  static constexpr int kInputs = 2;
  static constexpr bool kReadsOut = false;
  __device__ float operator()(float a, float b, float) const { return a + b; }
};
struct AddInto {
  static constexpr int kInputs = 1;
  static constexpr bool kReadsOut = true;
  __device__ float operator()(float src, float, float dst) const { return dst + src; }
};

template <int V, typename T, typename Op>
__device__ __forceinline__ void map_at(const T* a, const T* b, T* out, std::int64_t i, Op op) {
  float va[V], vb[V] = {}, vo[V] = {};
  load_vec<V>(a + i, va);
  if constexpr (Op::kInputs > 1) load_vec<V>(b + i, vb);
  if constexpr (Op::kReadsOut) load_vec<V>(out + i, vo);
#pragma unroll
  for (int j = 0; j < V; ++j) vo[j] = op(va[j], vb[j], vo[j]);
  store_vec<V>(out + i, vo);
}

// a, b may alias out (in-place activations), hence no __restrict__.
template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads) flat_map_kernel(const T* a, const T* b, T* out, std::int64_t n, Op op) {
  const std::int64_t nvec = n / V;
  const std::int64_t tid = detail::thread_index();
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) map_at<V>(a, b, out, i * V, op);
  if constexpr (V > 1) {
    const std::int64_t t = nvec * V + tid;
    if (t < n) map_at<1>(a, b, out, t, op);
  }
}

template <typename T, typename Op>
void launch_flat_typed(cudaStream_t stream, const void* a, const void* b, void* out, std::int64_t n, Op op) {
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  T* po = static_cast<T*>(out);
  const bool vec = detail::aligned16(a) && (b == nullptr || detail::aligned16(b)) && detail::aligned16(out);
  if (vec) {
    constexpr int V = kVec<T>;
    flat_map_kernel<T, V><<<grid_for(n / V), kThreads, 0, stream>>>(pa, pb, po, n, op);
  } else {
    flat_map_kernel<T, 1><<<grid_for(n), kThreads, 0, stream>>>(pa, pb, po, n, op);
  }
  CUDA_CHECK_LAUNCH();
}

/// Checks that every tensor shares out's layout, then runs op over rows·c_stride elements.
template <typename Op>
void launch_flat(cudaStream_t stream, const char* what, const TensorRef& a, const TensorRef* b, const TensorRef& out,
                 Op op) {
  detail::check_float_tensor(a, what, "input");
  detail::check_float_tensor(out, what, "output");
  detail::check_same_layout(a, out, what, "input", "output");
  if (b != nullptr) {
    detail::check_float_tensor(*b, what, "second input");
    detail::check_same_layout(*b, out, what, "second input", "output");
  }
  const std::int64_t n = out.rows() * out.c_stride;
  const void* pb = b != nullptr ? b->ptr : nullptr;
  if (out.dtype == DType::F32)
    launch_flat_typed<float>(stream, a.ptr, pb, out.ptr, n, op);
  else
    launch_flat_typed<__half>(stream, a.ptr, pb, out.ptr, n, op);
}

// ---- copies between layouts -------------------------------------------------------------------------

// dst element (row, col) of a (rows, dst_c | dst_cs) tensor takes logical element row·dst_c + col of src, read
// through src's (src_c | src_cs) rows; padding columns are 0 (or untouched when accumulating).
template <typename Ti, typename To, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    logical_copy_kernel(const Ti* __restrict__ src, unsigned src_c, unsigned src_cs, To* __restrict__ dst,
                        unsigned dst_c, unsigned dst_cs, unsigned total) {
  for (std::int64_t e = detail::thread_index(); e < total; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned row = i / dst_cs, col = i - row * dst_cs;
    if (col >= dst_c) {
      if (!kAcc) dst[i] = from_float<To>(0.0f);
      continue;
    }
    const unsigned logical = row * dst_c + col;
    const unsigned srow = logical / src_c, scol = logical - srow * src_c;
    const float v = to_float(src[static_cast<std::size_t>(srow) * src_cs + scol]);
    dst[i] = from_float<To>(kAcc ? to_float(dst[i]) + v : v);
  }
}

template <typename Ti, typename To>
void launch_logical_copy(cudaStream_t stream, const TensorRef& src, const TensorRef& dst, bool accumulate) {
  const auto total = static_cast<unsigned>(dst.rows() * dst.c_stride);
  const auto* s = static_cast<const Ti*>(src.ptr);
  auto* d = static_cast<To*>(dst.ptr);
  const auto sc = static_cast<unsigned>(src.shape.c), scs = static_cast<unsigned>(src.c_stride);
  const auto dc = static_cast<unsigned>(dst.shape.c), dcs = static_cast<unsigned>(dst.c_stride);
  if (accumulate)
    logical_copy_kernel<Ti, To, true><<<grid_for(total), kThreads, 0, stream>>>(s, sc, scs, d, dc, dcs, total);
  else
    logical_copy_kernel<Ti, To, false><<<grid_for(total), kThreads, 0, stream>>>(s, sc, scs, d, dc, dcs, total);
  CUDA_CHECK_LAUNCH();
}

// dst[r, j] (=|+=) src[r, j] for j < ncopy; dst[r, ncopy:dst_cs] = 0 unless accumulating. In units of V elements
// (V divides src_cs, dst_cs and ncopy, pointers aligned).
template <typename T, int V, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    row_copy_kernel(const T* __restrict__ src, unsigned src_cs, T* __restrict__ dst, unsigned dst_cs, unsigned ncopy,
                    unsigned total_vec) {
  const unsigned row_vec = dst_cs / V;
  for (std::int64_t e = detail::thread_index(); e < total_vec; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned row = i / row_vec, col = (i - row * row_vec) * V;
    T* d = dst + static_cast<std::size_t>(row) * dst_cs + col;
    float v[V];
    if (col < ncopy) {
      load_vec<V>(src + static_cast<std::size_t>(row) * src_cs + col, v);
      if (kAcc) {
        float o[V];
        load_vec<V>(d, o);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = o[j] + v[j];
      }
    } else if constexpr (kAcc) {
      continue;  // padding columns keep their zeros
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = 0.0f;
    }
    store_vec<V>(d, v);
  }
}

template <typename T>
void launch_row_copy(cudaStream_t stream, const TensorRef& src, const TensorRef& dst, std::int64_t ncopy,
                     bool accumulate) {
  const auto* s = static_cast<const T*>(src.ptr);
  auto* d = static_cast<T*>(dst.ptr);
  const auto scs = static_cast<unsigned>(src.c_stride), dcs = static_cast<unsigned>(dst.c_stride);
  const auto nc = static_cast<unsigned>(ncopy);
  constexpr int W = kVec<T>;
  const bool vec = scs % W == 0 && dcs % W == 0 && nc % W == 0 && detail::aligned16(s) && detail::aligned16(d);
  const auto total = static_cast<unsigned>(dst.rows() * dst.c_stride);
  if (vec) {
    const unsigned tv = total / W;
    if (accumulate)
      row_copy_kernel<T, W, true><<<grid_for(tv), kThreads, 0, stream>>>(s, scs, d, dcs, nc, tv);
    else
      row_copy_kernel<T, W, false><<<grid_for(tv), kThreads, 0, stream>>>(s, scs, d, dcs, nc, tv);
  } else {
    if (accumulate)
      row_copy_kernel<T, 1, true><<<grid_for(total), kThreads, 0, stream>>>(s, scs, d, dcs, nc, total);
    else
      row_copy_kernel<T, 1, false><<<grid_for(total), kThreads, 0, stream>>>(s, scs, d, dcs, nc, total);
  }
  CUDA_CHECK_LAUNCH();
}

void check_channel_pad(const TensorRef& narrow, const TensorRef& wide, const char* what) {
  detail::check_float_tensor(narrow, what, "narrow tensor");
  detail::check_float_tensor(wide, what, "wide tensor");
  RN_CHECK(narrow.dtype == wide.dtype, "{}: dtypes differ ({} vs {})", what, dtype_name(narrow.dtype),
           dtype_name(wide.dtype));
  RN_CHECK(narrow.shape.n == wide.shape.n && narrow.shape.h == wide.shape.h && narrow.shape.w == wide.shape.w &&
               narrow.shape.c <= wide.shape.c,
           "{}: cannot pad {} to {}", what, narrow.shape.str(), wide.shape.str());
  detail::check_index32(narrow, what, "narrow tensor");
  detail::check_index32(wide, what, "wide tensor");
}

}  // namespace

void relu_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y) {
  launch_flat(stream, "relu_forward", x, nullptr, y, ReluFwd{});
}

void relu_backward(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& dx, bool accumulate) {
  if (accumulate)
    launch_flat(stream, "relu_backward", y, &dy, dx, ReluBwd<true>{});
  else
    launch_flat(stream, "relu_backward", y, &dy, dx, ReluBwd<false>{});
}

namespace {

template <int V, typename T>
__device__ __forceinline__ void relu_sum_at(const T* y, const T* dy, const T* a, T* dx, std::int64_t i) {
  float vy[V], vd[V], va[V], vo[V];
  load_vec<V>(y + i, vy);
  load_vec<V>(dy + i, vd);
  load_vec<V>(a + i, va);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float g = to_float(from_float<T>(vd[j] + va[j]));  // where ACCUMULATE stores the sum
    vo[j] = vy[j] > 0.0f ? g : 0.0f;
  }
  store_vec<V>(dx + i, vo);
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    relu_backward_sum_kernel(const T* y, const T* dy, const T* a, T* dx, std::int64_t n) {
  const std::int64_t nvec = n / V;
  const std::int64_t tid = detail::thread_index();
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) relu_sum_at<V>(y, dy, a, dx, i * V);
  if constexpr (V > 1) {
    const std::int64_t t = nvec * V + tid;
    if (t < n) relu_sum_at<1>(y, dy, a, dx, t);
  }
}

template <typename T>
void launch_relu_sum(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& a,
                     const TensorRef& dx, std::int64_t n) {
  const T* py = static_cast<const T*>(y.ptr);
  const T* pd = static_cast<const T*>(dy.ptr);
  const T* pa = static_cast<const T*>(a.ptr);
  T* po = static_cast<T*>(dx.ptr);
  if (detail::aligned16(py) && detail::aligned16(pd) && detail::aligned16(pa) && detail::aligned16(po)) {
    constexpr int V = kVec<T>;
    relu_backward_sum_kernel<T, V><<<grid_for(n / V), kThreads, 0, stream>>>(py, pd, pa, po, n);
  } else {
    relu_backward_sum_kernel<T, 1><<<grid_for(n), kThreads, 0, stream>>>(py, pd, pa, po, n);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void relu_backward_sum(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& addend,
                       const TensorRef& dx) {
  const char* what = "relu_backward_sum";
  for (const TensorRef* t : {&y, &dy, &addend}) {
    detail::check_float_tensor(*t, what, "input");
    detail::check_same_layout(*t, dx, what, "input", "output");
  }
  detail::check_float_tensor(dx, what, "output");
  const std::int64_t n = dx.rows() * dx.c_stride;
  if (dx.dtype == DType::F32)
    launch_relu_sum<float>(stream, y, dy, addend, dx, n);
  else
    launch_relu_sum<__half>(stream, y, dy, addend, dx, n);
}

void tanh_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y) {
  launch_flat(stream, "tanh_forward", x, nullptr, y, TanhFwd{});
}

void tanh_backward(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& dx, bool accumulate) {
  if (accumulate)
    launch_flat(stream, "tanh_backward", y, &dy, dx, TanhBwd<true>{});
  else
    launch_flat(stream, "tanh_backward", y, &dy, dx, TanhBwd<false>{});
}

void activation_forward(ops::Activation a, cudaStream_t stream, const TensorRef& x, const TensorRef& y) {
  ops::visit_activation(a, [&](auto f) {
    using F = decltype(f);
    launch_flat(stream, ops::activation_name(a), x, nullptr, y, ActFwd<F>{});
  });
}

void activation_backward(ops::Activation a, cudaStream_t stream, const TensorRef& x, const TensorRef& dy,
                         const TensorRef& dx, bool accumulate) {
  ops::visit_activation(a, [&](auto f) {
    using F = decltype(f);
    if (accumulate)
      launch_flat(stream, ops::activation_name(a), x, &dy, dx, ActBwd<F, true>{});
    else
      launch_flat(stream, ops::activation_name(a), x, &dy, dx, ActBwd<F, false>{});
  });
}

void add2_forward(cudaStream_t stream, const TensorRef& a, const TensorRef& b, const TensorRef& y) {
  launch_flat(stream, "add2_forward", a, &b, y, Add2{});
}

void tensor_copy(cudaStream_t stream, const TensorRef& src, const TensorRef& dst, bool accumulate) {
  const char* what = accumulate ? "accumulate" : "tensor_copy";
  detail::check_float_tensor(src, what, "source");
  detail::check_float_tensor(dst, what, "destination");
  RN_CHECK(src.shape.elems() == dst.shape.elems(), "{}: source {} and destination {} differ in element count", what,
           src.shape.str(), dst.shape.str());
  const bool same_rows = src.shape.c == dst.shape.c && src.c_stride == dst.c_stride && src.dtype == dst.dtype;
  if (same_rows && !accumulate) {
    CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, detail::storage_bytes(dst), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (same_rows) {
    TensorRef s = src;
    s.shape = dst.shape;  // same rows·c_stride storage: a flat add
    launch_flat(stream, what, s, nullptr, dst, AddInto{});
    return;
  }
  detail::check_index32(src, what, "source");
  detail::check_index32(dst, what, "destination");
  const bool sf = src.dtype == DType::F32, df = dst.dtype == DType::F32;
  if (sf && df)
    launch_logical_copy<float, float>(stream, src, dst, accumulate);
  else if (sf)
    launch_logical_copy<float, __half>(stream, src, dst, accumulate);
  else if (df)
    launch_logical_copy<__half, float>(stream, src, dst, accumulate);
  else
    launch_logical_copy<__half, __half>(stream, src, dst, accumulate);
}

void accumulate(cudaStream_t stream, const TensorRef& src, const TensorRef& dst) {
  tensor_copy(stream, src, dst, true);
}

void channel_pad_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y) {
  check_channel_pad(x, y, "channel_pad_forward");
  if (y.dtype == DType::F32)
    launch_row_copy<float>(stream, x, y, x.shape.c, false);
  else
    launch_row_copy<__half>(stream, x, y, x.shape.c, false);
}

void channel_pad_backward(cudaStream_t stream, const TensorRef& dy, const TensorRef& dx, bool accumulate) {
  check_channel_pad(dx, dy, "channel_pad_backward");
  if (dx.dtype == DType::F32)
    launch_row_copy<float>(stream, dy, dx, dx.shape.c, accumulate);
  else
    launch_row_copy<__half>(stream, dy, dx, dx.shape.c, accumulate);
}

}  // namespace renaissance::cuda
