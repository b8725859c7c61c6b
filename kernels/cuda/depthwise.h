// Own kernels for depthwise convolutions (groups == input channels, out = in · multiplier), NHWC with explicit row
// strides, OHWI weights ([out][kh][kw][1]), FP32 or FP16 storage with FP32 arithmetic. The same formulas as
// kernels/cpu/conv2d.h.
//
// Why they exist: cuDNN 9.14's deterministic engines for the data gradient of a strided depthwise convolution are
// slow on the H200 (MobileNetV2 b256 AMP: 112×112×96 3×3/s2 took 4.8 ms of a 26 ms step through the graph API's only
// deterministic engine, against ~0.3 ms that its bytes need; docs/kernels-cuda.md). ConvOp times these kernels
// beside cuDNN's engines and keeps the faster per pass (conv.h), so they run only where they win.
//
// Each output element is summed by one thread in a fixed order (no atomics): the passes are deterministic, and
// they never allocate, synchronise or read their output unless accumulating, so they can be captured.
#pragma once

#include <kernels/cuda/common.h>

#include <cstdint>
#include <string>

namespace renaissance::cuda {

/// A depthwise convolution as the own kernels see it. y.c == x.c · multiplier.
struct DepthwiseSpec {
  Shape x, y;                       ///< NHWC input and output
  std::int64_t x_cs = 0, y_cs = 0;  ///< row strides in elements (0: compact)
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  DType dtype = DType::F32;  ///< F32 or F16
};

/// Why the own kernels cannot run this convolution; empty when they can.
std::string depthwise_unsupported(const DepthwiseSpec& s);

/// y = conv(x, w) without bias. y's padding channels are not written.
void depthwise_forward(cudaStream_t stream, const DepthwiseSpec& s, const void* x, const void* w, void* y);

/// dx = ∂L/∂x from dy and w (accumulate: dx += ...; otherwise dx is not read). dx's padding is not written.
void depthwise_backward_data(cudaStream_t stream, const DepthwiseSpec& s, const void* dy, const void* w, void* dx,
                             bool accumulate);

}  // namespace renaissance::cuda
