// Convolution as im2col + SGEMM (general), plain SGEMM (1×1, stride 1, no padding), or direct loops
// (depthwise). Work is split into pieces fixed by the shape (row chunks, samples), never by the thread
// count; reductions over the batch (weight gradients) run over chunks in a fixed order.
#include <kernels/cpu/conv2d.h>

#include <kernels/cpu/conv2d_onednn.h>
#include <kernels/cpu/gemm.h>
#include <kernels/cpu/reduce.h>
#include <kernels/cpu/scratch.h>
#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#ifdef RENAISSANCE_HAVE_XNNPACK
#include <xnnpack.h>
#endif

namespace renaissance::cpu {

namespace {

struct Geom {
  std::int64_t n, h, w, cin, oh, ow, cout;
  std::int64_t groups, cg, og;  // channels per group in / out
  std::int64_t kh, kw, sh, sw, ph, pw;
  std::int64_t k;  // GEMM depth: kh·kw·cg
  bool pointwise;  // 1×1, stride 1, no padding: x is already the im2col matrix
  bool depthwise;  // one input channel per group
  std::int64_t rows() const { return n * oh * ow; }
};

Geom make_geom(const Shape& xs, const Shape& ys, const Conv2dParams& p, const char* what) {
  RN_CHECK(xs.valid(), "{}: input shape {} is empty", what, xs.str());
  const Shape expect = conv2d_output_shape(xs, ys.c, p);
  RN_CHECK(ys == expect, "{}: output shape {} does not match input {} with kernel {}x{} stride {}x{} pad {}x{} ({})",
           what, ys.str(), xs.str(), p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, expect.str());
  Geom g{};
  g.n = xs.n, g.h = xs.h, g.w = xs.w, g.cin = xs.c, g.oh = ys.h, g.ow = ys.w, g.cout = ys.c;
  g.groups = p.groups, g.cg = xs.c / p.groups, g.og = ys.c / p.groups;
  g.kh = p.kernel_h, g.kw = p.kernel_w, g.sh = p.stride_h, g.sw = p.stride_w, g.ph = p.pad_h, g.pw = p.pad_w;
  g.k = g.kh * g.kw * g.cg;
  g.pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  g.depthwise = g.cg == 1 && g.groups > 1;
  return g;
}

// Rows per im2col chunk: the chunk (rows × k floats) stays within ~256 KiB so it is still in L2 when
// the GEMM reads it. A function of k only.
std::int64_t chunk_rows(std::int64_t k) { return std::clamp<std::int64_t>(65536 / k / 6 * 6, 48, 1536); }

// Independent partial sums of the weight gradient (a constant: the summation order must not depend on
// the thread count). 8 balances 2-8 threads; the partials cost 8 × |dw| floats.
constexpr std::int64_t kWgradLanes = 8;

// im2col of output rows [r0, r0 + rows) for group g: col[r][(kh·KW + kw)·cg + c], zero outside x.
void im2col(const float* x, const Geom& g, std::int64_t group, std::int64_t r0, std::int64_t rows, float* col) {
  const std::int64_t ohw = g.oh * g.ow;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t m = r0 + r, n = m / ohw, oy = m % ohw / g.ow, ox = m % g.ow;
    float* dst = col + r * g.k;
    for (std::int64_t ky = 0; ky < g.kh; ++ky) {
      const std::int64_t iy = oy * g.sh - g.ph + ky;
      if (iy < 0 || iy >= g.h) {
        std::memset(dst, 0, sizeof(float) * g.kw * g.cg);
        dst += g.kw * g.cg;
        continue;
      }
      const float* xrow = x + ((n * g.h + iy) * g.w) * g.cin + group * g.cg;
      for (std::int64_t kx = 0; kx < g.kw; ++kx, dst += g.cg) {
        const std::int64_t ix = ox * g.sw - g.pw + kx;
        if (ix < 0 || ix >= g.w) {
          for (std::int64_t c = 0; c < g.cg; ++c) dst[c] = 0.0f;
        } else {
          const float* src = xrow + ix * g.cin;
          for (std::int64_t c = 0; c < g.cg; ++c) dst[c] = src[c];
        }
      }
    }
  }
}

// The adjoint of im2col for rows [r0, r0 + rows) (all in one sample's rows or in order): dx += col.
void col2im_add(const float* col, const Geom& g, std::int64_t group, std::int64_t r0, std::int64_t rows, float* dx) {
  const std::int64_t ohw = g.oh * g.ow;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t m = r0 + r, n = m / ohw, oy = m % ohw / g.ow, ox = m % g.ow;
    const float* src = col + r * g.k;
    for (std::int64_t ky = 0; ky < g.kh; ++ky) {
      const std::int64_t iy = oy * g.sh - g.ph + ky;
      if (iy < 0 || iy >= g.h) {
        src += g.kw * g.cg;
        continue;
      }
      float* dxrow = dx + ((n * g.h + iy) * g.w) * g.cin + group * g.cg;
      for (std::int64_t kx = 0; kx < g.kw; ++kx, src += g.cg) {
        const std::int64_t ix = ox * g.sw - g.pw + kx;
        if (ix < 0 || ix >= g.w) continue;
        float* dst = dxrow + ix * g.cin;
        for (std::int64_t c = 0; c < g.cg; ++c) dst[c] += src[c];
      }
    }
  }
}

// ---- depthwise (cg == 1): direct loops vectorised over channels -------------------------------------------

// Weights as [kh][kw][cout] so the inner loop runs over contiguous channels.
std::vector<float> depthwise_weights_hwo(const float* w, const Geom& g) {
  std::vector<float> wt(static_cast<std::size_t>(g.kh * g.kw * g.cout));
  for (std::int64_t o = 0; o < g.cout; ++o)
    for (std::int64_t t = 0; t < g.kh * g.kw; ++t) wt[t * g.cout + o] = w[o * g.kh * g.kw + t];
  return wt;
}

void depthwise_forward(const float* x, const float* w, const float* bias, float* y, const Geom& g) {
  const std::vector<float> wt = depthwise_weights_hwo(w, g);
  const std::int64_t mult = g.og;
  parallel_for(0, g.n * g.oh, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t nr = b; nr < e; ++nr) {
      const std::int64_t n = nr / g.oh, oy = nr % g.oh;
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        float* out = y + ((n * g.oh + oy) * g.ow + ox) * g.cout;
        for (std::int64_t o = 0; o < g.cout; ++o) out[o] = bias ? bias[o] : 0.0f;
        for (std::int64_t ky = 0; ky < g.kh; ++ky) {
          const std::int64_t iy = oy * g.sh - g.ph + ky;
          if (iy < 0 || iy >= g.h) continue;
          for (std::int64_t kx = 0; kx < g.kw; ++kx) {
            const std::int64_t ix = ox * g.sw - g.pw + kx;
            if (ix < 0 || ix >= g.w) continue;
            const float* in = x + ((n * g.h + iy) * g.w + ix) * g.cin;
            const float* wk = wt.data() + (ky * g.kw + kx) * g.cout;
            if (mult == 1) {
              for (std::int64_t c = 0; c < g.cout; ++c) out[c] += in[c] * wk[c];
            } else {
              for (std::int64_t o = 0; o < g.cout; ++o) out[o] += in[o / mult] * wk[o];
            }
          }
        }
      }
    }
  });
}

void depthwise_backward_data(const float* dy, const float* w, float* dx, const Geom& g, bool accumulate) {
  const std::vector<float> wt = depthwise_weights_hwo(w, g);
  const std::int64_t mult = g.og;
  // One sample per piece: a sample's dx is written by one thread in a fixed order.
  parallel_for(0, g.n, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n) {
      float* dxn = dx + n * g.h * g.w * g.cin;
      if (!accumulate) std::memset(dxn, 0, sizeof(float) * g.h * g.w * g.cin);
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const float* gy = dy + ((n * g.oh + oy) * g.ow + ox) * g.cout;
          for (std::int64_t ky = 0; ky < g.kh; ++ky) {
            const std::int64_t iy = oy * g.sh - g.ph + ky;
            if (iy < 0 || iy >= g.h) continue;
            for (std::int64_t kx = 0; kx < g.kw; ++kx) {
              const std::int64_t ix = ox * g.sw - g.pw + kx;
              if (ix < 0 || ix >= g.w) continue;
              float* gx = dxn + (iy * g.w + ix) * g.cin;
              const float* wk = wt.data() + (ky * g.kw + kx) * g.cout;
              if (mult == 1) {
                for (std::int64_t c = 0; c < g.cout; ++c) gx[c] += gy[c] * wk[c];
              } else {
                for (std::int64_t o = 0; o < g.cout; ++o) gx[o / mult] += gy[o] * wk[o];
              }
            }
          }
        }
      }
    }
  });
}

void depthwise_backward_filter(const float* x, const float* dy, float* dw, float* db, const Geom& g,
                               bool accumulate) {
  const std::int64_t mult = g.og, taps = g.kh * g.kw;
  // Per-sample partial sums [n][tap][cout], then a sum over n in order.
  const std::int64_t per = taps * g.cout;
  std::vector<float> part(static_cast<std::size_t>(g.n * per), 0.0f);
  parallel_for(0, g.n, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n) {
      float* pn = part.data() + n * per;
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const float* gy = dy + ((n * g.oh + oy) * g.ow + ox) * g.cout;
          for (std::int64_t ky = 0; ky < g.kh; ++ky) {
            const std::int64_t iy = oy * g.sh - g.ph + ky;
            if (iy < 0 || iy >= g.h) continue;
            for (std::int64_t kx = 0; kx < g.kw; ++kx) {
              const std::int64_t ix = ox * g.sw - g.pw + kx;
              if (ix < 0 || ix >= g.w) continue;
              const float* in = x + ((n * g.h + iy) * g.w + ix) * g.cin;
              float* acc = pn + (ky * g.kw + kx) * g.cout;
              if (mult == 1) {
                for (std::int64_t c = 0; c < g.cout; ++c) acc[c] += gy[c] * in[c];
              } else {
                for (std::int64_t o = 0; o < g.cout; ++o) acc[o] += gy[o] * in[o / mult];
              }
            }
          }
        }
      }
    }
  });
  parallel_for(0, per, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const std::int64_t t = i / g.cout, o = i % g.cout;
      double s = 0.0;
      for (std::int64_t n = 0; n < g.n; ++n) s += part[n * per + i];
      float& dst = dw[o * taps + t];
      dst = accumulate ? static_cast<float>(dst + s) : static_cast<float>(s);
    }
  });
  if (db) detail::column_sums(dy, g.rows(), g.cout, g.cout, db, accumulate);
}

// ---- XNNPACK forward -------------------------------------------------------------------------------------

#ifdef RENAISSANCE_HAVE_XNNPACK
// XNNPACK (2022 API) packs the weights when an operator is created. Weights change every training
// step, so a cached operator is reused only while the weights and bias are bit-identical to the ones it
// packed (memcmp against a copy: O(|w|), small next to the convolution). Inference and validation
// passes reuse their operators; training steps re-create them, which costs little (measured:
// docs/kernels-cpu.md).
struct XnnEntry {
  bool deconv;  // backward data: XNNPACK's deconvolution is the adjoint of its convolution
  const float* w_ptr;
  Shape xs;
  std::int64_t cout;
  Conv2dParams p;
  std::vector<float> w, b;
  bool has_bias;
  xnn_operator_t op = nullptr;
  ~XnnEntry() {
    if (op) xnn_delete_operator(op);
  }
};

struct XnnState {
  std::mutex mutex;
  std::vector<float> tail;  // the last sample's input plus XNN_EXTRA_BYTES (see run_all_samples)
  bool initialized = false;
  pthreadpool_t pool = nullptr;
  int pool_threads = 0;
  std::vector<std::unique_ptr<XnnEntry>> cache;  // most recently used last
  ~XnnState() {
    cache.clear();
    if (pool) pthreadpool_destroy(pool);
  }
};

XnnState& xnn_state() {
  static XnnState state;
  return state;
}

constexpr std::size_t kXnnCacheEntries = 32;

// The cached operator for this layer and these exact weights, created by `create` when there is none.
template <class Create>
XnnEntry& xnn_operator(XnnState& st, bool deconv, const Shape& xs, std::int64_t cout, const Conv2dParams& p,
                       const float* w, std::size_t wn, const float* bias, Create&& create) {
  if (!st.initialized) {
    RN_CHECK(xnn_initialize(nullptr) == xnn_status_success, "conv2d: xnn_initialize failed");
    st.initialized = true;
  }
  if (st.pool_threads != num_threads()) {
    if (st.pool) pthreadpool_destroy(st.pool);
    st.pool_threads = num_threads();
    st.pool = st.pool_threads > 1 ? pthreadpool_create(static_cast<std::size_t>(st.pool_threads)) : nullptr;
  }
  // One entry per layer: same shape, parameters and weight pointer. A hit needs the same weight bits too;
  // otherwise the layer's stale entry is dropped (its weights were updated) and re-created.
  auto same_layer = [&](const XnnEntry& e) {
    return e.deconv == deconv && e.w_ptr == w && e.xs.h == xs.h && e.xs.w == xs.w && e.xs.c == xs.c &&
           e.cout == cout && e.p.kernel_h == p.kernel_h && e.p.kernel_w == p.kernel_w && e.p.stride_h == p.stride_h &&
           e.p.stride_w == p.stride_w && e.p.pad_h == p.pad_h && e.p.pad_w == p.pad_w && e.p.groups == p.groups &&
           e.has_bias == (bias != nullptr);
  };
  for (auto it = st.cache.begin(); it != st.cache.end(); ++it) {
    if (!same_layer(**it)) continue;
    if (std::memcmp((*it)->w.data(), w, wn * sizeof(float)) == 0 &&
        (!bias || std::memcmp((*it)->b.data(), bias, sizeof(float) * cout) == 0)) {
      std::rotate(it, it + 1, st.cache.end());
      return *st.cache.back();
    }
    st.cache.erase(it);
    break;
  }
  auto e = std::make_unique<XnnEntry>();
  e->deconv = deconv, e->w_ptr = w, e->xs = xs, e->cout = cout, e->p = p, e->has_bias = bias != nullptr;
  e->w.assign(w, w + wn);
  if (bias) e->b.assign(bias, bias + cout);
  e->op = create();
  if (st.cache.size() >= kXnnCacheEntries) st.cache.erase(st.cache.begin());
  st.cache.push_back(std::move(e));
  return *st.cache.back();
}

// XNNPACK may read up to XNN_EXTRA_BYTES (16) past the end of its input. Every sample but the last is
// followed by another one, so samples [0, n−1) run in place and the last runs from a copy with spare
// room: any buffer is safe (the runtime's FP16-widening scratch has no spare bytes) for a copy of 1/n of
// the input. `setup(batch, in, out)` sets the operator up for one of the two runs.
template <class Setup>
void run_all_samples(XnnState& st, xnn_operator_t op, std::int64_t n, const float* in, std::int64_t in_per,
                     float* out, std::int64_t out_per, Setup&& setup) {
  auto run = [&](std::int64_t batch, const float* src, float* dst) {
    xnn_status s = setup(static_cast<std::size_t>(batch), src, dst);
    RN_CHECK(s == xnn_status_success, "conv2d: XNNPACK setup failed (status {})", static_cast<int>(s));
    s = xnn_run_operator(op, st.pool);
    RN_CHECK(s == xnn_status_success, "conv2d: xnn_run_operator failed (status {})", static_cast<int>(s));
  };
  if (n > 1) run(n - 1, in, out);
  st.tail.resize(static_cast<std::size_t>(in_per) + XNN_EXTRA_BYTES / sizeof(float));
  std::memcpy(st.tail.data(), in + (n - 1) * in_per, sizeof(float) * static_cast<std::size_t>(in_per));
  run(1, st.tail.data(), out + (n - 1) * out_per);
}

void xnnpack_forward(const float* x, const Shape& xs, const float* w, const float* bias, float* y, const Shape& ys,
                     const Conv2dParams& p, const Geom& g) {
  XnnState& st = xnn_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  XnnEntry& e = xnn_operator(st, false, xs, ys.c, p, w, static_cast<std::size_t>(g.cout * g.k), bias, [&] {
    xnn_operator_t op = nullptr;
    const auto ph = static_cast<std::uint32_t>(g.ph), pw = static_cast<std::uint32_t>(g.pw);
    const xnn_status s = xnn_create_convolution2d_nhwc_f32(
        ph, pw, ph, pw, static_cast<std::uint32_t>(g.kh), static_cast<std::uint32_t>(g.kw),
        static_cast<std::uint32_t>(g.sh), static_cast<std::uint32_t>(g.sw), 1, 1, static_cast<std::uint32_t>(g.groups),
        static_cast<std::size_t>(g.cg), static_cast<std::size_t>(g.og), static_cast<std::size_t>(g.cin),
        static_cast<std::size_t>(g.cout), w, bias, -INFINITY, INFINITY, 0, &op);
    RN_CHECK(s == xnn_status_success, "conv2d: xnn_create_convolution2d_nhwc_f32 failed (status {}) for {} -> {}",
             static_cast<int>(s), xs.str(), ys.str());
    return op;
  });
  const auto setup = [&](std::size_t batch, const float* in, float* out) {
    return xnn_setup_convolution2d_nhwc_f32(e.op, batch, static_cast<std::size_t>(xs.h),
                                            static_cast<std::size_t>(xs.w), in, out, st.pool);
  };
  run_all_samples(st, e.op, xs.n, x, xs.per_sample(), y, ys.per_sample(), setup);
}

// dx by XNNPACK's deconvolution (transposed convolution) of dy: it scatters dy[oy]·w[kh] to
// iy = oy·s − p + kh, which is the adjoint of the forward. Its weights are [g][cg][kh][kw][og].
void xnnpack_backward_data(const float* dy, const Shape& ys, const float* w, float* dx, const Shape& xs,
                           const Conv2dParams& p, const Geom& g, bool accumulate) {
  XnnState& st = xnn_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  XnnEntry& e = xnn_operator(st, true, xs, ys.c, p, w, static_cast<std::size_t>(g.cout * g.k), nullptr, [&] {
    std::vector<float> wt(static_cast<std::size_t>(g.cout * g.k));
    const std::int64_t taps = g.kh * g.kw;
    for (std::int64_t gr = 0; gr < g.groups; ++gr)
      for (std::int64_t o = 0; o < g.og; ++o)
        for (std::int64_t t = 0; t < taps; ++t)
          for (std::int64_t c = 0; c < g.cg; ++c)
            wt[((gr * g.cg + c) * taps + t) * g.og + o] = w[((gr * g.og + o) * taps + t) * g.cg + c];
    xnn_operator_t op = nullptr;
    const auto ph = static_cast<std::uint32_t>(g.ph), pw = static_cast<std::uint32_t>(g.pw);
    const xnn_status s = xnn_create_deconvolution2d_nhwc_f32(
        ph, pw, ph, pw, static_cast<std::uint32_t>(g.kh), static_cast<std::uint32_t>(g.kw),
        static_cast<std::uint32_t>(g.sh), static_cast<std::uint32_t>(g.sw), 1, 1, static_cast<std::uint32_t>(g.groups),
        static_cast<std::size_t>(g.og), static_cast<std::size_t>(g.cg), static_cast<std::size_t>(g.cout),
        static_cast<std::size_t>(g.cin), wt.data(), nullptr, -INFINITY, INFINITY, 0, &op);
    RN_CHECK(s == xnn_status_success, "conv2d: xnn_create_deconvolution2d_nhwc_f32 failed (status {}) for {} <- {}",
             static_cast<int>(s), xs.str(), ys.str());
    return op;
  });
  // The forward's floor division drops up to stride − 1 input rows/columns at the far edge; the
  // deconvolution adds them back as "adjustment" (they receive no gradient).
  const auto adj_h = static_cast<std::uint32_t>(g.h - ((g.oh - 1) * g.sh + g.kh - 2 * g.ph));
  const auto adj_w = static_cast<std::uint32_t>(g.w - ((g.ow - 1) * g.sw + g.kw - 2 * g.pw));
  float* out = dx;
  if (accumulate) out = detail::scratch(detail::ScratchSlot::Col, static_cast<std::size_t>(xs.elems()));
  const auto setup = [&](std::size_t batch, const float* in, float* o) {
    return xnn_setup_deconvolution2d_nhwc_f32(e.op, batch, static_cast<std::size_t>(ys.h),
                                              static_cast<std::size_t>(ys.w), adj_h, adj_w, in, o, st.pool);
  };
  run_all_samples(st, e.op, ys.n, dy, ys.per_sample(), out, xs.per_sample(), setup);
  if (accumulate) {
    parallel_for(0, xs.elems(), 1 << 15, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) dx[i] += out[i];
    });
  }
}
#endif

}  // namespace

Shape conv2d_output_shape(const Shape& x, std::int64_t out_channels, const Conv2dParams& p) {
  RN_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0,
           "conv2d: invalid kernel {}x{} / stride {}x{} / pad {}x{}", p.kernel_h, p.kernel_w, p.stride_h, p.stride_w,
           p.pad_h, p.pad_w);
  RN_CHECK(p.groups > 0 && x.c % p.groups == 0 && out_channels % p.groups == 0,
           "conv2d: groups={} must divide input channels {} and output channels {}", p.groups, x.c, out_channels);
  const std::int64_t hp = x.h + 2 * p.pad_h, wp = x.w + 2 * p.pad_w;
  RN_CHECK(hp >= p.kernel_h && wp >= p.kernel_w, "conv2d: kernel {}x{} larger than padded input {}x{}", p.kernel_h,
           p.kernel_w, hp, wp);
  return Shape{x.n, (hp - p.kernel_h) / p.stride_h + 1, (wp - p.kernel_w) / p.stride_w + 1, out_channels};
}

std::int64_t conv2d_weight_elems(std::int64_t in_channels, std::int64_t out_channels, const Conv2dParams& p) {
  return out_channels * p.kernel_h * p.kernel_w * (in_channels / p.groups);
}

bool xnnpack_available() {
#ifdef RENAISSANCE_HAVE_XNNPACK
  return true;
#else
  return false;
#endif
}

namespace {

void gemm_forward(const float* x, const float* w, const float* bias, float* y, const Geom& g) {
  if (g.depthwise) {
    depthwise_forward(x, w, bias, y, g);
    return;
  }
  // W_g is [og × k] row-major (OHWI), so op(B) = W_gᵀ; packed once, shared by every row chunk.
  std::vector<std::unique_ptr<PackedB>> wg;
  for (std::int64_t gr = 0; gr < g.groups; ++gr)
    wg.push_back(std::make_unique<PackedB>(true, g.k, g.og, w + gr * g.og * g.k, g.k));
  const std::int64_t rows = g.rows(), chunk = chunk_rows(g.k);
  parallel_for(0, (rows + chunk - 1) / chunk, 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t ci = c0; ci < c1; ++ci) {
      const std::int64_t r0 = ci * chunk, nr = std::min(chunk, rows - r0);
      for (std::int64_t gr = 0; gr < g.groups; ++gr) {
        const float* a = x + r0 * g.cin + gr * g.cg;
        std::int64_t lda = g.cin;
        if (!g.pointwise) {
          float* col = detail::scratch(detail::ScratchSlot::Col, static_cast<std::size_t>(nr * g.k));
          im2col(x, g, gr, r0, nr, col);
          a = col;
          lda = g.k;
        }
        sgemm_serial_packed(false, nr, 1.0f, a, lda, *wg[gr], 0.0f, y + r0 * g.cout + gr * g.og, g.cout);
      }
      if (bias)
        for (std::int64_t r = r0; r < r0 + nr; ++r)
          for (std::int64_t o = 0; o < g.cout; ++o) y[r * g.cout + o] += bias[o];
    }
  });
}

void gemm_backward_data(const float* dy, const float* w, float* dx, const Geom& g, bool accumulate) {
  if (g.depthwise) {
    depthwise_backward_data(dy, w, dx, g, accumulate);
    return;
  }
  // dcol = dY_g · W_g: W_g [og × k] is op(B) as stored.
  std::vector<std::unique_ptr<PackedB>> wg;
  for (std::int64_t gr = 0; gr < g.groups; ++gr)
    wg.push_back(std::make_unique<PackedB>(false, g.og, g.k, w + gr * g.og * g.k, g.k));
  const std::int64_t chunk = chunk_rows(g.k);
  if (g.pointwise) {
    const std::int64_t rows = g.rows();
    parallel_for(0, (rows + chunk - 1) / chunk, 1, [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t ci = c0; ci < c1; ++ci) {
        const std::int64_t r0 = ci * chunk, nr = std::min(chunk, rows - r0);
        for (std::int64_t gr = 0; gr < g.groups; ++gr)
          sgemm_serial_packed(false, nr, 1.0f, dy + r0 * g.cout + gr * g.og, g.cout, *wg[gr], accumulate ? 1.0f : 0.0f,
                              dx + r0 * g.cin + gr * g.cg, g.cin);
      }
    });
    return;
  }
  // Windows overlap, so col2im scatters: one sample per piece keeps every dx element to one thread and a
  // fixed order of additions.
  const std::int64_t ohw = g.oh * g.ow;
  parallel_for(0, g.n, 1, [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t n = n0; n < n1; ++n) {
      if (!accumulate) std::memset(dx + n * g.h * g.w * g.cin, 0, sizeof(float) * g.h * g.w * g.cin);
      for (std::int64_t r0 = n * ohw; r0 < (n + 1) * ohw; r0 += chunk) {
        const std::int64_t nr = std::min(chunk, (n + 1) * ohw - r0);
        float* col = detail::scratch(detail::ScratchSlot::Col, static_cast<std::size_t>(nr * g.k));
        for (std::int64_t gr = 0; gr < g.groups; ++gr) {
          sgemm_serial_packed(false, nr, 1.0f, dy + r0 * g.cout + gr * g.og, g.cout, *wg[gr], 0.0f, col, g.k);
          col2im_add(col, g, gr, r0, nr, dx);
        }
      }
    }
  });
}

void gemm_backward_filter(const float* x, const float* dy, float* dw, float* db, const Geom& g, bool accumulate) {
  if (g.depthwise) {
    depthwise_backward_filter(x, dy, dw, db, g, accumulate);
    return;
  }
  // dW_gᵀ [k × og] = Σ_chunks col_gᵀ · dY_g (the long operand, col, is read in place; measured faster
  // than dW_g = dY_gᵀ · col_g), then transposed into OHWI. Row chunk c is summed into lane c % lanes;
  // each lane is one task that walks its chunks in order, and the lanes are added in lane order: one
  // dispatch, a fixed summation order, and every thread works on its own lane.
  const std::int64_t rows = g.rows(), per = g.groups * g.k * g.og;
  const std::int64_t chunk = std::clamp<std::int64_t>(65536 / g.k, 128, 2048);
  const std::int64_t chunks = (rows + chunk - 1) / chunk, lanes = std::min(kWgradLanes, chunks);
  float* part = detail::scratch(detail::ScratchSlot::Partial, static_cast<std::size_t>(lanes * per));
  parallel_for(0, lanes, 1, [&](std::int64_t l0, std::int64_t l1) {
    for (std::int64_t lane = l0; lane < l1; ++lane) {
      float* acc = part + lane * per;
      for (std::int64_t c = lane; c < chunks; c += lanes) {
        const std::int64_t r0 = c * chunk, nr = std::min(chunk, rows - r0);
        for (std::int64_t gr = 0; gr < g.groups; ++gr) {
          const float* a = x + r0 * g.cin + gr * g.cg;
          std::int64_t lda = g.cin;
          if (!g.pointwise) {
            float* col = detail::scratch(detail::ScratchSlot::Col, static_cast<std::size_t>(nr * g.k));
            im2col(x, g, gr, r0, nr, col);
            a = col;
            lda = g.k;
          }
          sgemm_serial(true, false, g.k, g.og, nr, 1.0f, a, lda, dy + r0 * g.cout + gr * g.og, g.cout,
                       c == lane ? 0.0f : 1.0f, acc + gr * g.k * g.og, g.og);
        }
      }
    }
  });
  parallel_for(0, g.cout, 8, [&](std::int64_t o0, std::int64_t o1) {
    for (std::int64_t o = o0; o < o1; ++o) {
      const std::int64_t gr = o / g.og, oo = o % g.og;
      float* dst = dw + o * g.k;
      for (std::int64_t j = 0; j < g.k; ++j) {
        const std::int64_t e = gr * g.k * g.og + j * g.og + oo;
        float sum = part[e];
        for (std::int64_t lane = 1; lane < lanes; ++lane) sum += part[lane * per + e];
        dst[j] = accumulate ? dst[j] + sum : sum;
      }
    }
  });
  if (db) detail::column_sums(dy, rows, g.cout, g.cout, db, accumulate);
}

// The algorithm a pass runs (never Auto). Auto, measured on these kernels (docs/kernels-cpu.md): oneDNN for every
// pass. (XNNPACK's strided 1×1 forward is faster alone, 57 vs 38 GFLOP/s a core on 28×28×16→32, but its own thread
// pool spinning beside ours made the quarter-width ResNet-18 step 1.7x slower on two cores.) Without oneDNN: XNNPACK
// for every forward (1.2x the GEMM path on 3×3 layers, 3x on the 1-channel first layer and
// on depthwise, even with its operator re-created for new weights each step) and XNNPACK's deconvolution for dx of
// ungrouped spatial kernels (1.1-1.4x; 1×1 is a plain GEMM either way, its depthwise deconvolution is 7x slower).
Conv2dAlgo static_choice(Conv2dAlgo algo, Conv2dPass pass, const Geom& g) {
  switch (algo) {
    case Conv2dAlgo::Onednn:
      RN_CHECK(onednn_available(), "conv2d: oneDNN requested but {}",
               "this build has no oneDNN (install libdnnl-dev and reconfigure)");
      return Conv2dAlgo::Onednn;
    case Conv2dAlgo::Gemm: return Conv2dAlgo::Gemm;
    case Conv2dAlgo::Xnnpack:
      return xnnpack_available() && pass != Conv2dPass::BackwardFilter ? Conv2dAlgo::Xnnpack : Conv2dAlgo::Gemm;
    case Conv2dAlgo::Auto: break;
  }
  if (onednn_available()) return Conv2dAlgo::Onednn;
  if (xnnpack_available() &&
      (pass == Conv2dPass::Forward || (pass == Conv2dPass::BackwardData && g.groups == 1 && !g.pointwise)))
    return Conv2dAlgo::Xnnpack;
  return Conv2dAlgo::Gemm;
}

const char* pass_name(Conv2dPass pass) {
  switch (pass) {
    case Conv2dPass::Forward: return "conv2d_forward";
    case Conv2dPass::BackwardData: return "conv2d_backward_data";
    case Conv2dPass::BackwardFilter: return "conv2d_backward_filter";
  }
  return "conv2d";
}

}  // namespace

const char* conv2d_algo_name(Conv2dAlgo a) {
  switch (a) {
    case Conv2dAlgo::Auto: return "auto";
    case Conv2dAlgo::Gemm: return "gemm";
    case Conv2dAlgo::Xnnpack: return "xnnpack";
    case Conv2dAlgo::Onednn: return "onednn";
  }
  return "?";
}

Conv2dPlan::Conv2dPlan(const Shape& xs, const Shape& ys, const Conv2dParams& p, Conv2dPass pass, bool bias,
                       Conv2dAlgo algo)
    : m_xs(xs), m_ys(ys), m_p(p), m_pass(pass) {
  const Geom g = make_geom(xs, ys, p, pass_name(pass));
  m_algo = static_choice(algo, pass, g);
  if (m_algo == Conv2dAlgo::Onednn) {
    try {
      m_onednn = std::make_unique<Onednn>(xs, ys, p, pass, bias);
    } catch (const Error&) {
      if (algo == Conv2dAlgo::Onednn) throw;
    }
    // Auto keeps oneDNN only where it has an optimised implementation for the shape, not its reference loops.
    if (algo == Conv2dAlgo::Auto && (!m_onednn || m_onednn->impl().rfind("ref", 0) == 0)) {
      m_onednn.reset();
      m_algo = Conv2dAlgo::Gemm;
      if (xnnpack_available() &&
          (pass == Conv2dPass::Forward || (pass == Conv2dPass::BackwardData && g.groups == 1 && !g.pointwise)))
        m_algo = Conv2dAlgo::Xnnpack;
    }
  }
  m_describe = conv2d_algo_name(m_algo);
  if (m_onednn)
    m_describe += " " + m_onednn->impl() + " w:" + m_onednn->layout().arena_weights + ">" + m_onednn->layout().weights;
}

Conv2dPlan::~Conv2dPlan() = default;

const OnednnLayout* Conv2dPlan::onednn_layout() const { return m_onednn ? &m_onednn->layout() : nullptr; }

std::int64_t Conv2dPlan::onednn_weight_reorders() const { return m_onednn ? m_onednn->weight_reorders() : 0; }

void Conv2dPlan::forward(const float* x, const float* w, const float* bias, float* y) const {
  RN_CHECK(m_pass == Conv2dPass::Forward, "conv2d: a {} plan cannot run the forward", pass_name(m_pass));
  const Geom g = make_geom(m_xs, m_ys, m_p, "conv2d_forward");
  switch (m_algo) {
    case Conv2dAlgo::Onednn: return m_onednn->forward(x, w, bias, y);
#ifdef RENAISSANCE_HAVE_XNNPACK
    case Conv2dAlgo::Xnnpack: return xnnpack_forward(x, m_xs, w, bias, y, m_ys, m_p, g);
#endif
    default: return gemm_forward(x, w, bias, y, g);
  }
}

void Conv2dPlan::backward_data(const float* dy, const float* w, float* dx, bool accumulate) const {
  RN_CHECK(m_pass == Conv2dPass::BackwardData, "conv2d: a {} plan cannot run the backward data pass",
           pass_name(m_pass));
  const Geom g = make_geom(m_xs, m_ys, m_p, "conv2d_backward_data");
  switch (m_algo) {
    case Conv2dAlgo::Onednn: return m_onednn->backward_data(dy, w, dx, accumulate);
#ifdef RENAISSANCE_HAVE_XNNPACK
    case Conv2dAlgo::Xnnpack: return xnnpack_backward_data(dy, m_ys, w, dx, m_xs, m_p, g, accumulate);
#endif
    default: return gemm_backward_data(dy, w, dx, g, accumulate);
  }
}

void Conv2dPlan::backward_filter(const float* x, const float* dy, float* dw, float* db, bool accumulate) const {
  RN_CHECK(m_pass == Conv2dPass::BackwardFilter, "conv2d: a {} plan cannot run the weight gradient",
           pass_name(m_pass));
  const Geom g = make_geom(m_xs, m_ys, m_p, "conv2d_backward_filter");
  if (m_algo != Conv2dAlgo::Onednn) return gemm_backward_filter(x, dy, dw, db, g, accumulate);
  m_onednn->backward_filter(x, dy, dw, accumulate);
  if (db) detail::column_sums(dy, g.rows(), g.cout, g.cout, db, accumulate);
}

void Conv2dPlan::backward_filter_and_data(const float* x, const float* dy, float* dw, float* db, bool accumulate_w,
                                          const Conv2dPlan& data, const float* w, float* dx, bool accumulate_dx) const {
  RN_CHECK(m_pass == Conv2dPass::BackwardFilter && data.m_pass == Conv2dPass::BackwardData && m_xs == data.m_xs &&
               m_ys == data.m_ys,
           "conv2d: backward_filter_and_data needs a weight-gradient and a data-gradient plan of one convolution");
  if (m_algo != Conv2dAlgo::Onednn || data.m_algo != Conv2dAlgo::Onednn) {
    backward_filter(x, dy, dw, db, accumulate_w);
    data.backward_data(dy, w, dx, accumulate_dx);
    return;
  }
  const Geom g = make_geom(m_xs, m_ys, m_p, "conv2d_backward_filter");
  m_onednn->backward_filter_and_data(x, dy, dw, accumulate_w, *data.m_onednn, w, dx, accumulate_dx);
  if (db) detail::column_sums(dy, g.rows(), g.cout, g.cout, db, accumulate_w);
}

void conv2d_forward(const float* x, const Shape& xs, const float* w, const float* bias, float* y, const Shape& ys,
                    const Conv2dParams& p, Conv2dAlgo algo) {
  Conv2dPlan(xs, ys, p, Conv2dPass::Forward, bias != nullptr, algo).forward(x, w, bias, y);
}

void conv2d_backward_data(const float* dy, const Shape& ys, const float* w, float* dx, const Shape& xs,
                          const Conv2dParams& p, bool accumulate, Conv2dAlgo algo) {
  Conv2dPlan(xs, ys, p, Conv2dPass::BackwardData, false, algo).backward_data(dy, w, dx, accumulate);
}

void conv2d_backward_filter(const float* x, const Shape& xs, const float* dy, const Shape& ys, float* dw, float* db,
                            const Conv2dParams& p, bool accumulate, Conv2dAlgo algo) {
  Conv2dPlan(xs, ys, p, Conv2dPass::BackwardFilter, false, algo).backward_filter(x, dy, dw, db, accumulate);
}

}  // namespace renaissance::cpu
