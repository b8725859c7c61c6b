#include <renaissance/core/dtensor.h>
#include <renaissance/core/error.h>

#include <algorithm>

namespace renaissance {

std::int64_t channel_alignment(DType dtype, Region region) {
  if (dtype == DType::F16 && (region == Region::I_A_DATA || region == Region::I_B_DATA)) return kAmpInputChannelAlign;
  if (dtype == DType::F16 && (region == Region::F_FEATURE_FP16 || region == Region::F_GRAD_SLOT_FP16)) return 8;
  if (dtype == DType::I8 && region == Region::S_MASK) return 8;
  return 1;
}

std::int64_t compute_slot_bytes(const Shape& shape, DType dtype, Region region) {
  RN_CHECK(shape.n >= 0 && shape.h >= 0 && shape.w >= 0 && shape.c >= 0, "negative shape {} in region {}",
           shape.str(), region_name(region));
  // At most 2^46 elements (256 TiB of FP32): the slot sizes and their sums then stay far inside int64. A batch or
  // dataset size out of all proportion (plan --batch 9000000000000000) used to wrap around.
  constexpr long double kMaxElems = static_cast<long double>(std::int64_t(1) << 46);
  RN_CHECK(static_cast<long double>(shape.n) * shape.h * shape.w * (shape.c + 8) <= kMaxElems,
           "shape {} in region {} has more than 2^46 elements (hint: a batch or resolution far too large?)", shape.str(),
           region_name(region));
  const std::int64_t elems = shape.n * shape.h * shape.w * align_up(shape.c, channel_alignment(dtype, region));
  switch (dtype) {
    case DType::F16: return align256(2 * elems + kSlotSpareBytes);
    case DType::I8:
    case DType::U8: return align256(elems + kSlotSpareBytes);
    case DType::F32:
    case DType::I32: return 2 * align256(2 * elems + kSlotSpareBytes);
  }
  return 0;
}

Strides compact_strides(const Shape& s) { return padded_strides(s, 1); }

Strides padded_strides(const Shape& s, std::int64_t c_align) {
  const std::int64_t c = align_up(s.c, c_align);
  return Strides{s.h * s.w * c, s.w * c, c, 1};
}

bool operator==(const DTensor& a, const DTensor& b) {
  return a.id == b.id && a.name == b.name && a.shape == b.shape && a.dtype == b.dtype && a.region == b.region &&
         a.offset == b.offset && a.slot_bytes == b.slot_bytes && a.cuda_strides == b.cuda_strides &&
         a.cpu_strides == b.cpu_strides;
}

DTensor make_dtensor(TensorId id, std::string name, const Shape& shape, DType dtype, Region region,
                     std::int64_t min_slot_bytes) {
  DTensor t;
  t.id = id;
  t.name = std::move(name);
  t.shape = shape;
  t.dtype = dtype;
  t.region = region;
  t.slot_bytes = std::max(compute_slot_bytes(shape, dtype, region), min_slot_bytes);
  t.cuda_strides = padded_strides(shape, channel_alignment(dtype, region));
  t.cpu_strides = compact_strides(shape);
  return t;
}

}  // namespace renaissance
