// The devices this build can run on, asked by the CLI (app/ includes no kernel headers, DESIGN §12).
#pragma once

#include <cstdint>
#include <string>

namespace renaissance::runtime {

/// Whether this build has the CUDA backend.
bool have_cuda_backend();
/// Number of visible CUDA devices; 0 without a CUDA backend, a driver or a device (never throws).
int cuda_device_count();
/// "NVIDIA H200, 139.8 GiB, sm_90" for CUDA device `index`; "unavailable" without a CUDA backend.
std::string cuda_device_description(int index);
/// Free and total bytes of the current CUDA device; both 0 without a CUDA backend.
void cuda_device_memory(std::int64_t* free_bytes, std::int64_t* total_bytes);
/// Threads of the CPU backend's kernel pool (the affinity mask, or RENAISSANCE_CPU_THREADS).
int cpu_threads();
/// The CPUs of this process's affinity mask (taskset, a Slurm step's cgroup, mpirun --bind-to).
int cpu_affinity_count();
/// Whether this build offers OpenBLAS as a CPU GEMM backend (RENAISSANCE_GEMM=openblas).
bool cpu_openblas_available();
/// The CPU backend's Winograd convolutions (cpu::set_conv2d_winograd): for plans made after the call. cpu_winograd():
/// whether plans take them, i.e. the setting is on and this CPU has the kernels (AVX-512 with oneDNN).
void set_cpu_winograd(bool on);
bool cpu_winograd();
/// The setting alone (--cpu-winograd, else RENAISSANCE_CPU_WINOGRAD, else on), whatever this CPU has.
bool cpu_winograd_requested();
/// The instruction-set level of the CPU backend's element-wise kernels: "avx512", "avx2" or "generic"
/// (cpu::vector_isa: the best this build and CPU have, or RENAISSANCE_CPU_ISA's).
const char* cpu_vector_isa();

}  // namespace renaissance::runtime
