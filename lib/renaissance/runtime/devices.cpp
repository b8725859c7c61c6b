#include <renaissance/runtime/devices.h>

#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/gemm.h>
#include <kernels/cpu/isa.h>
#include <kernels/cpu/thread_pool.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/device_info.h>
#endif

namespace renaissance::runtime {

#ifdef RENAISSANCE_HAVE_CUDA
bool have_cuda_backend() { return true; }
int cuda_device_count() { return cuda::device_count(); }
std::string cuda_device_description(int index) { return cuda::device_description(index); }
void cuda_device_memory(std::int64_t* free_bytes, std::int64_t* total_bytes) {
  cuda::device_memory(free_bytes, total_bytes);
}
#else
bool have_cuda_backend() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_description(int index) {
  (void)index;
  return "unavailable";
}
void cuda_device_memory(std::int64_t* free_bytes, std::int64_t* total_bytes) { *free_bytes = *total_bytes = 0; }
#endif

int cpu_threads() { return cpu::num_threads(); }
int cpu_affinity_count() { return cpu::affinity_cpu_count(); }
void set_cpu_winograd(bool on) { cpu::set_conv2d_winograd(on); }
bool cpu_winograd() { return cpu::conv2d_winograd() && cpu::conv2d_winograd_available(); }
bool cpu_winograd_requested() { return cpu::conv2d_winograd(); }
const char* cpu_vector_isa() { return cpu::vector_isa_name(cpu::vector_isa()); }
bool cpu_openblas_available() { return cpu::openblas_available(); }

}  // namespace renaissance::runtime
