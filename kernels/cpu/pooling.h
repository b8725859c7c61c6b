// Max pooling and global average pooling over NHWC tensors.
#pragma once

#include <renaissance/core/shape.h>
#include <renaissance/ops/pool.h>

#include <cstdint>

namespace renaissance::cpu {

struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;  // implicit −inf padding; at most half the kernel (as PyTorch)
};

/// OH = (H + 2·pad_h − kernel_h) / stride_h + 1 (floor, as PyTorch), likewise OW; C unchanged.
Shape maxpool2d_output_shape(const Shape& x, const Pool2dParams& p);

/// Largest window whose positions fit the one-byte argmax (kernel_h·kernel_w <= 255; 255 means "none").
constexpr int kMaxPoolWindow = ops::kMaxPoolWindow;

/// y[n,oh,ow,c] = max over the window of x; argmax (nullable, one byte per output) gets the winner's position in
/// its window, kh·kernel_w + kw, the first one in (kh, kw) order on ties.
void maxpool2d_forward(const float* x, const Shape& xs, float* y, const Shape& ys, const Pool2dParams& p,
                       std::uint8_t* argmax);
/// dx[n, window position argmax, c] += dy[n,oh,ow,c] (overlapping windows add up). Uses `argmax` when not null,
/// else recomputes the winners from x.
void maxpool2d_backward(const float* dy, const Shape& ys, const float* x, const std::uint8_t* argmax, float* dx,
                        const Shape& xs, const Pool2dParams& p, bool accumulate);

/// y[n,c] = (Σ_{h,w} x[n,h,w,c]) / (H·W); y has shape (N,1,1,C).
void global_avgpool_forward(const float* x, const Shape& xs, float* y);
/// dx[n,h,w,c] = dy[n,c] / (H·W).
void global_avgpool_backward(const float* dy, float* dx, const Shape& xs, bool accumulate);

}  // namespace renaissance::cpu
