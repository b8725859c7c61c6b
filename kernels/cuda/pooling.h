// Max pooling and global average pooling over NHWC on the GPU, mirroring kernels/cpu/pooling.h. FP32 or FP16
// storage (FP32 arithmetic); each tensor has its own c_stride; output padding channels are written 0.
#pragma once

#include <kernels/cuda/common.h>

#include <cuda_runtime.h>

namespace renaissance::cuda {

struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;  // implicit −inf padding; at most half the kernel (as PyTorch)
};

/// OH = (H + 2·pad_h − kernel_h) / stride_h + 1 (floor), likewise OW; N and C unchanged. Throws on invalid params.
Shape maxpool2d_output_shape(const Shape& x, const Pool2dParams& p);

/// y[n,oh,ow,c] = max over the window; argmax (DType U8, y's shape, own c_stride) = the position in the window,
/// kh·kernel_w + kw, of the first maximum in (kh, kw) order (a NaN in the window's first in-range position wins, as
/// on the CPU; windows of at most 255 positions). argmax padding channels get 255. x and y: same dtype.
void maxpool2d_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y, const TensorRef& argmax,
                       const Pool2dParams& p);
/// dx[n,ih,iw,c] (=|+=) Σ dy[n,oh,ow,c] over the windows covering (ih,iw) whose argmax points at (ih,iw), in (oh, ow)
/// order: a gather (each dx element owned by one thread), so no atomics and the CPU's summation order.
void maxpool2d_backward(cudaStream_t stream, const TensorRef& dy, const TensorRef& argmax, const TensorRef& dx,
                        const Pool2dParams& p, bool accumulate);

/// y[n,c] = (Σ_{h,w} x[n,h,w,c]) / (H·W), summed in FP32 in (h, w) order; y is (N,1,1,C).
void global_avgpool_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y);
/// dx[n,h,w,c] (=|+=) dy[n,c] / (H·W).
void global_avgpool_backward(cudaStream_t stream, const TensorRef& dy, const TensorRef& dx, bool accumulate);

}  // namespace renaissance::cuda
