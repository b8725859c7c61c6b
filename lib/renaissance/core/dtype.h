#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace renaissance {

/// Element types stored in the arena. Arithmetic is FP32 everywhere; F16 is a storage type (AMP).
enum class DType : std::uint8_t { F32, F16, I32, I8, U8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::I32: return 4;
    case DType::F16: return 2;
    case DType::I8: return 1;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t);
/// Parses "f32"/"f16"/"i32"/"i8"/"u8"; throws Error naming the value otherwise.
DType dtype_from_name(const std::string& s);

}  // namespace renaissance
