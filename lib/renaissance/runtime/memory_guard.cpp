#include <renaissance/core/error.h>
#include <renaissance/runtime/memory_guard.h>

#include <fmt/format.h>

#include <algorithm>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/device_info.h>
#endif

namespace renaissance::runtime {

std::string gib(std::int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

std::int64_t default_margin_bytes(std::int64_t device_total_bytes) {
  return std::max<std::int64_t>(std::int64_t(256) << 20, device_total_bytes / 50);
}

void check_device_memory(const DeviceMemoryNeed& need, std::int64_t free_bytes, std::int64_t total_bytes) {
  RN_CHECK(need.arena_bytes >= 0 && need.workspace_bytes >= 0 && need.margin_bytes >= 0,
           "internal: negative device memory request for {}", need.what);
  if (free_bytes < 0 || need.total() <= free_bytes) return;
  throw Error(fmt::format("{} needs {} of GPU memory (arena {} + workspace {} + margin {}) but only {} of {} are free",
                          need.what, gib(need.total()), gib(need.arena_bytes), gib(need.workspace_bytes),
                          gib(need.margin_bytes), gib(free_bytes), gib(total_bytes)),
              "GPU memory",
              "use a smaller --batch (the arena grows with it) or --amp (FP16 activations halve it), or free the "
              "GPU; `renaissance plan --batch N` shows the arena size");
}

void guard_device_memory(DeviceMemoryNeed need) {
#ifdef RENAISSANCE_HAVE_CUDA
  std::int64_t free_b = 0, total_b = 0;
  cuda::device_memory(&free_b, &total_b);
  if (total_b <= 0) return;  // no answer from the driver: cudaMalloc will say what is wrong
  if (need.margin_bytes == 0) need.margin_bytes = default_margin_bytes(total_b);
  check_device_memory(need, free_b, total_b);
#else
  (void)need;
#endif
}

}  // namespace renaissance::runtime
