#include <renaissance/core/dtype.h>
#include <renaissance/core/error.h>
#include <renaissance/core/shape.h>

#include <fmt/format.h>

namespace renaissance {

std::string Shape::str() const { return fmt::format("{}x{}x{}x{}", n, h, w, c); }
std::string Shape::str_hwc() const { return fmt::format("{}x{}x{}", h, w, c); }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::F32, DType::F16, DType::I32, DType::I8, DType::U8})
    if (s == dtype_name(t)) return t;
  RN_FAIL("unknown dtype '{}' (known: f32, f16, i32, i8, u8)", s);
}

}  // namespace renaissance
