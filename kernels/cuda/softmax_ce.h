// Softmax cross-entropy with label smoothing (PyTorch semantics, mean over the batch) on the GPU, mirroring
// kernels/cpu/softmax_ce.h. Logits are (N,1,1,K) FP32 or FP16 storage with their c_stride; probabilities are FP32.
//
// Labels cannot throw on the device: a label outside [0, K) is clamped into range (to 0 or K−1) for the arithmetic
// and counted into `label_errors` (an int32 device counter, nullable; the caller zeroes it when it wants a fresh
// count and reads it whenever it reads results). Scalars that change per step (label smoothing, loss scale) are
// read from device memory, so captured graphs stay valid.
#pragma once

#include <kernels/cuda/common.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::cuda {

/// Device scratch bytes of softmax_ce_forward for a batch of n samples (8·n, rounded up).
std::size_t softmax_ce_workspace_bytes(std::int64_t batch);

/// probs = softmax(logits) per row (FP32, (N,1,1,K), padding channels 0); result[0] = loss·N with
/// loss = (1/N) Σ_n [(1−ε)·(−log p[n,t_n]) + ε·(1/K) Σ_k (−log p[n,k])] (per-sample FP64, summed in sample order,
/// exactly as the CPU: float(Σ/N)·float(N)). ε = *label_smoothing. Counts bad labels into label_errors.
void softmax_ce_forward(cudaStream_t stream, const TensorRef& logits, const std::int32_t* labels,
                        const float* label_smoothing, const TensorRef& probs, float* result, void* workspace,
                        std::size_t workspace_bytes, std::int32_t* label_errors);

/// dlogits (=|+=) (p − q)·(loss_scale/N), q = (1−ε)·onehot(t) + ε/K; loss_scale = *loss_scale (device). probs FP32
/// (N,1,1,K); dlogits (N,1,1,K) FP32 or FP16, padding channels 0. Bad labels are clamped (counted when label_errors
/// is not null).
void softmax_ce_backward(cudaStream_t stream, const TensorRef& probs, const std::int32_t* labels,
                         const float* label_smoothing, const float* loss_scale, const TensorRef& dlogits,
                         bool accumulate, std::int32_t* label_errors);

}  // namespace renaissance::cuda
