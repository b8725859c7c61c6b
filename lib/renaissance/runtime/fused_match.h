// What both backends' fused-layer matchers ask of resolved tensor views (runtime/cpu_ops.cpp, runtime/cuda_fused.cpp):
// the bytes a view occupies, whether two views overlap or are the same tensor, and whether other sub-nodes of a
// fused node read or write a view. Internal to the runtime.
#pragma once

#include <renaissance/runtime/exec_env.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace renaissance::runtime::fused_match {

/// Bytes [begin, end) a tensor view occupies in the arena (its padded storage).
inline std::pair<const std::byte*, const std::byte*> extent(const TensorView& v) {
  const auto bytes = v.shape.n * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  return {v.ptr, v.ptr + bytes};
}
inline bool overlaps(const TensorView& a, const TensorView& b) {
  if (!a.ptr || !b.ptr) return false;
  const auto [a0, a1] = extent(a);
  const auto [b0, b1] = extent(b);
  return a0 < b1 && b0 < a1;
}
inline bool is_float_feature(const TensorView& v) { return v.dtype == DType::F32 || v.dtype == DType::F16; }
inline bool same(const TensorView& a, const TensorView& b) {
  return a.ptr == b.ptr && a.shape == b.shape && a.dtype == b.dtype;
}

/// Does any sub-node other than those in `except` read (inputs) or, with `writes`, write (outputs) bytes of `v`,
/// among sub-nodes [from, to)?
inline bool touched_by_others(const std::vector<ResolvedNode>& sub, const TensorView& v,
                              std::initializer_list<int> except, bool reads, bool writes, std::size_t from = 0,
                              std::size_t to = SIZE_MAX) {
  to = std::min(to, sub.size());
  for (std::size_t i = from; i < to; ++i) {
    if (std::find(except.begin(), except.end(), static_cast<int>(i)) != except.end()) continue;
    if (reads)
      for (const TensorView& t : sub[i].in)
        if (overlaps(t, v)) return true;
    if (writes)
      for (const TensorView& t : sub[i].out)
        if (overlaps(t, v)) return true;
  }
  return false;
}

}  // namespace renaissance::runtime::fused_match
