// Scratch memory of the CPU kernels: 64-byte aligned buffers that are reused across calls, so a training
// step allocates nothing once it has run once. Internal to kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace renaissance::cpu::detail {

/// An owned, 64-byte aligned float buffer that only grows (contents are not kept on growth).
class AlignedBuffer {
 public:
  float* get(std::size_t count) {
    if (count > m_capacity) {
      // Round up so that a slowly growing request does not reallocate each call. Buffers of 1 MiB and more (im2col
      // chunks, oneDNN's weight-gradient partials) are 2 MiB aligned and marked for transparent huge pages.
      constexpr std::size_t kHuge = 2u << 20;
      const bool huge = count * sizeof(float) >= (1u << 20);
      const std::size_t align = huge ? kHuge : 4096;
      const std::size_t bytes = ((count * sizeof(float) + align - 1) / align) * align;
      // The old buffer goes first, and with it the capacity: a failed allocation left the old capacity beside a null
      // pointer, so the next smaller request returned null (a oneDNN kernel then wrote through it: SIGSEGV under a
      // memory limit instead of the "out of host memory" error).
      m_data.reset();
      m_capacity = 0;
      m_data.reset(static_cast<float*>(std::aligned_alloc(huge ? kHuge : 64, bytes)));
      if (!m_data) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (huge) madvise(m_data.get(), bytes, MADV_HUGEPAGE);  // advice only
#endif
      m_capacity = bytes / sizeof(float);
    }
    return m_data.get();
  }
  float* data() const { return m_data.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> m_data;
  std::size_t m_capacity = 0;
};

/// Per-thread scratch slots; each kernel level uses its own slot so nested users never share one.
enum class ScratchSlot : int {
  PackA = 0,
  PackB,
  PackEdge,
  Col,
  Partial,
  DnnWeights,     // oneDNN: the weights in the primitive's format (the calling thread's)
  DnnScratchpad,  // oneDNN: a primitive's scratchpad (each running thread's)
  DnnTemp,        // oneDNN: an accumulating dx piece before it is added
  DnnPartial,     // oneDNN: the weight gradient's per-piece partial sums (the calling thread's)
  DnnActX,        // oneDNN Winograd: a piece's x or dx in nChw16c (each running thread's)
  DnnActY,        // oneDNN Winograd: a piece's y or dy in nChw16c (each running thread's)
  Count
};

/// `count` floats of this thread's scratch slot (valid until the next call with the same slot).
inline float* scratch(ScratchSlot slot, std::size_t count) {
  thread_local AlignedBuffer buffers[static_cast<int>(ScratchSlot::Count)];
  return buffers[static_cast<int>(slot)].get(count);
}

}  // namespace renaissance::cpu::detail
