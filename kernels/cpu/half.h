// IEEE 754 binary16 <-> binary32 conversion in portable C++ (no F16C, no compiler _Float16), so the CPU
// backend reads and writes the FP16 regions of an AMP plan on any machine.
#pragma once

#include <cstdint>
#include <cstring>

namespace renaissance::cpu {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// binary16 -> binary32, exact for every input. NaN payloads are kept (shifted into the top mantissa
/// bits, quiet bit not forced), so half -> float -> half returns every one of the 65536 patterns.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));          // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + (127 - 15)) << 23) | (mant << 13));  // normal
  // Zero or subnormal: mant · 2^-24 is exact in float.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return bits_float(sign | float_bits(mag));
}

/// binary32 -> binary16 with round-to-nearest-even: overflow to ±inf (values ≥ 65520), subnormal
/// results below 2^-14, ±0 kept, NaN stays NaN with its top 10 payload bits (0x200 if those are 0).
inline std::uint16_t float_to_half(float f) {
  std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    if (x == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    const std::uint32_t payload = (x >> 13) & 0x3ffu;
    return static_cast<std::uint16_t>(sign | 0x7c00u | (payload ? payload : 0x200u));
  }
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520: rounds to inf
  if (x < 0x38800000u) {
    // Result is subnormal or zero (|f| < 2^-14): adding 0.5 aligns the float's mantissa so that its
    // low bits are the half subnormal, rounded to nearest even by the FPU itself.
    const float r = bits_float(x) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_bits(r) - 0x3f000000u));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // (15 − 127) << 23, plus the rounding bias
  return static_cast<std::uint16_t>(sign | (x >> 13));
}

}  // namespace renaissance::cpu
