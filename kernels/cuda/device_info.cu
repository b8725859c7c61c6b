#include <kernels/cuda/device_info.h>

#include <cuda_runtime.h>

#include <cstdio>

namespace renaissance::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "unavailable";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %.1f GiB, sm_%d%d", p.name,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
  return buf;
}

void device_memory(std::int64_t* free_bytes, std::int64_t* total_bytes) {
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) f = t = 0;
  *free_bytes = static_cast<std::int64_t>(f);
  *total_bytes = static_cast<std::int64_t>(t);
}

}  // namespace renaissance::cuda
