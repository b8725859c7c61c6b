#include <kernels/cpu/pooling.h>

#include <kernels/cpu/thread_pool.h>
#include <kernels/cpu/vectorize.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace renaissance::cpu {

namespace {

void check_pool(const Shape& xs, const Shape& ys, const Pool2dParams& p, const char* what) {
  RN_CHECK(xs.valid(), "{}: input shape {} is empty", what, xs.str());
  const Shape expect = maxpool2d_output_shape(xs, p);
  RN_CHECK(ys == expect, "{}: output shape {} does not match input {} with kernel {}x{} stride {}x{} pad {}x{} ({})",
           what, ys.str(), xs.str(), p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, expect.str());
}

constexpr std::uint8_t kNoArg = 0xFF;

// The window maxima of output row (n, oy) into out/idx (ow × c each, idx = position in the window), first
// maximum wins. The window's first in-range position initialises the row (every window has one: padding is at
// most half the kernel), later positions replace it where strictly greater, so a NaN that comes first stays and
// one that comes later is ignored. Positions are kept as int32 beside the float maxima (same lane width: the
// compare-and-select loop vectorises) and narrowed to bytes at the end. `pos` is a scratch row of ow × c.
void max_row(const float* x, const Shape& xs, const Shape& ys, const Pool2dParams& p, std::int64_t n, std::int64_t oy,
             float* out, std::uint8_t* idx, std::int32_t* pos) {
  const std::int64_t c = xs.c;
  const std::int64_t iy0 = oy * p.stride_h - p.pad_h;
  const std::int64_t ky0 = std::max<std::int64_t>(0, -iy0), ky1 = std::min<std::int64_t>(p.kernel_h, xs.h - iy0);
  for (std::int64_t ox = 0; ox < ys.w; ++ox) {
    float* best = out + ox * c;
    std::int32_t* arg = pos + ox * c;
    const std::int64_t ix0 = ox * p.stride_w - p.pad_w;
    const std::int64_t kx0 = std::max<std::int64_t>(0, -ix0), kx1 = std::min<std::int64_t>(p.kernel_w, xs.w - ix0);
    if (ky0 >= ky1 || kx0 >= kx1) {  // no position in range (not reachable with valid parameters)
      for (std::int64_t j = 0; j < c; ++j) {
        best[j] = -std::numeric_limits<float>::infinity();
        arg[j] = kNoArg;
      }
      continue;
    }
    bool first = true;
    for (std::int64_t ky = ky0; ky < ky1; ++ky) {
      for (std::int64_t kx = kx0; kx < kx1; ++kx) {
        const float* in = x + ((n * xs.h + iy0 + ky) * xs.w + ix0 + kx) * c;
        const auto at = static_cast<std::int32_t>(ky * p.kernel_w + kx);
        if (first) {
          for (std::int64_t j = 0; j < c; ++j) {
            best[j] = in[j];
            arg[j] = at;
          }
          first = false;
          continue;
        }
        // The position select as a bit mask: GCC leaves `take ? at : arg[j]` as a branch (not vectorised).
        RN_IVDEP for (std::int64_t j = 0; j < c; ++j) {
          const float v = in[j], b = best[j];
          const std::int32_t take = -static_cast<std::int32_t>(v > b);
          best[j] = v > b ? v : b;
          arg[j] = (at & take) | (arg[j] & ~take);
        }
      }
    }
  }
  const std::int64_t row = ys.w * c;
  for (std::int64_t j = 0; j < row; ++j) idx[j] = static_cast<std::uint8_t>(pos[j]);
}

}  // namespace

Shape maxpool2d_output_shape(const Shape& x, const Pool2dParams& p) {
  RN_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0,
           "maxpool2d: invalid kernel {}x{} / stride {}x{}", p.kernel_h, p.kernel_w, p.stride_h, p.stride_w);
  RN_CHECK(p.pad_h >= 0 && p.pad_w >= 0 && 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
           "maxpool2d: padding {}x{} must be at most half the kernel {}x{}", p.pad_h, p.pad_w, p.kernel_h, p.kernel_w);
  const std::int64_t hp = x.h + 2 * p.pad_h, wp = x.w + 2 * p.pad_w;
  RN_CHECK(hp >= p.kernel_h && wp >= p.kernel_w, "maxpool2d: kernel {}x{} larger than padded input {}x{}", p.kernel_h,
           p.kernel_w, hp, wp);
  RN_CHECK(p.kernel_h * p.kernel_w <= kMaxPoolWindow, "maxpool2d: a {}x{} window has more than {} positions",
           p.kernel_h, p.kernel_w, kMaxPoolWindow);
  return Shape{x.n, ops::window_out(x.h, p.kernel_h, p.stride_h, p.pad_h),
               ops::window_out(x.w, p.kernel_w, p.stride_w, p.pad_w), x.c};
}

void maxpool2d_forward(const float* x, const Shape& xs, float* y, const Shape& ys, const Pool2dParams& p,
                       std::uint8_t* argmax) {
  check_pool(xs, ys, p, "maxpool2d_forward");
  const std::int64_t row = ys.w * ys.c;
  parallel_for(0, ys.n * ys.h, 1, [&](std::int64_t b, std::int64_t e) {
    std::vector<std::uint8_t> local(argmax ? 0 : static_cast<std::size_t>(row));
    std::vector<std::int32_t> pos(static_cast<std::size_t>(row));
    for (std::int64_t nr = b; nr < e; ++nr) {
      std::uint8_t* idx = argmax ? argmax + nr * row : local.data();
      max_row(x, xs, ys, p, nr / ys.h, nr % ys.h, y + nr * row, idx, pos.data());
    }
  });
}

void maxpool2d_backward(const float* dy, const Shape& ys, const float* x, const std::uint8_t* argmax, float* dx,
                        const Shape& xs, const Pool2dParams& p, bool accumulate) {
  check_pool(xs, ys, p, "maxpool2d_backward");
  RN_CHECK(argmax || x, "maxpool2d_backward: needs the argmax indices or the forward input");
  const std::int64_t c = xs.c, row = ys.w * c, plane = xs.h * xs.w;
  // One sample per piece: overlapping windows scatter into the same dx, so each sample's dx is owned by
  // one thread and filled in a fixed order.
  parallel_for(0, xs.n, 1, [&](std::int64_t b, std::int64_t e) {
    std::vector<float> best(argmax ? 0 : static_cast<std::size_t>(row));
    std::vector<std::uint8_t> local(argmax ? 0 : static_cast<std::size_t>(row));
    std::vector<std::int32_t> pos(argmax ? 0 : static_cast<std::size_t>(row));
    for (std::int64_t n = b; n < e; ++n) {
      float* dxn = dx + n * plane * c;
      if (!accumulate) std::memset(dxn, 0, sizeof(float) * plane * c);
      for (std::int64_t oy = 0; oy < ys.h; ++oy) {
        const std::int64_t nr = n * ys.h + oy;
        const std::uint8_t* idx = argmax ? argmax + nr * row : local.data();
        if (!argmax) max_row(x, xs, ys, p, n, oy, best.data(), local.data(), pos.data());
        const float* g = dy + nr * row;
        const std::int64_t iy0 = oy * p.stride_h - p.pad_h;
        for (std::int64_t ox = 0; ox < ys.w; ++ox) {
          const std::int64_t ix0 = ox * p.stride_w - p.pad_w;
          for (std::int64_t j = 0; j < c; ++j) {
            const int a = idx[ox * c + j];  // position in the window: every window has one in range
            const std::int64_t pos = (iy0 + a / p.kernel_w) * xs.w + ix0 + a % p.kernel_w;
            dxn[pos * c + j] += g[ox * c + j];
          }
        }
      }
    }
  });
}

void global_avgpool_forward(const float* x, const Shape& xs, float* y) {
  RN_CHECK(xs.valid(), "global_avgpool_forward: input shape {} is empty", xs.str());
  const std::int64_t hw = xs.h * xs.w, c = xs.c;
  const auto count = static_cast<float>(hw);
  parallel_for(0, xs.n, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n) {
      float* out = y + n * c;
      for (std::int64_t j = 0; j < c; ++j) out[j] = 0.0f;
      for (std::int64_t i = 0; i < hw; ++i) {
        const float* in = x + (n * hw + i) * c;
        for (std::int64_t j = 0; j < c; ++j) out[j] += in[j];
      }
      for (std::int64_t j = 0; j < c; ++j) out[j] /= count;
    }
  });
}

void global_avgpool_backward(const float* dy, float* dx, const Shape& xs, bool accumulate) {
  RN_CHECK(xs.valid(), "global_avgpool_backward: input shape {} is empty", xs.str());
  const std::int64_t hw = xs.h * xs.w, c = xs.c;
  const auto count = static_cast<float>(hw);
  parallel_for(0, xs.n * hw, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const float* g = dy + (r / hw) * c;
      float* d = dx + r * c;
      for (std::int64_t j = 0; j < c; ++j) d[j] = accumulate ? d[j] + g[j] / count : g[j] / count;
    }
  });
}

}  // namespace renaissance::cpu
