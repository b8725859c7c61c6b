// 2-D convolution, NHWC activations, OHWI weights ([out][kh][kw][in/groups]), zero padding, groups.
#pragma once

#include <renaissance/core/shape.h>

#include <cstdint>

namespace renaissance::cpu {

struct Conv2dParams {
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;  // zero padding on both sides
  int groups = 1;            // groups == in_channels: depthwise (out = in·multiplier)
};

/// How a pass is computed (forward and backward data; the weight gradient is always im2col + GEMM).
/// Gemm: im2col (none for 1×1 stride-1 unpadded) + SGEMM, col2im for dx, direct loops for depthwise.
/// Xnnpack: XNNPACK's convolution (forward) or deconvolution (dx); Gemm when built without XNNPACK.
/// Auto: the faster one measured on the 2-core EPYC (docs/kernels-cpu.md): XNNPACK for every forward,
/// and for dx of ungrouped, non-1×1 convolutions; Gemm otherwise. Any buffer is safe with either (the
/// XNNPACK path runs the last sample from a copy, since XNNPACK reads 16 bytes past its input).
enum class Conv2dAlgo : std::uint8_t { Auto, Gemm, Xnnpack };

/// Output shape: OH = (H + 2·pad_h − kernel_h) / stride_h + 1 (likewise OW), C = out_channels.
/// Throws Error when the parameters do not fit the input.
Shape conv2d_output_shape(const Shape& x, std::int64_t out_channels, const Conv2dParams& p);
/// Elements of the weight tensor: out_channels · kernel_h · kernel_w · (in_channels / groups).
std::int64_t conv2d_weight_elems(std::int64_t in_channels, std::int64_t out_channels, const Conv2dParams& p);
bool xnnpack_available();

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
                            const Conv2dParams& p, bool accumulate);

}  // namespace renaissance::cpu
