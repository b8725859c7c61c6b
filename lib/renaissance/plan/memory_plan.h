// MemoryPlan: every tensor of one variant, its region and its byte offset in the arena (DESIGN §5).
#pragma once

#include <renaissance/core/dtensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::plan {

/// (offset, bytes) of a region or region range in the arena.
struct ByteRange {
  std::int64_t offset = 0;
  std::int64_t bytes = 0;
  std::int64_t end() const { return offset + bytes; }
  friend bool operator==(ByteRange a, ByteRange b) { return a.offset == b.offset && a.bytes == b.bytes; }
};

/// Region ranges that RANGE ops span as one: they must be contiguous.
std::vector<RegionRange> contiguous_ranges();
/// Gradient bucket 1 (G_DEEP_CONV) and bucket 2 (G_BN_BIAS..G_FIRST_CONV).
constexpr RegionRange kGradBucketDeep{Region::G_DEEP_CONV, Region::G_DEEP_CONV};
constexpr RegionRange kGradBucketFirst{Region::G_BN_BIAS, Region::G_FIRST_CONV};
constexpr int kMaxGradSlots = 4;

class MemoryPlan {
 public:
  MemoryPlan() = default;
  explicit MemoryPlan(std::string variant) : m_variant(std::move(variant)) {}

  // ---- semantic allocation (names are "<layer>.<tensor>") ----
  TensorId alloc_feature(const std::string& name, const Shape& s, DType t, std::int64_t min_slot = 0);
  /// One of the <= 4 reusable gradient slots (F_GRAD_SLOT_*), sized by the caller (largest feature).
  TensorId alloc_grad_slot(int index, const Shape& s, DType t, std::int64_t min_slot = 0);
  /// A view of a gradient slot with its own shape: the gradient of one feature. Same offset as the slot.
  TensorId alias_grad_slot(const std::string& name, int slot_index, const Shape& s, DType t);
  /// A feature computed in place over another feature `base` (same bytes): ReLU over a BN output, the residual
  /// sum over its main branch. The compiler only aliases a tensor whose value nothing reads afterwards.
  TensorId alias_feature(const std::string& name, TensorId base, const Shape& s, DType t);
  TensorId alloc_master(ParamKind k, const std::string& name, const Shape& s);     ///< W_*
  TensorId alloc_ema(ParamKind k, const std::string& name, const Shape& s);        ///< E_*
  TensorId alloc_ema_fp16(ParamKind k, const std::string& name, const Shape& s);   ///< E_*_FP16
  TensorId alloc_compute_weight(ParamKind k, const std::string& name, const Shape& s);  ///< A_* (FP16)
  TensorId alloc_grad(ParamKind k, const std::string& name, const Shape& s);       ///< G_*
  TensorId alloc_grad_fp16(ParamKind k, const std::string& name, const Shape& s);  ///< G_*_FP16
  TensorId alloc_momentum(ParamKind k, const std::string& name, const Shape& s);   ///< M_*
  TensorId alloc_second_moment(ParamKind k, const std::string& name, const Shape& s);  ///< V_*
  TensorId alloc_lars_norm(ParamKind k, const std::string& name);                   ///< N_*: {‖w‖, ‖g‖}
  TensorId alloc_bn_stat(Region r, const std::string& name, std::int64_t channels);  ///< B_* (FP32)
  /// Scalars, temporaries, masks, results, inputs: any region outside the parameter families.
  TensorId alloc_other(Region r, const std::string& name, const Shape& s, DType t, std::int64_t min_slot = 0);

  /// Assigns offsets with one cursor walking the regions in address order, then validates.
  void finalize();
  bool finalized() const { return m_finalized; }

  // ---- the four validations (also callable on a tampered plan, for tests) ----
  void check_region_order() const;           ///< each tensor inside its region; regions in address order
  void check_contiguity() const;             ///< ranges spanned by RANGE ops have no holes
  void check_layer_correspondence() const;   ///< W/G/A/G16/E/E16/M/V/N agree per parameter kind
  void check_alignment() const;              ///< every offset and slot on 256 bytes
  void check_no_overlap() const;             ///< no two non-aliasing slots share a byte
  void validate() const;

  ByteRange region_range(Region r) const;
  /// The bytes a RANGE op spans: from the first region's start to the last region's end.
  ByteRange resolve_region_bounds(RegionRange r) const;
  std::int64_t total_bytes() const { return m_total; }

  const std::string& variant() const { return m_variant; }
  const std::vector<DTensor>& tensors() const { return m_tensors; }
  const DTensor& tensor(TensorId id) const;
  DTensor& mutable_tensor(TensorId id);  ///< tests plant faults through this
  TensorId find(const std::string& name) const;  ///< kNoTensor if absent
  TensorId at(const std::string& name) const;    ///< throws naming the tensor
  std::int64_t region_tensor_count(Region r) const;
  /// Tensor ids of one region in address order.
  std::vector<TensorId> region_tensors(Region r) const;
  /// Aliases: view id -> the owning tensor (a gradient slot, or the feature an in-place result overwrites).
  const std::map<TensorId, TensorId>& aliases() const { return m_alias_of; }

  friend bool operator==(const MemoryPlan& a, const MemoryPlan& b);
  friend bool operator!=(const MemoryPlan& a, const MemoryPlan& b) { return !(a == b); }

  /// Rebuilds a plan from serialised parts (no re-validation of offsets beyond validate()).
  static MemoryPlan from_parts(std::string variant, std::vector<DTensor> tensors, std::map<TensorId, TensorId> aliases,
                               std::vector<ByteRange> regions, std::int64_t total);
  const std::vector<ByteRange>& region_ranges() const { return m_regions; }

 private:
  TensorId add(const std::string& name, const Shape& s, DType t, Region r, std::int64_t min_slot);
  std::string m_variant;
  std::vector<DTensor> m_tensors;          // index == id
  std::map<std::string, TensorId> m_by_name;
  std::map<TensorId, TensorId> m_alias_of;  // grad views -> their slot
  int m_grad_slots = 0;
  std::vector<ByteRange> m_regions = std::vector<ByteRange>(kNamedRegions);
  std::int64_t m_total = 0;
  bool m_finalized = false;
};

}  // namespace renaissance::plan
