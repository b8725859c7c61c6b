// Shared by every CUDA kernel: error checks, the device tensor reference kernels receive, launch helpers.
// Kernels get resolved tensors and their parameters, never the runtime (DESIGN §12).
#pragma once

#include <renaissance/core/dtype.h>
#include <renaissance/core/error.h>
#include <renaissance/core/shape.h>

#include <cuda_runtime.h>

#include <cstdint>

namespace renaissance::cuda {

/// An NHWC tensor in device memory. Storage is FP32 or FP16 (arithmetic is always FP32); each (n,h,w) row has
/// `c_stride` elements of which the first shape.c are real (FP16 features pad C to 8; padding is kept zero).
struct TensorRef {
  void* ptr = nullptr;
  Shape shape;
  DType dtype = DType::F32;
  std::int64_t c_stride = 0;  ///< elements between consecutive (n,h,w) rows; == shape.c when compact
  std::int64_t rows() const { return shape.n * shape.h * shape.w; }
  explicit operator bool() const { return ptr != nullptr; }
};

/// Grid size for `n` elements with `threads` per block, capped so huge ranges use grid-stride loops.
inline unsigned grid_for(std::int64_t n, int threads = 256, std::int64_t cap = 65535LL * 8) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

}  // namespace renaissance::cuda

/// CUDA_CHECK(expr): throws renaissance::Error with the CUDA error name, the call and file:line.
#define CUDA_CHECK(expr)                                                                                 \
  do {                                                                                                   \
    const cudaError_t rn_cuda_err_ = (expr);                                                             \
    if (rn_cuda_err_ != cudaSuccess)                                                                     \
      ::renaissance::detail::throw_error(__FILE__, __LINE__,                                             \
                                         ::fmt::format("{} failed: {} ({})", #expr,                      \
                                                       cudaGetErrorName(rn_cuda_err_),                    \
                                                       cudaGetErrorString(rn_cuda_err_)));               \
  } while (0)

/// After a <<<...>>> launch: reports a bad configuration at the launch site (asynchronous faults surface at the
/// next synchronising call).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/// CUDA_CHECK_NOTHROW(expr): for destructors; logs to stderr instead of throwing.
#define CUDA_CHECK_NOTHROW(expr)                                                                           \
  do {                                                                                                     \
    const cudaError_t rn_cuda_err_ = (expr);                                                               \
    if (rn_cuda_err_ != cudaSuccess)                                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorName(rn_cuda_err_)); \
  } while (0)
