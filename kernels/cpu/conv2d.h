// 2-D convolution, NHWC activations, OHWI weights ([out][kh][kw][in/groups]), zero padding, groups.
#pragma once

#include <renaissance/core/shape.h>

#include <cstdint>
#include <memory>
#include <string>

namespace renaissance::cpu {

struct Conv2dParams {
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;  // zero padding on both sides
  int groups = 1;            // groups == in_channels: depthwise (out = in·multiplier)
};

/// How a pass is computed.
/// Gemm: im2col (none for 1×1 stride-1 unpadded) + SGEMM, col2im for dx, direct loops for depthwise.
/// Xnnpack: XNNPACK's convolution (forward) or deconvolution (dx); Gemm when built without XNNPACK, and for the
///   weight gradient (XNNPACK has no backward operators).
/// Onednn: oneDNN's training primitives (forward, backward data, backward weights) on the NHWC tensors as they
///   are, run single-threaded on fixed batch pieces spread over the thread pool (Conv2dPlan); an error when
///   built without oneDNN (onednn_available()).
/// Auto: the fastest available, measured per pass (docs/kernels-cpu.md): oneDNN for every pass when built with
///   it (unless it offers only its reference implementation for the shape); else XNNPACK for every forward and for dx
///   of ungrouped, non-1×1 convolutions, Gemm otherwise. Any buffer is safe with every algorithm (the XNNPACK path runs
///   the last sample from a copy, since XNNPACK reads 16 bytes past its input).
enum class Conv2dAlgo : std::uint8_t { Auto, Gemm, Xnnpack, Onednn };
enum class Conv2dPass : std::uint8_t { Forward, BackwardData, BackwardFilter };

const char* conv2d_algo_name(Conv2dAlgo a);
bool xnnpack_available();
/// Built with oneDNN (RENAISSANCE_ONEDNN) and its CPU engine works on this machine.
bool onednn_available();

/// oneDNN's Winograd F(4x4, 3x3) kernels for the 3×3 stride-1 pad-1 layers of 16k channels (AVX-512 only; the forward
/// and dx on maps of at least 7×7, the weight gradient on any): a quarter of the multiplications, at a larger
/// rounding error than the direct kernels (the forward ~5-9e-6 of an output channel's spread on post-ReLU data,
/// ~3x the direct kernels'; ~1-2e-6 of the largest output on zero-mean data). On by default: the CPU's speed setting.
/// `off` is the strict one, oneDNN's direct kernels as PyTorch runs them, which the CPU goldens of
/// tiny_resnet need: its step-1 gradients move by 6.6e-2 of the largest under any rounding other than PyTorch's,
/// even noise of 1e-9 of the outputs (docs/kernels-cpu.md "Winograd"). Read when a plan is made; the initial value
/// is on unless RENAISSANCE_CPU_WINOGRAD is off/0; `train`/`bench --cpu-winograd on|off` set it.
void set_conv2d_winograd(bool on);
bool conv2d_winograd();
/// Whether plans can take the Winograd kernels here: built with oneDNN and its CPU ISA is AVX-512 (avx512_core).
bool conv2d_winograd_available();

/// Output shape: OH = (H + 2·pad_h − kernel_h) / stride_h + 1 (likewise OW), C = out_channels.
/// Throws Error when the parameters do not fit the input.
Shape conv2d_output_shape(const Shape& x, std::int64_t out_channels, const Conv2dParams& p);
/// Elements of the weight tensor: out_channels · kernel_h · kernel_w · (in_channels / groups).
std::int64_t conv2d_weight_elems(std::int64_t in_channels, std::int64_t out_channels, const Conv2dParams& p);

/// y[n,oh,ow,o] = Σ_{kh,kw,i} x[n, oh·sh − ph + kh, ow·sw − pw + kw, g·Cg + i] · w[o,kh,kw,i] + b[o],
/// g = o / (Cout/groups), Cg = Cin/groups; out-of-range x reads as 0. `bias` may be null.
void conv2d_forward(const float* x, const Shape& xs, const float* w, const float* bias, float* y, const Shape& ys,
                    const Conv2dParams& p, Conv2dAlgo algo = Conv2dAlgo::Auto);

/// dx = ∂L/∂x = Σ over every (o, kh, kw) that read x of dy[n,oh,ow,o] · w[o,kh,kw,i] ("full" correlation
/// with the flipped kernel). accumulate: dx += instead of dx =.
void conv2d_backward_data(const float* dy, const Shape& ys, const float* w, float* dx, const Shape& xs,
                          const Conv2dParams& p, bool accumulate, Conv2dAlgo algo = Conv2dAlgo::Auto);

/// dw[o,kh,kw,i] = Σ_{n,oh,ow} dy[n,oh,ow,o] · x[n, oh·sh − ph + kh, ow·sw − pw + kw, g·Cg + i];
/// db[o] = Σ_{n,oh,ow} dy[n,oh,ow,o] (when db is not null). accumulate: add into dw/db.
void conv2d_backward_filter(const float* x, const Shape& xs, const float* dy, const Shape& ys, float* dw, float* db,
                            const Conv2dParams& p, bool accumulate, Conv2dAlgo algo = Conv2dAlgo::Auto);

/// How a oneDNN pass meets its tensors, fixed when its plan is made (docs/kernels-cpu.md, "Weight formats").
struct OnednnLayout {
  /// "nhwc" (the runtime's tensors as they are), "nChw16c" for 16 channels on both sides (the same bytes), or
  /// "nhwc>nChw16c" (Winograd on other channel counts: each batch piece reordered in scratch).
  std::string activations;
  /// oneDNN's Winograd F(4x4, 3x3) kernels (3×3 stride-1 layers of 16k channels on AVX-512; docs/kernels-cpu.md).
  bool winograd = false;
  /// The weights as the arena holds them, in oneDNN's notation: OHWI is "ohwi" ("gohwi" grouped).
  std::string arena_weights;
  /// The weights as the primitive reads (forward, dx) or writes (dW) them, e.g. "OIhw16o16i".
  std::string weights;
  /// One reorder of the weights per call between the two (never per batch piece): arena → primitive for the forward
  /// and dx, primitive → arena (+= when accumulating) for dW. oneDNN 2.6 has no fast kernel on OHWI weights and no
  /// blocked format that its forward, dx and dW kernels share (measured: docs/kernels-cpu.md).
  bool weight_reorder = false;
  /// Floats of the weights in the primitive's format (equal to the OHWI count when the format has no padding).
  std::int64_t weight_floats = 0;
};

/// One pass of one convolution planned once for its shapes (the runtime prepares one per plan node, before the
/// first step): the algorithm, and for oneDNN its primitives, their memory formats (activations stay NHWC: no
/// reorder of x, y, dx or dy ever runs; the weights' format and their one reorder per call: OnednnLayout) and that
/// reorder's primitive, so that a call creates nothing. The free functions above plan on each call.
///
/// oneDNN runs single-threaded on batch pieces fixed by the shape (forward and dx: up to 32 pieces of at least 256
/// output positions; the weight gradient: 2 to 16 pieces, one per 512 FLOPs per weight; conv2d_onednn.cpp), claimed
/// by the thread pool,
/// and the weight-gradient pieces' partial sums are added in piece order; so, as with every kernel here, results
/// do not depend on the thread count (oneDNN's own threading would split its reductions by thread count).
/// Not thread-safe: one call at a time per plan (the runtime runs one node at a time).
class Conv2dPlan {
 public:
  /// `bias`: the forward adds a bias (needed at plan time by oneDNN).
  Conv2dPlan(const Shape& xs, const Shape& ys, const Conv2dParams& p, Conv2dPass pass, bool bias = false,
             Conv2dAlgo algo = Conv2dAlgo::Auto);
  ~Conv2dPlan();
  Conv2dPlan(const Conv2dPlan&) = delete;
  Conv2dPlan& operator=(const Conv2dPlan&) = delete;

  Conv2dPass pass() const { return m_pass; }
  /// The algorithm the pass runs (never Auto).
  Conv2dAlgo algo() const { return m_algo; }
  /// For profiles: "onednn brgconv:avx512_core w:ohwi>Ohwi32o", "xnnpack", "gemm".
  const std::string& describe() const { return m_describe; }
  /// oneDNN plans: their memory formats and weight reorder (fixed at construction); nullptr for the other algorithms.
  const OnednnLayout* onednn_layout() const;
  /// oneDNN plans: how many weight reorders their calls have run (one per call); 0 for the other algorithms.
  std::int64_t onednn_weight_reorders() const;

  void forward(const float* x, const float* w, const float* bias, float* y) const;
  void backward_data(const float* dy, const float* w, float* dx, bool accumulate) const;
  void backward_filter(const float* x, const float* dy, float* dw, float* db, bool accumulate) const;

  /// The weight gradient (this plan) and the data gradient (`data`, a BackwardData plan of the same layer) at once:
  /// they read the same dy and neither reads what the other writes, so one parallel section runs both passes' batch
  /// pieces and the data gradient's pieces fill the weight gradient's tail (one join instead of two). The same bits
  /// as backward_filter then backward_data; when either plan is not oneDNN, exactly those two calls.
  void backward_filter_and_data(const float* x, const float* dy, float* dw, float* db, bool accumulate_w,
                                const Conv2dPlan& data, const float* w, float* dx, bool accumulate_dx) const;

  struct Onednn;  // kernels/cpu/conv2d_onednn.cpp

 private:
  Shape m_xs, m_ys;
  Conv2dParams m_p;
  Conv2dPass m_pass;
  Conv2dAlgo m_algo;
  std::string m_describe;
  std::unique_ptr<Onednn> m_onednn;
};

}  // namespace renaissance::cpu
