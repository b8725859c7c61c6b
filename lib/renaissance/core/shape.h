#pragma once

#include <cstdint>
#include <string>

namespace renaissance {

/// A 4-D NHWC shape. Vectors are (N,1,1,C).
struct Shape {
  std::int64_t n = 0, h = 0, w = 0, c = 0;

  constexpr std::int64_t elems() const { return n * h * w * c; }
  constexpr std::int64_t per_sample() const { return h * w * c; }
  constexpr Shape with_batch(std::int64_t b) const { return Shape{b, h, w, c}; }
  constexpr bool valid() const { return n > 0 && h > 0 && w > 0 && c > 0; }
  std::string str() const;  // "NxHxWxC"
  std::string str_hwc() const;  // "HxWxC"

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    return a.n == b.n && a.h == b.h && a.w == b.w && a.c == b.c;
  }
  friend constexpr bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
};

constexpr std::int64_t align_up(std::int64_t v, std::int64_t a) { return (v + a - 1) / a * a; }

}  // namespace renaissance
