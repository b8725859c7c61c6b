#include <renaissance/core/error.h>
#include <renaissance/runtime/memory_guard.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

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

namespace {
/// The first number in a small text file (a cgroup's memory.max or memory.current); -1 for "max", a missing file or
/// no number.
std::int64_t read_number(const char* path) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return -1;
  try {
    return std::stoll(word);
  } catch (...) {
    return -1;
  }
}
}  // namespace

std::int64_t host_available_bytes(std::int64_t* total) {
  std::int64_t avail = -1, mem_total = -1, cg_total = -1;
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    std::int64_t kib = 0;
    if (!(is >> key >> kib)) continue;
    if (key == "MemAvailable:") avail = kib * 1024;
    if (key == "MemTotal:") mem_total = kib * 1024;
  }
  // A cgroup limit (a Slurm job's --mem, a container's) binds before the machine's memory does: the tightest of
  // (limit - usage) over this process's memory cgroup and its parents, cgroup v2 or v1's memory controller.
  std::ifstream cg("/proc/self/cgroup");
  while (std::getline(cg, line)) {
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctrl = line.substr(a + 1, b - a - 1);
    const bool v2 = line.compare(0, a, "0") == 0 && ctrl.empty();
    const bool v1 = (',' + ctrl + ',').find(",memory,") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* max_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* used_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    for (std::string dir = line.substr(b + 1);;) {
      if (!dir.empty() && dir.back() == '/') dir.pop_back();
      const std::int64_t max = read_number((root + dir + max_file).c_str());
      const std::int64_t used = read_number((root + dir + used_file).c_str());
      // "max", a missing file, or v1's "no limit" (a huge number): anything at or above the machine's memory.
      if (max > 0 && (mem_total <= 0 || max < mem_total)) {
        const std::int64_t left = std::max<std::int64_t>(0, max - std::max<std::int64_t>(used, 0));
        avail = avail < 0 ? left : std::min(avail, left);
        cg_total = cg_total < 0 ? max : std::min(cg_total, max);
      }
      if (dir.empty()) break;
      const std::size_t up = dir.rfind('/');
      dir = up == std::string::npos ? std::string() : dir.substr(0, up);
    }
  }
  if (cg_total > 0) mem_total = mem_total < 0 ? cg_total : std::min(mem_total, cg_total);
  if (total) *total = mem_total;
  return avail;
}

void check_host_memory(const std::string& what, std::int64_t arena_bytes, std::int64_t available, std::int64_t total,
                       int ranks) {
  RN_CHECK(arena_bytes >= 0 && ranks >= 1, "internal: host memory request of {} ranks of {} for {}", ranks,
           arena_bytes, what);
  const long double need = static_cast<long double>(arena_bytes) * ranks;
  if (available < 0 || need <= available) return;
  const std::string needs =
      ranks == 1 ? fmt::format("{} of host memory for its arena", gib(arena_bytes))
                 : fmt::format("{} of host memory for the arenas of its {} ranks on this node ({} each)",
                               gib(static_cast<std::int64_t>(need)), ranks, gib(arena_bytes));
  throw Error(fmt::format("{} needs {} but only {} of {} are available", what, needs, gib(available),
                          total > 0 ? gib(total) : std::string("?")),
              "host memory",
              ranks == 1 ? "use a smaller --batch (the arena grows with it), or free memory; `renaissance plan --batch "
                           "N` shows the arena size"
                         : "use a smaller --batch (each rank's arena grows with its share), fewer ranks per node, or "
                           "free memory; `renaissance plan --batch N` shows one arena");
}

void guard_host_memory(const std::string& what, std::int64_t arena_bytes, int ranks) {
  std::int64_t total = -1;
  const std::int64_t avail = host_available_bytes(&total);
  check_host_memory(what, arena_bytes, avail, total, ranks);
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
