// The GPU-memory guard: before the arena and the workspace are allocated, compare what the plan needs with what the
// device has free, and refuse with the numbers and a hint instead of failing inside cudaMalloc (or, worse, inside
// cuDNN half-way through start-up). The decision is a pure function so it is testable without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace renaissance::runtime {

/// What a run will allocate on the device, before anything is allocated.
struct DeviceMemoryNeed {
  std::string what;                  ///< "model 'resnet50' (batch 4096, fp32)": named in the error
  std::int64_t arena_bytes = 0;      ///< the ArenaKeeper's one allocation
  std::int64_t workspace_bytes = 0;  ///< the one cuDNN/cuBLASLt workspace
  std::int64_t margin_bytes = 0;     ///< what we do not allocate ourselves (CUDA context, library handles)
  std::int64_t total() const { return arena_bytes + workspace_bytes + margin_bytes; }
};

/// Headroom for allocations outside the arena and workspace (cuDNN/cuBLAS handles and their scratch, the label
/// error counter, CUDA graphs): max(256 MiB, 2 % of the device).
std::int64_t default_margin_bytes(std::int64_t device_total_bytes);

/// Throws Error when need.total() exceeds `free_bytes`: the message names `need.what`, required vs available GiB
/// (arena, workspace and margin separately) and hints at a smaller --batch or --amp. `free_bytes` < 0 (unknown)
/// passes.
void check_device_memory(const DeviceMemoryNeed& need, std::int64_t free_bytes, std::int64_t total_bytes);

/// GPU builds: reads the current device's free/total memory (cudaMemGetInfo), fills in the margin when it is 0 and
/// calls check_device_memory. CPU-only builds: nothing.
void guard_device_memory(DeviceMemoryNeed need);

/// The host-memory guard (the CPU backend's arena lives in host memory): what this process can be given now, in
/// bytes: MemAvailable from /proc/meminfo, and inside a cgroup (v2 or v1) with a memory limit at most that limit less
/// what the cgroup uses. -1 where neither is known. *total (optional): MemTotal, or the cgroup's limit if smaller.
std::int64_t host_available_bytes(std::int64_t* total = nullptr);
/// Throws Error when `arena_bytes` exceeds `available` (< 0: unknown, passes): names `what`, the arena and what is
/// available, and hints at a smaller --batch. The rest of the run (weights' copies, loader buffers) is small beside
/// an arena that does not fit, so only the arena is compared.
/// `ranks`: the job's ranks on this node, each with an arena of `arena_bytes` (they share the node's memory).
void check_host_memory(const std::string& what, std::int64_t arena_bytes, std::int64_t available, std::int64_t total,
                       int ranks = 1);
/// check_host_memory with host_available_bytes().
void guard_host_memory(const std::string& what, std::int64_t arena_bytes, int ranks = 1);
/// "12.34 GiB"
std::string gib(std::int64_t bytes);

}  // namespace renaissance::runtime
