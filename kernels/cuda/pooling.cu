// Pooling. One thread per output vector of V channels (16-byte accesses when the strides and pointers allow),
// 32-bit index arithmetic. Max-pool backward is a gather: each dx element walks the (at most ⌈k/s⌉²) windows
// covering it and adds the dy of those whose argmax points to it, in (oh, ow) order like the CPU's scatter: no
// atomics, bit-reproducible, and the same FP32 sums as the CPU. Built with -fmad=false.
#include <kernels/cuda/pooling.h>
#include <renaissance/ops/pool.h>

#include <kernels/cuda/pointwise_common.cuh>

#include <cmath>

namespace renaissance::cuda {

namespace {

using detail::kThreads;
using detail::load_vec;
using detail::store_vec;

struct PoolGeom {
  int h, w, oh, ow;  // input and output spatial sizes
  int kh, kw, sh, sw, ph, pw;
  int c;             // real channels
};

PoolGeom make_geom(const Shape& xs, const Shape& ys, const Pool2dParams& p) {
  return PoolGeom{static_cast<int>(xs.h), static_cast<int>(xs.w), static_cast<int>(ys.h), static_cast<int>(ys.w),
                  p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, static_cast<int>(xs.c)};
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    maxpool_forward_kernel(const T* __restrict__ x, unsigned xcs, T* __restrict__ y, unsigned ycs,
                           std::uint8_t* __restrict__ argmax, unsigned acs, PoolGeom g, unsigned total_vec) {
  const unsigned nv = ycs / V;
  for (std::int64_t e = detail::thread_index(); e < total_vec; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned orow = i / nv;  // (n·OH + oh)·OW + ow
    const int c0 = static_cast<int>((i - orow * nv) * V);
    const int ow = static_cast<int>(orow % g.ow);
    const unsigned t = orow / g.ow;
    const int oh = static_cast<int>(t % g.oh);
    const unsigned n = t / g.oh;
    float best[V];
    int arg[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      best[j] = -INFINITY;
      arg[j] = -1;
    }
    if (c0 < g.c) {
      for (int ky = 0; ky < g.kh; ++ky) {
        const int iy = oh * g.sh - g.ph + ky;
        if (iy < 0 || iy >= g.h) continue;
        for (int kx = 0; kx < g.kw; ++kx) {
          const int ix = ow * g.sw - g.pw + kx;
          if (ix < 0 || ix >= g.w) continue;
          float v[V];
          load_vec<V>(x + (static_cast<std::size_t>(n * g.h + iy) * g.w + ix) * xcs + c0, v);
          const int pos = ky * g.kw + kx;  // the position in the window: one byte
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const bool take = v[j] > best[j] || arg[j] < 0;  // the first in-range value always counts (NaN too)
            best[j] = take ? v[j] : best[j];
            arg[j] = take ? pos : arg[j];
          }
        }
      }
    }
    float out[V];
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = c0 + j < g.c ? best[j] : 0.0f;
    store_vec<V>(y + static_cast<std::size_t>(orow) * ycs + c0, out);
    std::uint8_t* a = argmax + static_cast<std::size_t>(orow) * acs;
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (static_cast<unsigned>(c0 + j) < acs) a[c0 + j] = static_cast<std::uint8_t>(c0 + j < g.c ? arg[j] : 0xFF);
  }
}

template <typename T, int V, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    maxpool_backward_kernel(const T* __restrict__ dy, unsigned dycs, const std::uint8_t* __restrict__ argmax,
                            unsigned acs, T* __restrict__ dx, unsigned dxcs, PoolGeom g, unsigned total_vec) {
  const unsigned nv = dxcs / V;
  for (std::int64_t e = detail::thread_index(); e < total_vec; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned irow = i / nv;  // (n·H + iy)·W + ix
    const int c0 = static_cast<int>((i - irow * nv) * V);
    T* d = dx + static_cast<std::size_t>(irow) * dxcs + c0;
    float acc[V];
    if constexpr (kAcc) {
      if (c0 >= g.c) continue;
      load_vec<V>(d, acc);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = 0.0f;
      if (c0 >= g.c) {
        store_vec<V>(d, acc);
        continue;
      }
    }
    const int ix = static_cast<int>(irow % g.w);
    const unsigned t = irow / g.w;
    const int iy = static_cast<int>(t % g.h);
    const unsigned n = t / g.h;
    const int ylo_num = iy + g.ph - g.kh + 1, xlo_num = ix + g.pw - g.kw + 1;
    const int oy_lo = ylo_num <= 0 ? 0 : (ylo_num + g.sh - 1) / g.sh;
    const int ox_lo = xlo_num <= 0 ? 0 : (xlo_num + g.sw - 1) / g.sw;
    const int oy_hi = min((iy + g.ph) / g.sh, g.oh - 1);
    const int ox_hi = min((ix + g.pw) / g.sw, g.ow - 1);
    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const std::size_t orow = (static_cast<std::size_t>(n) * g.oh + oy) * g.ow + ox;
        const int pos = (iy - (oy * g.sh - g.ph)) * g.kw + (ix - (ox * g.sw - g.pw));  // (iy, ix) in this window
        const std::uint8_t* a = argmax + orow * acs + c0;
        bool any = false;
        bool hit[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          hit[j] = c0 + j < g.c && a[j] == pos;
          any = any || hit[j];
        }
        if (!any) continue;
        float gv[V];
        load_vec<V>(dy + orow * dycs + c0, gv);
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (hit[j]) acc[j] += gv[j];
      }
    }
    if constexpr (!kAcc) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (c0 + j >= g.c) acc[j] = 0.0f;
    }
    store_vec<V>(d, acc);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    gap_forward_kernel(const T* __restrict__ x, unsigned xcs, T* __restrict__ y, unsigned ycs, unsigned hw, int c,
                       unsigned total_vec) {
  const unsigned nv = ycs / V;
  const auto count = static_cast<float>(hw);
  for (std::int64_t e = detail::thread_index(); e < total_vec; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned n = i / nv;
    const int c0 = static_cast<int>((i - n * nv) * V);
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    if (c0 < c) {
      const T* p = x + static_cast<std::size_t>(n) * hw * xcs + c0;
#pragma unroll 4
      for (unsigned r = 0; r < hw; ++r) {
        float v[V];
        load_vec<V>(p + static_cast<std::size_t>(r) * xcs, v);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += v[j];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = c0 + j < c ? acc[j] / count : 0.0f;
    }
    store_vec<V>(y + static_cast<std::size_t>(n) * ycs + c0, acc);
  }
}

template <typename T, int V, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    gap_backward_kernel(const T* __restrict__ dy, unsigned dycs, T* __restrict__ dx, unsigned dxcs, unsigned hw,
                        int c, unsigned total_vec) {
  const unsigned nv = dxcs / V;
  const auto count = static_cast<float>(hw);
  for (std::int64_t e = detail::thread_index(); e < total_vec; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned row = i / nv;
    const int c0 = static_cast<int>((i - row * nv) * V);
    T* d = dx + static_cast<std::size_t>(row) * dxcs + c0;
    if (kAcc && c0 >= c) continue;
    float g[V], o[V];
    if (c0 < c) {
      load_vec<V>(dy + static_cast<std::size_t>(row / hw) * dycs + c0, g);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) g[j] = 0.0f;
    }
    if constexpr (kAcc) load_vec<V>(d, o);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (c0 + j >= c)
        o[j] = kAcc ? o[j] : 0.0f;
      else
        o[j] = kAcc ? o[j] + g[j] / count : g[j] / count;
    }
    store_vec<V>(d, o);
  }
}

void check_argmax(const TensorRef& a, const Shape& ys, const char* what) {
  RN_CHECK(a.ptr != nullptr, "{}: argmax is null", what);
  RN_CHECK(a.dtype == DType::U8, "{}: argmax must be u8 (the position in the window), got {}", what,
           dtype_name(a.dtype));
  RN_CHECK(a.shape == ys, "{}: argmax shape {} differs from the output shape {}", what, a.shape.str(), ys.str());
  RN_CHECK(a.c_stride >= a.shape.c, "{}: argmax c_stride {} < C {}", what, a.c_stride, a.shape.c);
  detail::check_index32(a, what, "argmax");
}

unsigned u32(std::int64_t v) { return static_cast<unsigned>(v); }

}  // namespace

Shape maxpool2d_output_shape(const Shape& x, const Pool2dParams& p) {
  RN_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0,
           "maxpool2d: invalid kernel {}x{} / stride {}x{}", p.kernel_h, p.kernel_w, p.stride_h, p.stride_w);
  RN_CHECK(p.pad_h >= 0 && p.pad_w >= 0 && 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
           "maxpool2d: padding {}x{} must be at most half the kernel {}x{}", p.pad_h, p.pad_w, p.kernel_h, p.kernel_w);
  const std::int64_t hp = x.h + 2 * p.pad_h, wp = x.w + 2 * p.pad_w;
  RN_CHECK(hp >= p.kernel_h && wp >= p.kernel_w, "maxpool2d: kernel {}x{} larger than padded input {}x{}", p.kernel_h,
           p.kernel_w, hp, wp);
  RN_CHECK(p.kernel_h * p.kernel_w <= 255, "maxpool2d: a {}x{} window has more positions than a one-byte argmax holds",
           p.kernel_h, p.kernel_w);
  return Shape{x.n, ops::window_out(x.h, p.kernel_h, p.stride_h, p.pad_h),
               ops::window_out(x.w, p.kernel_w, p.stride_w, p.pad_w), x.c};
}

void maxpool2d_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y, const TensorRef& argmax,
                       const Pool2dParams& p) {
  const char* what = "maxpool2d_forward";
  detail::check_float_tensor(x, what, "x");
  detail::check_float_tensor(y, what, "y");
  const Shape expect = maxpool2d_output_shape(x.shape, p);
  RN_CHECK(y.shape == expect, "{}: output shape {} does not match input {} ({})", what, y.shape.str(), x.shape.str(),
           expect.str());
  RN_CHECK(x.dtype == y.dtype, "{}: x is {} but y is {}", what, dtype_name(x.dtype), dtype_name(y.dtype));
  check_argmax(argmax, y.shape, what);
  detail::check_index32(x, what, "x");
  detail::check_index32(y, what, "y");
  const PoolGeom g = make_geom(x.shape, y.shape, p);
  const bool vec = detail::vectorisable(x.dtype, x.c_stride, {x.ptr}) &&
                   detail::vectorisable(y.dtype, y.c_stride, {y.ptr});
  detail::dispatch_storage(x.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const unsigned total = u32(y.rows() * y.c_stride / V);
    maxpool_forward_kernel<T, V><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(x.ptr), u32(x.c_stride), static_cast<T*>(y.ptr), u32(y.c_stride),
        static_cast<std::uint8_t*>(argmax.ptr), u32(argmax.c_stride), g, total);
    CUDA_CHECK_LAUNCH();
  });
}

void maxpool2d_backward(cudaStream_t stream, const TensorRef& dy, const TensorRef& argmax, const TensorRef& dx,
                        const Pool2dParams& p, bool accumulate) {
  const char* what = "maxpool2d_backward";
  detail::check_float_tensor(dy, what, "dy");
  detail::check_float_tensor(dx, what, "dx");
  const Shape expect = maxpool2d_output_shape(dx.shape, p);
  RN_CHECK(dy.shape == expect, "{}: dy shape {} does not match dx {} ({})", what, dy.shape.str(), dx.shape.str(),
           expect.str());
  RN_CHECK(dx.dtype == dy.dtype, "{}: dy is {} but dx is {}", what, dtype_name(dy.dtype), dtype_name(dx.dtype));
  check_argmax(argmax, dy.shape, what);
  detail::check_index32(dy, what, "dy");
  detail::check_index32(dx, what, "dx");
  const PoolGeom g = make_geom(dx.shape, dy.shape, p);
  const bool vec = detail::vectorisable(dx.dtype, dx.c_stride, {dx.ptr}) &&
                   detail::vectorisable(dy.dtype, dy.c_stride, {dy.ptr});
  detail::dispatch_storage(dx.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const unsigned total = u32(dx.rows() * dx.c_stride / V);
    const T* pdy = static_cast<const T*>(dy.ptr);
    const auto* pa = static_cast<const std::uint8_t*>(argmax.ptr);
    T* pdx = static_cast<T*>(dx.ptr);
    if (accumulate)
      maxpool_backward_kernel<T, V, true><<<grid_for(total), kThreads, 0, stream>>>(
          pdy, u32(dy.c_stride), pa, u32(argmax.c_stride), pdx, u32(dx.c_stride), g, total);
    else
      maxpool_backward_kernel<T, V, false><<<grid_for(total), kThreads, 0, stream>>>(
          pdy, u32(dy.c_stride), pa, u32(argmax.c_stride), pdx, u32(dx.c_stride), g, total);
    CUDA_CHECK_LAUNCH();
  });
}

void global_avgpool_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y) {
  const char* what = "global_avgpool_forward";
  detail::check_float_tensor(x, what, "x");
  detail::check_float_tensor(y, what, "y");
  const Shape expect{x.shape.n, 1, 1, x.shape.c};
  RN_CHECK(y.shape == expect, "{}: output shape {} should be {}", what, y.shape.str(), expect.str());
  RN_CHECK(x.dtype == y.dtype, "{}: x is {} but y is {}", what, dtype_name(x.dtype), dtype_name(y.dtype));
  detail::check_index32(x, what, "x");
  const bool vec = detail::vectorisable(x.dtype, x.c_stride, {x.ptr}) &&
                   detail::vectorisable(y.dtype, y.c_stride, {y.ptr});
  detail::dispatch_storage(x.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const unsigned total = u32(y.rows() * y.c_stride / V);
    gap_forward_kernel<T, V><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(x.ptr), u32(x.c_stride), static_cast<T*>(y.ptr), u32(y.c_stride),
        u32(x.shape.h * x.shape.w), static_cast<int>(x.shape.c), total);
    CUDA_CHECK_LAUNCH();
  });
}

void global_avgpool_backward(cudaStream_t stream, const TensorRef& dy, const TensorRef& dx, bool accumulate) {
  const char* what = "global_avgpool_backward";
  detail::check_float_tensor(dy, what, "dy");
  detail::check_float_tensor(dx, what, "dx");
  const Shape expect{dx.shape.n, 1, 1, dx.shape.c};
  RN_CHECK(dy.shape == expect, "{}: dy shape {} should be {}", what, dy.shape.str(), expect.str());
  RN_CHECK(dx.dtype == dy.dtype, "{}: dy is {} but dx is {}", what, dtype_name(dy.dtype), dtype_name(dx.dtype));
  detail::check_index32(dx, what, "dx");
  const bool vec = detail::vectorisable(dx.dtype, dx.c_stride, {dx.ptr}) &&
                   detail::vectorisable(dy.dtype, dy.c_stride, {dy.ptr});
  detail::dispatch_storage(dx.dtype, vec, [&](auto type, auto width) {
    using T = typename decltype(type)::type;
    constexpr int V = decltype(width)::value;
    const unsigned total = u32(dx.rows() * dx.c_stride / V);
    const T* pdy = static_cast<const T*>(dy.ptr);
    T* pdx = static_cast<T*>(dx.ptr);
    const unsigned hw = u32(dx.shape.h * dx.shape.w);
    const int c = static_cast<int>(dx.shape.c);
    if (accumulate)
      gap_backward_kernel<T, V, true><<<grid_for(total), kThreads, 0, stream>>>(pdy, u32(dy.c_stride), pdx,
                                                                                   u32(dx.c_stride), hw, c, total);
    else
      gap_backward_kernel<T, V, false><<<grid_for(total), kThreads, 0, stream>>>(pdy, u32(dy.c_stride), pdx,
                                                                                    u32(dx.c_stride), hw, c, total);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace renaissance::cuda
