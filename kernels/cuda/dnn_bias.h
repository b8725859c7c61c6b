// Small row kernels around the cuDNN convolutions and cuBLASLt matrix products: bias add, a deterministic bias
// gradient, and the strided row copy used to stage padded-channel tensors. Rows are (n,h,w) rows of an NHWC tensor
// (or matrix rows); `ld` is the elements between consecutive rows; only the first `channels` are touched.
#pragma once

#include <kernels/cuda/common.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::cuda {

/// y[r, c] += bias[c] for r < rows, c < channels. y is F32 or F16 (FP32 arithmetic, one rounding); bias is FP32.
void add_bias_rows(cudaStream_t stream, void* y, DType dtype, std::int64_t rows, std::int64_t channels,
                   std::int64_t ld, const float* bias);

/// Workspace bytes `bias_grad_rows` needs for this size (a multiple of 256; 0 never).
std::size_t bias_grad_workspace_bytes(std::int64_t rows, std::int64_t channels);

/// db[c] = alpha · Σ_r dy[r, c] (+ db[c] when accumulate). Two passes with a fixed summation order that depends only
/// on (rows, channels): bit-identical on every run and inside CUDA graphs. dy is F32 or F16; db is FP32.
void bias_grad_rows(cudaStream_t stream, const void* dy, DType dtype, std::int64_t rows, std::int64_t channels,
                    std::int64_t ld, float* db, bool accumulate, float alpha, void* workspace,
                    std::size_t workspace_bytes);

/// dst[r, c] = src[r, c] + beta · dst[r, c] for c < channels (beta == 0: dst is not read, so it may hold NaN).
/// src and dst have the same dtype (F32 or F16) and may have different row strides.
void copy_rows(cudaStream_t stream, const void* src, std::int64_t src_ld, void* dst, std::int64_t dst_ld,
               DType dtype, std::int64_t rows, std::int64_t channels, float beta);

}  // namespace renaissance::cuda
