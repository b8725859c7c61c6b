#include <renaissance/core/error.h>
#include <renaissance/runtime/device_context.h>

#include <cstring>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/runtime_api.h>
#endif

namespace renaissance::runtime {

DeviceContext::DeviceContext(const ArenaKeeper& arena, const plan::CompiledPlan& plan)
    : m_backend(arena.backend()), m_base(arena.base()), m_plan(plan) {
  RN_CHECK(arena.bytes() >= plan.arena_bytes(), "the arena has {} bytes but the plan needs {}", arena.bytes(),
           plan.arena_bytes());
  for (const DTensor& t : plan.memory[0].tensors()) m_offsets.push_back(t.offset);
}

TensorView DeviceContext::view(TensorId id, plan::Variant v) const {
  if (id == kNoTensor) return {};
  const DTensor& t = m_plan.plan(v).tensor(id);
  return TensorView{ptr_at(id), t.shape, t.dtype, t.region, m_backend == Backend::CPU ? t.cpu_strides : t.cuda_strides};
}

void DeviceContext::upload_at(std::byte* dst, const void* src, std::int64_t bytes) const {
  if (m_backend == Backend::CPU) {
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef RENAISSANCE_HAVE_CUDA
  cuda::copy_h2d(dst, src, bytes);
#endif
}

void DeviceContext::download_at(const std::byte* src, void* dst, std::int64_t bytes) const {
  if (m_backend == Backend::CPU) {
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef RENAISSANCE_HAVE_CUDA
  cuda::copy_d2h(dst, src, bytes);
#endif
}

void DeviceContext::fill_at(std::byte* dst, int value, std::int64_t bytes) const {
  if (m_backend == Backend::CPU) {
    std::memset(dst, value, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef RENAISSANCE_HAVE_CUDA
  cuda::fill_device(dst, value, bytes);
#endif
}

RangeView DeviceContext::range(RegionRange r, plan::Variant v) const {
  const plan::MemoryPlan& mp = m_plan.plan(v);
  const plan::ByteRange b = mp.resolve_region_bounds(r);
  RangeView out{m_base + b.offset, b.bytes, r, {}};
  for (int i = region_index(r.first); i <= region_index(r.last); ++i)
    for (TensorId id : mp.region_tensors(region_at(i))) {
      const DTensor& t = mp.tensor(id);
      out.segments.push_back({t.offset - b.offset, t.shape.elems(), t.dtype});
    }
  return out;
}

}  // namespace renaissance::runtime
