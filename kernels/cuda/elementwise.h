// Activations, residual addition, tensor copies (Flatten) and channel padding on the GPU: one memory pass each,
// mirroring kernels/cpu/elementwise.h. Tensors are NHWC rows with padded C (TensorRef); FP32 or FP16 storage,
// FP32 arithmetic. Outputs keep their padding channels zero (written as 0, or left alone when accumulating).
#pragma once

#include <kernels/cuda/common.h>
#include <renaissance/ops/activations.h>

#include <cuda_runtime.h>

namespace renaissance::cuda {

/// y = max(x, 0). x and y: same shape, dtype and c_stride (may alias).
void relu_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y);
/// dx (=|+=) dy · [y > 0], from the forward OUTPUT y. y, dy, dx: same layout.
void relu_backward(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& dx, bool accumulate);
/// dx = (dy + addend) · [y > 0]: a residual sum folded into the ReLU backward that consumes it (plan ADD_RELU_BWD).
/// The sum is rounded to the storage type first, as the ACCUMULATE it replaces stores it (same bits). All four: same
/// layout; dx may alias none of the inputs but y.
void relu_backward_sum(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& addend,
                       const TensorRef& dx);

/// y = tanh(x).
void tanh_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y);
/// dx (=|+=) dy · (1 − y²), from the forward output y.
void tanh_backward(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& dx, bool accumulate);

/// y = f(x) for an activation of ops/activations.h (its functor, as on the CPU). x and y: same layout.
void activation_forward(ops::Activation a, cudaStream_t stream, const TensorRef& x, const TensorRef& y);
/// dx (=|+=) dy · f'(x), from the forward INPUT x. x, dy, dx: same layout.
void activation_backward(ops::Activation a, cudaStream_t stream, const TensorRef& x, const TensorRef& dy,
                         const TensorRef& dx, bool accumulate);

/// y = a + b (residual join). a, b, y: same layout.
void add2_forward(cudaStream_t stream, const TensorRef& a, const TensorRef& b, const TensorRef& y);

/// dst (=|+=) src between tensors of equal element count, each read through its own shape and c_stride, in
/// logical NHWC order: this is Flatten forward/backward ((N,H,W,C) padded <-> (N,1,1,H·W·C) padded), a plain copy
/// between strides, and an FP32 <-> FP16 conversion when the dtypes differ. dst padding is written 0 (or left
/// alone when accumulating). Same layout and dtype without accumulation is a cudaMemcpyAsync.
void tensor_copy(cudaStream_t stream, const TensorRef& src, const TensorRef& dst, bool accumulate);
/// dst += src (gradient join): tensor_copy(stream, src, dst, true).
void accumulate(cudaStream_t stream, const TensorRef& src, const TensorRef& dst);

/// y[r, 0:C] = x[r, :], y[r, C:] = 0 (shortcut from C to C_out ≥ C channels). x (N,H,W,C), y (N,H,W,C_out), same dtype.
void channel_pad_forward(cudaStream_t stream, const TensorRef& x, const TensorRef& y);
/// dx[r, :] (=|+=) dy[r, 0:C]. dy (N,H,W,C_out), dx (N,H,W,C), same dtype.
void channel_pad_backward(cudaStream_t stream, const TensorRef& dy, const TensorRef& dx, bool accumulate);

}  // namespace renaissance::cuda
