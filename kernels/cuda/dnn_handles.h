// cuDNN and cuBLASLt handles, their error checks, and the caller-owned workspace the DNN ops run in.
// Handles are made once per device at setup; nothing here allocates or synchronises while a plan runs.
#pragma once

#include <kernels/cuda/common.h>

#include <cublasLt.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdio>

namespace renaissance::cuda {

/// Device memory an op may use as scratch while it runs (one buffer sized at start-up from the ops'
/// `workspace_bytes()`). Ops never allocate: a workspace smaller than they need is an Error.
struct Workspace {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

/// A cudnnHandle_t and a cublasLtHandle_t of one device. The cuDNN handle is bound to one stream at a time
/// (`set_stream`); the ops rebind it to the stream they are given, so a DnnHandles belongs to one host thread.
class DnnHandles {
 public:
  /// Creates both handles on the current device.
  DnnHandles();
  ~DnnHandles();
  DnnHandles(const DnnHandles&) = delete;
  DnnHandles& operator=(const DnnHandles&) = delete;

  /// One DnnHandles per device for the whole process, made on first use (setup, never inside a capture) and
  /// never destroyed.
  static DnnHandles& for_device(int device);

  cudnnHandle_t cudnn() const { return m_cudnn; }
  cublasLtHandle_t cublaslt() const { return m_cublaslt; }
  int device() const { return m_device; }
  cudaStream_t stream() const { return m_stream; }
  /// Binds the cuDNN handle to `stream` (cuBLASLt takes its stream per call). Host-only, capture-safe.
  void set_stream(cudaStream_t stream);

 private:
  cudnnHandle_t m_cudnn = nullptr;
  cublasLtHandle_t m_cublaslt = nullptr;
  cudaStream_t m_stream = nullptr;
  int m_device = 0;
};

}  // namespace renaissance::cuda

/// CUDNN_CHECK(expr): throws renaissance::Error with the call, the cuDNN status, cuDNN's last error text and
/// file:line.
#define CUDNN_CHECK(expr)                                                                                   \
  do {                                                                                                      \
    const cudnnStatus_t rn_cudnn_st_ = (expr);                                                              \
    if (rn_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                                                             \
      char rn_cudnn_msg_[512] = {0};                                                                        \
      cudnnGetLastErrorString(rn_cudnn_msg_, sizeof rn_cudnn_msg_);                                         \
      ::renaissance::detail::throw_error(__FILE__, __LINE__,                                                \
                                         ::fmt::format("{} failed: {}{}{}", #expr,                          \
                                                       cudnnGetErrorString(rn_cudnn_st_),                   \
                                                       rn_cudnn_msg_[0] ? "; " : "", rn_cudnn_msg_));      \
    }                                                                                                       \
  } while (0)

/// CUBLAS_CHECK(expr): for cuBLASLt calls; throws renaissance::Error with the call, the status name and text,
/// and file:line.
#define CUBLAS_CHECK(expr)                                                                                  \
  do {                                                                                                      \
    const cublasStatus_t rn_cublas_st_ = (expr);                                                            \
    if (rn_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      ::renaissance::detail::throw_error(__FILE__, __LINE__,                                                \
                                         ::fmt::format("{} failed: {} ({})", #expr,                         \
                                                       cublasLtGetStatusName(rn_cublas_st_),                \
                                                       cublasLtGetStatusString(rn_cublas_st_)));            \
  } while (0)

/// Non-throwing variants for destructors: log to stderr.
#define CUDNN_CHECK_NOTHROW(expr)                                                                           \
  do {                                                                                                      \
    const cudnnStatus_t rn_cudnn_st_ = (expr);                                                              \
    if (rn_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                               \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudnnGetErrorString(rn_cudnn_st_)); \
  } while (0)

#define CUBLAS_CHECK_NOTHROW(expr)                                                                          \
  do {                                                                                                      \
    const cublasStatus_t rn_cublas_st_ = (expr);                                                            \
    if (rn_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                                 \
              cublasLtGetStatusName(rn_cublas_st_));                                                        \
  } while (0)
