// See augment.h. Built with -fmad=false (pointwise_sources.cmake's rule) and explicit _rn intrinsics besides: the
// normalisation is two roundings as on the CPU, and the resampling tables are io::resample_table's double
// arithmetic one IEEE operation at a time (-ffp-contract=off on the host), so the integer taps are the host's.
#include <kernels/cuda/augment.h>
#include <kernels/cuda/common.h>

#include <cuda_fp16.h>

namespace renaissance::cuda {

namespace {

struct Consts {
  float scale[16], bias[16];
};

/// Writes pixel i's out_c channels from the c bytes at src (nullptr: a zero pixel).
template <bool F16>
__device__ __forceinline__ void put_pixel(void* out, std::int64_t i, int out_c, int c, const std::uint8_t* src,
                                          const Consts& k) {
  if (F16) {
    __half* o = static_cast<__half*>(out) + i * out_c;
    if (out_c == 8) {
      __align__(16) __half v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const float px = (q < c && src) ? static_cast<float>(src[q]) : 0.0f;
        v[q] = q < c ? __float2half_rn(__fadd_rn(__fmul_rn(px, k.scale[q]), k.bias[q])) : __float2half_rn(0.0f);
      }
      *reinterpret_cast<uint4*>(o) = *reinterpret_cast<const uint4*>(v);
    } else {
      for (int q = 0; q < out_c; ++q) {
        const float px = (q < c && src) ? static_cast<float>(src[q]) : 0.0f;
        o[q] = q < c ? __float2half_rn(__fadd_rn(__fmul_rn(px, k.scale[q]), k.bias[q])) : __float2half_rn(0.0f);
      }
    }
  } else {
    float* o = static_cast<float*>(out) + i * out_c;
    for (int q = 0; q < out_c; ++q) {
      const float px = (q < c && src) ? static_cast<float>(src[q]) : 0.0f;
      o[q] = q < c ? __fadd_rn(__fmul_rn(px, k.scale[q]), k.bias[q]) : 0.0f;
    }
  }
}

// Shift and flip of whole images: one thread a pixel.
template <bool F16>
__global__ void gather_kernel(const std::uint8_t* __restrict__ images, int h, int w, int c,
                              const std::int32_t* __restrict__ labels, const std::int32_t* __restrict__ table,
                              const std::int32_t* __restrict__ cursor, std::int64_t batch, std::int64_t count, Consts k,
                              void* __restrict__ out, int out_c, std::int32_t* __restrict__ out_labels) {
  const std::int64_t hw = static_cast<std::int64_t>(h) * w;
  const std::int64_t pixels = count * hw;
  const std::int64_t first = static_cast<std::int64_t>(*cursor) * batch;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < pixels;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t n = i / hw;
    const int rem = static_cast<int>(i - n * hw);
    const int y = rem / w, x = rem - (rem / w) * w;
    const std::int32_t* e = table + kGatherTableInts * (first + n);
    const int idx = e[0], dy = e[9], dx = e[10], flip = e[11];
    const int sy = y + dy, sx = (flip ? w - 1 - x : x) + dx;
    const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
    if (rem == 0) out_labels[n] = labels[idx];
    put_pixel<F16>(out, i, out_c, c,
                   inside ? images + (static_cast<std::int64_t>(idx) * hw + sy * w + sx) * c : nullptr, k);
  }
}

/// io::resample_table's entry `xx` for in_size -> out_size (Pillow's precompute_coeffs + normalize_coeffs_8bpc):
/// bounds into b[0..1], the 22-bit taps into kk[0..xmax). Every double operation as on the host.
__device__ void table_entry(int in_size, int out_size, int xx, int* b, int* kk) {
  const double scale = __ddiv_rn(static_cast<double>(in_size), static_cast<double>(out_size));
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = filterscale;
  const double ss = __ddiv_rn(1.0, filterscale);
  const double center = __dmul_rn(__dadd_rn(static_cast<double>(xx), 0.5), scale);
  int xmin = static_cast<int>(__dadd_rn(__dsub_rn(center, support), 0.5));
  if (xmin < 0) xmin = 0;
  int xmax = static_cast<int>(__dadd_rn(__dadd_rn(center, support), 0.5));
  if (xmax > in_size) xmax = in_size;
  xmax -= xmin;
  double ww = 0.0;
  double wv[kMaxTaps];
  for (int x = 0; x < xmax && x < kMaxTaps; ++x) {
    double a = __dmul_rn(__dadd_rn(__dsub_rn(static_cast<double>(x + xmin), center), 0.5), ss);
    if (a < 0.0) a = -a;
    const double wgt = a < 1.0 ? __dsub_rn(1.0, a) : 0.0;
    wv[x] = wgt;
    ww = __dadd_rn(ww, wgt);
  }
  for (int x = 0; x < xmax && x < kMaxTaps; ++x) {
    const double v = ww != 0.0 ? __ddiv_rn(wv[x], ww) : wv[x];
    kk[x] =
        static_cast<int>(v < 0 ? __dadd_rn(-0.5, __dmul_rn(v, 4194304.0)) : __dadd_rn(0.5, __dmul_rn(v, 4194304.0)));
  }
  b[0] = xmin;
  b[1] = xmax;
}

__device__ __forceinline__ std::uint8_t clip8(int v) {
  // io/image.cpp's clip8.
  if (v >= (1 << 30)) return 255;
  if (v <= 0) return 0;
  return static_cast<std::uint8_t>(v >> 22);
}

// The general render (io::render_sample): one block a sample.
template <bool F16>
__global__ void render_kernel(const std::uint8_t* __restrict__ images, int h, int w, int c,
                              const std::int32_t* __restrict__ labels, const std::int32_t* __restrict__ table,
                              const std::int32_t* __restrict__ cursor, std::int64_t batch, int out_h, int out_w,
                              int taps, std::uint8_t* __restrict__ scratch, std::int64_t scratch_stride, Consts k,
                              void* __restrict__ out, int out_c, std::int32_t* __restrict__ out_labels,
                              const std::int64_t* __restrict__ sources) {
  extern __shared__ int smem[];
  const int n = blockIdx.x;
  const std::int64_t cur = cursor ? static_cast<std::int64_t>(*cursor) : 0;
  const std::int32_t* e = table + kGatherTableInts * (cur * batch + n);
  const int idx = e[0], box_y = e[1], box_x = e[2], box_h = e[3], box_w = e[4], virt_h = e[5], virt_w = e[6];
  const int top = e[7], left = e[8], dy = e[9], dx = e[10], flip = e[11];
  if (threadIdx.x == 0) out_labels[n] = labels[idx];
  const int vy0 = max(top, 0), vy1 = min(top + out_h, virt_h);
  const int vx0 = max(left, 0), vx1 = min(left + out_w, virt_w);
  const int ncols = max(vx1 - vx0, 0);
  const bool need_h = virt_w != box_w, need_v = virt_h != box_h;
  const int stride = taps + 2;        // per table entry: xmin, xmax, taps
  int* xtab = smem;                   // [out_w][stride], entry xx - vx0
  int* ytab = smem + out_w * stride;  // [out_h][stride], entry yy - vy0
  if (need_h)
    for (int xx = vx0 + threadIdx.x; xx < vx1; xx += blockDim.x) {
      int* t = xtab + (xx - vx0) * stride;
      table_entry(box_w, virt_w, xx, t, t + 2);
    }
  if (need_v)
    for (int yy = vy0 + threadIdx.x; yy < vy1; yy += blockDim.x) {
      int* t = ytab + (yy - vy0) * stride;
      table_entry(box_h, virt_h, yy, t, t + 2);
    }
  __syncthreads();
  // The sample's image: the idx-th of the store's (all h x w), or the idx-th decoded JPEG, of its own size (sources).
  const std::uint8_t* img = images + static_cast<std::int64_t>(idx) * h * w * c;
  if (sources) {
    img = images + sources[3 * idx];
    w = static_cast<int>(sources[3 * idx + 2]);
  }
  const std::int64_t row = static_cast<std::int64_t>(w) * c;
  // The box rows the vertical pass reads (the vertical table's bounds are monotonic).
  int first = vy0, last = vy1;
  if (need_v && vy1 > vy0) {
    first = ytab[0];
    last = ytab[(vy1 - 1 - vy0) * stride] + ytab[(vy1 - 1 - vy0) * stride + 1];
  }
  std::uint8_t* tmp = scratch + static_cast<std::int64_t>(n) * scratch_stride;
  if (need_h) {
    const int per_row = ncols * c;
    const std::int64_t work = static_cast<std::int64_t>(last - first) * per_row;
    for (std::int64_t i = threadIdx.x; i < work; i += blockDim.x) {
      const int r = static_cast<int>(i / per_row), rem = static_cast<int>(i - static_cast<std::int64_t>(r) * per_row);
      const int col = rem / c, ch = rem - col * c;
      const int* t = xtab + col * stride;
      const std::uint8_t* in = img + (box_y + first + r) * row + (box_x + t[0]) * c + ch;
      int s = 1 << 21;
      for (int x = 0; x < t[1]; ++x) s += static_cast<int>(in[x * c]) * t[2 + x];
      tmp[i] = clip8(s);
    }
    __syncthreads();
  }
  // Each output pixel: shift and flip of the window, the window of the virtual image, the vertical pass.
  const std::int64_t pixels = static_cast<std::int64_t>(out_h) * out_w;
  const std::int64_t base = static_cast<std::int64_t>(n) * pixels;
  for (std::int64_t i = threadIdx.x; i < pixels; i += blockDim.x) {
    const int y = static_cast<int>(i / out_w), x = static_cast<int>(i - static_cast<std::int64_t>(y) * out_w);
    const int sy = y + dy, sx = (flip ? out_w - 1 - x : x) + dx;
    const int vy = top + sy, vx = left + sx;
    const bool inside =
        sy >= 0 && sy < out_h && sx >= 0 && sx < out_w && vy >= vy0 && vy < vy1 && vx >= vx0 && vx < vx1;
    if (!inside) {
      put_pixel<F16>(out, base + i, out_c, c, nullptr, k);
      continue;
    }
    std::uint8_t px[16];
    for (int ch = 0; ch < c; ++ch) {
      // V(r): box row r at virtual column vx after the horizontal pass (or as stored without one).
      auto V = [&](int r) -> int {
        return need_h ? tmp[(static_cast<std::int64_t>(r - first) * ncols + (vx - vx0)) * c + ch]
                      : img[(box_y + r) * row + (box_x + vx) * c + ch];
      };
      if (need_v) {
        const int* t = ytab + (vy - vy0) * stride;
        int s = 1 << 21;
        for (int q = 0; q < t[1]; ++q) s += V(t[0] + q) * t[2 + q];
        px[ch] = clip8(s);
      } else {
        px[ch] = static_cast<std::uint8_t>(V(vy));
      }
    }
    put_pixel<F16>(out, base + i, out_c, c, px, k);
  }
}

__global__ void advance_kernel(std::int32_t* cursor) { *cursor += 1; }

}  // namespace

void gather_normalize(const GatherParams& p, StreamHandle stream) {
  RN_CHECK(p.c >= 1 && p.c <= 16 && p.out_c >= p.c, "gather: {} image channels into {}", p.c, p.out_c);
  RN_CHECK(p.count >= 1 && p.count <= p.batch, "gather: batch of {} (of {})", p.count, p.batch);
  Consts k{};
  for (int q = 0; q < 16; ++q) {
    k.scale[q] = p.scale[q];
    k.bias[q] = p.bias[q];
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (!p.resample) {
    RN_CHECK(p.out_h == p.h && p.out_w == p.w, "gather: {}x{} images into {}x{} without resampling", p.h, p.w, p.out_h,
             p.out_w);
    const std::int64_t pixels = p.count * p.h * p.w;
    const unsigned grid = grid_for(pixels, 256, 132LL * 16);
    if (p.out_f16)
      gather_kernel<true><<<grid, 256, 0, s>>>(p.images, static_cast<int>(p.h), static_cast<int>(p.w),
                                               static_cast<int>(p.c), p.labels, p.table, p.cursor, p.batch, p.count, k,
                                               p.out, static_cast<int>(p.out_c), p.out_labels);
    else
      gather_kernel<false><<<grid, 256, 0, s>>>(p.images, static_cast<int>(p.h), static_cast<int>(p.w),
                                                static_cast<int>(p.c), p.labels, p.table, p.cursor, p.batch, p.count, k,
                                                p.out, static_cast<int>(p.out_c), p.out_labels);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  RN_CHECK(p.max_taps >= 1 && p.max_taps <= kMaxTaps && p.scratch, "gather: filters of {} taps (at most {})",
           p.max_taps, kMaxTaps);
  const std::size_t smem = static_cast<std::size_t>((p.out_h + p.out_w) * (p.max_taps + 2)) * sizeof(int);
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<static_cast<unsigned>(p.count), 256, smem, s>>>(
        p.images, static_cast<int>(p.h), static_cast<int>(p.w), static_cast<int>(p.c), p.labels, p.table, p.cursor,
        p.batch, static_cast<int>(p.out_h), static_cast<int>(p.out_w), p.max_taps, p.scratch,
        p.scratch_stride > 0 ? p.scratch_stride : p.h * p.out_w * p.c, k, p.out, static_cast<int>(p.out_c),
        p.out_labels, p.sources);
  };
  if (p.out_f16)
    launch(render_kernel<true>);
  else
    launch(render_kernel<false>);
  CUDA_CHECK(cudaGetLastError());
}

void advance_cursor(std::int32_t* cursor, StreamHandle stream) {
  advance_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(cursor);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace renaissance::cuda
