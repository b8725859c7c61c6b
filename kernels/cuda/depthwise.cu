#include <kernels/cuda/depthwise.h>

#include <kernels/cuda/pointwise_common.cuh>

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace renaissance::cuda {

namespace {

using detail::load_vec;
using detail::store_vec;
using detail::to_float;

/// Shared memory for one block's weights (floats, [tap][multiplier][block channels]).
constexpr std::size_t kMaxSmem = 48u << 10;
/// Blocks launched at most (grid-stride over pixels beyond that): each block stages its weights once.
constexpr unsigned kMaxBlocks = 1024;
constexpr int kThreads = 256;

/// The kernels' view of a pass. "Output" is what the pass writes: y (forward) or dx (data gradient); its
/// channels `oc` are y.c (forward) or x.c (data gradient). Threads are (x: channel vectors, y: pixels).
struct DwParams {
  int ih, iw, c, oh, ow, m, kh, kw, sh, sw, ph, pw;
  long long x_cs, y_cs;
  int oc;      ///< channels of the pass's output
  int chunk;   ///< output channels per block column (blockDim.x · V)
  int pixels;  ///< rows of the pass's output (below 2^31: depthwise_unsupported)
};

template <int V>
__device__ __forceinline__ void fma_vec(float (&acc)[V], const float (&v)[V], const float* wt) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      const float4 q = *reinterpret_cast<const float4*>(wt + i);
      acc[i] = fmaf(v[i], q.x, acc[i]);
      acc[i + 1] = fmaf(v[i + 1], q.y, acc[i + 1]);
      acc[i + 2] = fmaf(v[i + 2], q.z, acc[i + 2]);
      acc[i + 3] = fmaf(v[i + 3], q.w, acc[i + 3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = fmaf(v[i], wt[i], acc[i]);
  }
}

/// y[n,oh,ow,o] = Σ_{kh,kw} x[n, oh·sh − ph + kh, ow·sw − pw + kw, o / m] · w[o][kh][kw]. V > 1 only with m == 1.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    dw_forward(DwParams p, const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y) {
  extern __shared__ float4 smem4[];
  float* ws = reinterpret_cast<float*>(smem4);  // [tap][chunk]
  const int taps = p.kh * p.kw;
  const int o0 = blockIdx.y * p.chunk;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  for (int i = tid; i < taps * p.chunk; i += nthreads) {
    const int tap = i / p.chunk, o = o0 + i % p.chunk;
    ws[i] = o < p.oc ? to_float(w[static_cast<long long>(o) * taps + tap]) : 0.0f;
  }
  __syncthreads();
  const int lo = threadIdx.x * V, o = o0 + lo;
  if (o >= p.oc) return;
  const int c = o / p.m;
  // 32-bit pixel arithmetic (depthwise_unsupported keeps the pixel counts below 2^31); 64-bit element offsets.
  for (int pix = blockIdx.x * blockDim.y + threadIdx.y; pix < p.pixels; pix += gridDim.x * blockDim.y) {
    const int ow = pix % p.ow, t = pix / p.ow;
    const int oh = t % p.oh, n = t / p.oh;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int kh = 0; kh < p.kh; ++kh) {
      const int ih = oh * p.sh - p.ph + kh;
      if (ih < 0 || ih >= p.ih) continue;
      const T* row = x + static_cast<long long>((n * p.ih + ih) * p.iw) * p.x_cs + c;
      for (int kw = 0; kw < p.kw; ++kw) {
        const int iw = ow * p.sw - p.pw + kw;
        if (iw < 0 || iw >= p.iw) continue;
        float v[V];
        load_vec<V>(row + static_cast<long long>(iw) * p.x_cs, v);
        fma_vec<V>(acc, v, ws + (kh * p.kw + kw) * p.chunk + lo);
      }
    }
    store_vec<V>(y + static_cast<long long>(pix) * p.y_cs + o, acc);
  }
}

/// dx[n,ih,iw,c] (+)= Σ_{kh,kw,j} dy[n, oh, ow, c·m + j] · w[c·m + j][kh][kw] over the (oh, ow) with
/// oh·sh − ph + kh = ih (and the same for w): a gather, one thread per dx vector, a fixed order.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    dw_backward_data(DwParams p, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                     bool accumulate) {
  extern __shared__ float4 smem4[];
  float* ws = reinterpret_cast<float*>(smem4);  // [tap][j][chunk]
  const int taps = p.kh * p.kw;
  const int c0 = blockIdx.y * p.chunk;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  for (int i = tid; i < taps * p.m * p.chunk; i += nthreads) {
    const int lo_ = i % p.chunk, tj = i / p.chunk, tap = tj / p.m, j = tj % p.m, c = c0 + lo_;
    ws[i] = c < p.oc ? to_float(w[(static_cast<long long>(c) * p.m + j) * taps + tap]) : 0.0f;
  }
  __syncthreads();
  const int lo = threadIdx.x * V, c = c0 + lo;
  if (c >= p.oc) return;
  const int m = V > 1 ? 1 : p.m;  // vectors only with one output per input channel
  for (int pix = blockIdx.x * blockDim.y + threadIdx.y; pix < p.pixels; pix += gridDim.x * blockDim.y) {
    const int iw = pix % p.iw, t = pix / p.iw;
    const int ih = t % p.ih, n = t / p.ih;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    // The taps that reach (ih, iw): kh ≡ ih + ph (mod sh), oh = (ih + ph − kh) / sh falling by one per step.
    const int kh0 = (ih + p.ph) % p.sh, oh0 = (ih + p.ph) / p.sh;
    const int kw0 = (iw + p.pw) % p.sw, ow0 = (iw + p.pw) / p.sw;
    for (int kh = kh0, oh = oh0; kh < p.kh && oh >= 0; kh += p.sh, --oh) {
      if (oh >= p.oh) continue;
      const T* row = dy + static_cast<long long>((n * p.oh + oh) * p.ow) * p.y_cs + static_cast<long long>(c) * m;
      for (int kw = kw0, ow = ow0; kw < p.kw && ow >= 0; kw += p.sw, --ow) {
        if (ow >= p.ow) continue;
        const T* src = row + static_cast<long long>(ow) * p.y_cs;
        const float* wt = ws + (kh * p.kw + kw) * m * p.chunk + lo;
        for (int j = 0; j < m; ++j) {
          float v[V];
          load_vec<V>(src + j, v);
          fma_vec<V>(acc, v, wt + j * p.chunk);
        }
      }
    }
    T* out = dx + static_cast<long long>(pix) * p.x_cs + c;
    if (accumulate) {
      float old[V];
      load_vec<V>(out, old);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = old[i] + acc[i];
    }
    store_vec<V>(out, acc);
  }
}

struct Launch {
  dim3 grid, block;
  std::size_t smem = 0;
  int chunk = 0;
};

/// Block shape: as many channel vectors as fit 32 lanes (a divisor of the count where one exists, so no lane
/// idles), the rest of the 256 threads over pixels; fewer lanes when the block's weights would not fit.
bool plan_launch(int oc_vectors, int vec, int taps, int mloop, long long pixels, Launch* l) {
  int bx = std::min(oc_vectors, 32);
  if (oc_vectors > 32) {
    for (int d = 32; d >= 8; --d)
      if (oc_vectors % d == 0) {
        bx = d;
        break;
      }
  }
  auto smem = [&](int b) { return static_cast<std::size_t>(taps) * mloop * b * vec * sizeof(float); };
  while (bx > 1 && smem(bx) > kMaxSmem) bx = (bx + 1) / 2;
  if (smem(bx) > kMaxSmem) return false;
  const int by = std::max(1, kThreads / bx);
  const long long gy = (oc_vectors + bx - 1) / bx;
  if (gy > 65535) return false;
  const long long want = (pixels + by - 1) / by;
  const long long cap = std::max<long long>(1, kMaxBlocks / gy);
  l->block = dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  l->grid = dim3(static_cast<unsigned>(std::min(want, cap)), static_cast<unsigned>(gy));
  l->smem = smem(bx);
  l->chunk = bx * vec;
  return true;
}

std::int64_t x_stride(const DepthwiseSpec& s) { return s.x_cs ? s.x_cs : s.x.c; }
std::int64_t y_stride(const DepthwiseSpec& s) { return s.y_cs ? s.y_cs : s.y.c; }

DwParams params_of(const DepthwiseSpec& s) {
  DwParams p{};
  p.ih = static_cast<int>(s.x.h), p.iw = static_cast<int>(s.x.w), p.c = static_cast<int>(s.x.c);
  p.oh = static_cast<int>(s.y.h), p.ow = static_cast<int>(s.y.w), p.m = static_cast<int>(s.y.c / s.x.c);
  p.kh = s.kernel_h, p.kw = s.kernel_w, p.sh = s.stride_h, p.sw = s.stride_w, p.ph = s.pad_h, p.pw = s.pad_w;
  p.x_cs = x_stride(s), p.y_cs = y_stride(s);
  return p;
}

/// 16-byte vectors over channels where channels, strides and the activations' pointers allow it (and one output per
/// input channel).
template <typename T>
int vector_width(const DepthwiseSpec& s, const void* a, const void* b) {
  constexpr int V = detail::kVec<T>;
  const bool ok = s.y.c == s.x.c && s.x.c % V == 0 && x_stride(s) % V == 0 && y_stride(s) % V == 0 &&
                  reinterpret_cast<std::uintptr_t>(a) % 16 == 0 && reinterpret_cast<std::uintptr_t>(b) % 16 == 0;
  return ok ? V : 1;
}

/// Plans and launches the pass with vectors of V channels; false (nothing launched) when no block of them fits the
/// shared memory (a kernel of more than ~1,500 taps for V = 8: the scalar kernel's check in depthwise_unsupported
/// passed, so the caller falls back to V = 1).
template <typename T, int V>
bool run(cudaStream_t stream, bool dgrad, const DepthwiseSpec& s, const void* in, const void* w, void* out,
         bool accumulate) {
  DwParams p = params_of(s);
  p.oc = static_cast<int>(dgrad ? s.x.c : s.y.c);
  p.pixels = static_cast<int>(dgrad ? s.x.n * s.x.h * s.x.w : s.y.n * s.y.h * s.y.w);
  Launch l;
  if (!plan_launch(p.oc / V, V, p.kh * p.kw, dgrad ? p.m : 1, p.pixels, &l)) return false;
  p.chunk = l.chunk;
  if (dgrad)
    dw_backward_data<T, V><<<l.grid, l.block, l.smem, stream>>>(p, static_cast<const T*>(in), static_cast<const T*>(w),
                                                                static_cast<T*>(out), accumulate);
  else
    dw_forward<T, V><<<l.grid, l.block, l.smem, stream>>>(p, static_cast<const T*>(in), static_cast<const T*>(w),
                                                          static_cast<T*>(out));
  CUDA_CHECK_LAUNCH();
  return true;
}

template <typename T>
void dispatch(cudaStream_t stream, bool dgrad, const DepthwiseSpec& s, const void* in, const void* w, void* out,
              bool accumulate) {
  if (vector_width<T>(s, in, out) > 1 && run<T, detail::kVec<T>>(stream, dgrad, s, in, w, out, accumulate)) return;
  const bool launched = run<T, 1>(stream, dgrad, s, in, w, out, accumulate);
  RN_CHECK(launched, "depthwise conv: no launch fits ({} -> {}, {}x{} kernel)", s.x.str(), s.y.str(), s.kernel_h,
           s.kernel_w);
}

void launch(cudaStream_t stream, bool dgrad, const DepthwiseSpec& s, const void* in, const void* w, void* out,
            bool accumulate) {
  const std::string why = depthwise_unsupported(s);
  RN_CHECK(why.empty(), "depthwise conv: {}", why);
  RN_CHECK(in && w && out, "depthwise conv: null tensor");
  if (s.dtype == DType::F16)
    dispatch<__half>(stream, dgrad, s, in, w, out, accumulate);
  else
    dispatch<float>(stream, dgrad, s, in, w, out, accumulate);
}

}  // namespace

std::string depthwise_unsupported(const DepthwiseSpec& s) {
  if (s.dtype != DType::F32 && s.dtype != DType::F16) return fmt::format("dtype {}", dtype_name(s.dtype));
  if (!s.x.valid() || !s.y.valid() || s.x.n != s.y.n) return fmt::format("shapes {} -> {}", s.x.str(), s.y.str());
  if (s.y.c % s.x.c != 0) return fmt::format("{} output channels are not a multiple of {} inputs", s.y.c, s.x.c);
  if (s.kernel_h < 1 || s.kernel_w < 1 || s.stride_h < 1 || s.stride_w < 1 || s.pad_h < 0 || s.pad_w < 0)
    return "bad kernel, stride or padding";
  if (x_stride(s) < s.x.c || y_stride(s) < s.y.c) return "row stride below the channels";
  for (const std::int64_t v : {s.x.n * s.x.h * s.x.w, s.y.n * s.y.h * s.y.w, s.x.c, s.y.c})
    if (v > INT_MAX / 2) return fmt::format("{} pixels or channels: more than the kernels' 32-bit indices", v);
  Launch l;
  const long long m = s.y.c / s.x.c;
  if (!plan_launch(static_cast<int>(s.x.c), 1, s.kernel_h * s.kernel_w, static_cast<int>(m), 1, &l) ||
      !plan_launch(static_cast<int>(s.y.c), 1, s.kernel_h * s.kernel_w, 1, 1, &l))
    return fmt::format("the weights of a {}x{} kernel with multiplier {} do not fit shared memory", s.kernel_h,
                       s.kernel_w, m);
  return {};
}

void depthwise_forward(cudaStream_t stream, const DepthwiseSpec& s, const void* x, const void* w, void* y) {
  launch(stream, false, s, x, w, y, false);
}

void depthwise_backward_data(cudaStream_t stream, const DepthwiseSpec& s, const void* dy, const void* w, void* dx,
                             bool accumulate) {
  launch(stream, true, s, dy, w, dx, accumulate);
}

}  // namespace renaissance::cuda
