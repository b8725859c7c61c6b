// ArenaKeeper: the one device allocation of a rank, sized by the largest variant (DESIGN §7).
#pragma once

#include <renaissance/core/backend.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::runtime {

using renaissance::Backend;  // core/backend.h
using renaissance::backend_name;

class ArenaKeeper {
 public:
  /// Allocates `bytes` once (CPU: 256-byte aligned and zeroed). Throws Error naming the size on failure.
  ArenaKeeper(Backend backend, std::int64_t bytes);
  ~ArenaKeeper();
  ArenaKeeper(const ArenaKeeper&) = delete;
  ArenaKeeper& operator=(const ArenaKeeper&) = delete;

  std::byte* base() const { return m_base; }
  std::int64_t bytes() const { return m_bytes; }
  Backend backend() const { return m_backend; }

  /// Arena allocations made by this process so far (tests: exactly one per rank).
  static std::int64_t allocation_count();

 private:
  Backend m_backend;
  std::int64_t m_bytes;
  std::byte* m_base = nullptr;
};

}  // namespace renaissance::runtime
