#include <kernels/cuda/dnn_handles.h>

#include <map>
#include <memory>
#include <mutex>

namespace renaissance::cuda {

DnnHandles::DnnHandles() {
  CUDA_CHECK(cudaGetDevice(&m_device));
  CUDNN_CHECK(cudnnCreate(&m_cudnn));
  try {
    CUBLAS_CHECK(cublasLtCreate(&m_cublaslt));
  } catch (...) {
    CUDNN_CHECK_NOTHROW(cudnnDestroy(m_cudnn));
    throw;
  }
}

DnnHandles::~DnnHandles() {
  if (m_cublaslt) CUBLAS_CHECK_NOTHROW(cublasLtDestroy(m_cublaslt));
  if (m_cudnn) CUDNN_CHECK_NOTHROW(cudnnDestroy(m_cudnn));
}

DnnHandles& DnnHandles::for_device(int device) {
  // Never destroyed: at static destruction the CUDA runtime may already be gone, and cudnnDestroy would fail.
  static std::mutex mutex;
  static auto* handles = new std::map<int, std::unique_ptr<DnnHandles>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles->find(device);
  if (it != handles->end()) return *it->second;
  int previous = 0;
  CUDA_CHECK(cudaGetDevice(&previous));
  CUDA_CHECK(cudaSetDevice(device));
  std::unique_ptr<DnnHandles> h;
  try {
    h = std::make_unique<DnnHandles>();
  } catch (...) {
    CUDA_CHECK_NOTHROW(cudaSetDevice(previous));
    throw;
  }
  CUDA_CHECK(cudaSetDevice(previous));
  return *((*handles)[device] = std::move(h));
}

void DnnHandles::set_stream(cudaStream_t stream) {
  CUDNN_CHECK(cudnnSetStream(m_cudnn, stream));
  m_stream = stream;
}

}  // namespace renaissance::cuda
