#include <renaissance/core/error.h>
#include <renaissance/runtime/arena_keeper.h>
#include <renaissance/runtime/memory_guard.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/runtime_api.h>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace renaissance::runtime {

namespace {
std::atomic<std::int64_t> g_allocations{0};
}

ArenaKeeper::ArenaKeeper(Backend backend, std::int64_t bytes) : m_backend(backend), m_bytes(bytes) {
  RN_CHECK(bytes > 0, "arena size must be positive, got {}", bytes);
  const std::size_t n = static_cast<std::size_t>((bytes + 255) / 256 * 256);
  if (backend == Backend::CUDA) {
#ifdef RENAISSANCE_HAVE_CUDA
    guard_device_memory({"the arena", static_cast<std::int64_t>(n), 0, 0});
    // Zeroed like the CPU arena: slot padding must read as zeros for whole-range ops.
    m_base = static_cast<std::byte*>(cuda::device_alloc(static_cast<std::int64_t>(n), "the arena"));
    ++g_allocations;
    return;
#else
    RN_FAIL("this build has no CUDA backend (configure with -DRENAISSANCE_CUDA=ON on a machine with the toolkit)");
#endif
  }
  // 2 MiB aligned and marked for transparent huge pages (Linux, THP "madvise" mode as on Debian): every step streams
  // the whole activation pool, and 4 KiB pages cost a TLB miss every 1,024 floats.
  constexpr std::size_t kHuge = 2u << 20;
  const std::size_t huge_n = (n + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, huge_n);
  if (!p)
    throw Error(fmt::format("cannot allocate the {:.2f} GiB arena", static_cast<double>(bytes) / (1 << 30)), "arena",
                "reduce --batch or the resolution; `renaissance plan` shows the arena size");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, huge_n, MADV_HUGEPAGE);  // advice only: without THP the arena works the same
#endif
  // Zeroed: padding bytes of every slot must stay zero so whole-range ops (NaN check, optimizers) see zeros.
  std::memset(p, 0, huge_n);
  m_base = static_cast<std::byte*>(p);
  ++g_allocations;
}

ArenaKeeper::~ArenaKeeper() {
  if (m_backend == Backend::CUDA) {
#ifdef RENAISSANCE_HAVE_CUDA
    cuda::device_free(m_base);
#endif
    return;
  }
  std::free(m_base);
}

std::int64_t ArenaKeeper::allocation_count() { return g_allocations.load(); }

}  // namespace renaissance::runtime
