// DeviceContext: arena base + the plan's offsets. ptr_at(id) is one add: every variant shares the offsets.
#pragma once

#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/arena_keeper.h>

#include <cstddef>
#include <vector>

namespace renaissance::runtime {

/// A tensor resolved for one variant: what a kernel receives (pointer, shape, strides, dtype).
struct TensorView {
  std::byte* ptr = nullptr;
  Shape shape;
  DType dtype = DType::F32;
  Region region = Region::DEFAULT;
  Strides strides{};  ///< the backend's strides (CPU: compact; CUDA: channels padded)
  std::int64_t elems() const { return shape.elems(); }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(ptr);
  }
  explicit operator bool() const { return ptr != nullptr; }
};

/// One tensor inside a resolved region range: its byte offset from the range start and its element count.
struct Segment {
  std::int64_t offset = 0;
  std::int64_t elems = 0;
  DType dtype = DType::F32;
};

/// A region range resolved to bytes; RANGE ops sweep [ptr, ptr + bytes) in one pass.
struct RangeView {
  std::byte* ptr = nullptr;
  std::int64_t bytes = 0;
  RegionRange range;
  std::vector<Segment> segments;  ///< the tensors inside, in address order (LARS needs per-tensor norms)
};

class DeviceContext {
 public:
  DeviceContext(const ArenaKeeper& arena, const plan::CompiledPlan& plan);

  std::byte* ptr_at(TensorId id) const { return m_base + m_offsets[static_cast<std::size_t>(id)]; }
  template <typename T>
  T* data(TensorId id) const {
    return reinterpret_cast<T*>(ptr_at(id));
  }
  TensorView view(TensorId id, plan::Variant v) const;

  /// Host <-> arena copies of whole tensors or byte ranges (memcpy on the CPU, synchronous cudaMemcpy on a GPU).
  /// For setup, per-epoch reads and checkpoints; never inside a captured step.
  void upload(TensorId id, const void* src, std::int64_t bytes) const { upload_at(ptr_at(id), src, bytes); }
  void download(TensorId id, void* dst, std::int64_t bytes) const { download_at(ptr_at(id), dst, bytes); }
  void upload_at(std::byte* dst, const void* src, std::int64_t bytes) const;
  void download_at(const std::byte* src, void* dst, std::int64_t bytes) const;
  /// Sets `bytes` bytes at `dst` (in the arena) to `value`, synchronously.
  void fill_at(std::byte* dst, int value, std::int64_t bytes) const;
  std::byte* base() const { return m_base; }
  RangeView range(RegionRange r, plan::Variant v) const;

  Backend backend() const { return m_backend; }
  const plan::CompiledPlan& plan() const { return m_plan; }

 private:
  Backend m_backend;
  std::byte* m_base;
  const plan::CompiledPlan& m_plan;
  std::vector<std::int64_t> m_offsets;
};

}  // namespace renaissance::runtime
