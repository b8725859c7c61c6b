// FNV-1a 64: the content hash of plans, layer trees and test digests (not for anything adversarial).
#pragma once

#include <cstddef>
#include <cstdint>

namespace renaissance {

inline constexpr std::uint64_t kFnv1aOffset = 1469598103934665603ull;

/// FNV-1a 64 over `n` bytes, continuing from `h` (kFnv1aOffset to start).
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = kFnv1aOffset) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace renaissance
