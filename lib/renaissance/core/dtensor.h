// DTensor: a descriptor of a tensor in the arena, never an owner (DESIGN §5).
#pragma once

#include <renaissance/core/dtype.h>
#include <renaissance/core/region.h>
#include <renaissance/core/shape.h>

#include <array>
#include <cstdint>
#include <string>

namespace renaissance {

using TensorId = std::int32_t;
constexpr TensorId kNoTensor = -1;

constexpr std::int64_t kSlotAlignment = 256;  ///< every slot starts and ends on 256 bytes
constexpr std::int64_t kSlotSpareBytes = 16;  ///< XNN_EXTRA_BYTES: kernels may over-read 16 bytes

constexpr std::int64_t align256(std::int64_t v) { return align_up(v, kSlotAlignment); }

/// AMP: the data buffer's channels (the first conv's input) are padded to a multiple of this. 8 FP16 channels are
/// 16 bytes per pixel, what cuDNN's tensor-core convolutions need: with 4, ResNet-50's 7x7 stem took 4 ms of a 37 ms
/// step on an H200 (`renaissance bench --profile`).
constexpr std::int64_t kAmpInputChannelAlign = 8;

/// The most image channels a model's input may have: the input pipeline normalises at most this many per pixel
/// (runtime/data_pipeline.cpp, kernels/cuda/augment.cu).
constexpr std::int64_t kMaxImageChannels = 16;

/// Channel alignment of a tensor: kAmpInputChannelAlign for FP16 in I_*_DATA, 8 for FP16 in F_FEATURE_FP16 /
/// F_GRAD_SLOT_FP16, 8 for INT8 in S_MASK, else 1.
std::int64_t channel_alignment(DType dtype, Region region);

/// Slot size in bytes (DESIGN §5): elems = N·H·W·align(C);
/// FP16: align256(2·elems + 16); INT8/U8: align256(elems + 16); FP32/INT32: 2 × align256(2·elems + 16).
/// The FP32 slot of a shape is exactly twice its FP16 slot, so whole-region casts are one kernel.
std::int64_t compute_slot_bytes(const Shape& shape, DType dtype, Region region);

/// NHWC element strides (n, h, w, c).
using Strides = std::array<std::int64_t, 4>;
Strides compact_strides(const Shape& s);
Strides padded_strides(const Shape& s, std::int64_t c_align);

struct DTensor {
  TensorId id = kNoTensor;
  std::string name;  ///< "<layer>.<tensor>", unique in a plan
  Shape shape;
  DType dtype = DType::F32;
  Region region = Region::DEFAULT;
  std::int64_t offset = -1;  ///< bytes from the arena base; set by MemoryPlan::finalize
  std::int64_t slot_bytes = 0;
  Strides cuda_strides{};  ///< channels padded to channel_alignment(dtype, region)
  Strides cpu_strides{};   ///< compact

  std::int64_t bytes() const { return shape.elems() * static_cast<std::int64_t>(dtype_size(dtype)); }
  friend bool operator==(const DTensor& a, const DTensor& b);
  friend bool operator!=(const DTensor& a, const DTensor& b) { return !(a == b); }
};

/// Builds a DTensor with strides and slot bytes filled in; slot = max(own slot, min_slot_bytes).
DTensor make_dtensor(TensorId id, std::string name, const Shape& shape, DType dtype, Region region,
                     std::int64_t min_slot_bytes = 0);

}  // namespace renaissance
