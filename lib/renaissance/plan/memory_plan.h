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
/// Gradient buffers live at once in the backward walk (a slot is allocated only when used: the plan holds
/// max_slots() of them). Three nested residual blocks with projection shortcuts and BN/ReLU need 5; 4 refused them.
constexpr int kMaxGradSlots = 8;

/// Program points [first, last] (closed) during which a tensor's bytes hold a value some later node still needs.
/// Points number the top-level nodes of the train step, then of validation, in replay order (liveness.h).
struct LiveInterval {
  std::int32_t first = 0, last = -1;
  friend bool operator==(LiveInterval a, LiveInterval b) { return a.first == b.first && a.last == b.last; }
};
/// Disjoint intervals in ascending order; empty: never live.
using Lifetime = std::vector<LiveInterval>;
bool lifetimes_intersect(const Lifetime& a, const Lifetime& b);

/// The activation pool: F_FEATURE_FP32 F_GRAD_SLOT_FP32 F_FEATURE_FP16 F_GRAD_SLOT_FP16, adjacent in address order.
/// With lifetimes set (MemoryPlan::set_lifetimes), its tensors are placed by liveness: two of them may share bytes
/// when their lifetimes are disjoint. No RANGE op spans a pool region.
bool is_pool_region(Region r);
constexpr Region kPoolFirst = Region::F_FEATURE_FP32;
constexpr Region kPoolLast = Region::F_GRAD_SLOT_FP16;

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
  /// With liveness-based reuse: one gradient buffer of the backward pass (F_GRAD_SLOT_*), its bytes placed by its
  /// lifetime instead of being one of the <= 4 fixed slots.
  TensorId alloc_grad_buffer(const std::string& name, const Shape& s, DType t, std::int64_t min_slot = 0);
  /// A view of a gradient buffer or slot `owner` with its own shape. Same offset as the owner.
  TensorId alias_grad(const std::string& name, TensorId owner, const Shape& s, DType t);
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

  /// Enables liveness-based reuse of the activation pool: the lifetime of every pool tensor that owns bytes
  /// (aliases included). Call before finalize(); a pool owner missing here is treated as live throughout.
  void set_lifetimes(std::map<TensorId, Lifetime> owners);
  bool reuses_memory() const { return m_reuse; }
  const std::map<TensorId, Lifetime>& lifetimes() const { return m_lifetimes; }

  /// Assigns offsets with one cursor walking the regions in address order, then validates. With lifetimes, the
  /// activation pool is placed first-fit among the tensors whose lifetimes intersect (several orders, the smallest
  /// pool wins), or copied from `same_layout` (another variant's finalized plan with the same pool tensors, slots and
  /// lifetimes, so the placement is done once per compile); validate() checks the result either way.
  void finalize(const MemoryPlan* same_layout = nullptr);
  bool finalized() const { return m_finalized; }

  // ---- the four validations (also callable on a tampered plan, for tests) ----
  void check_region_order() const;           ///< each tensor inside its region; regions in address order
  void check_contiguity() const;             ///< ranges spanned by RANGE ops have no holes
  void check_layer_correspondence() const;   ///< W/G/A/G16/E/E16/M/V/N agree per parameter kind
  void check_alignment() const;              ///< every offset and slot on 256 bytes
  /// No two non-aliasing slots share a byte, unless both are pool tensors whose lifetimes are disjoint.
  void check_no_overlap() const;
  void validate() const;

  ByteRange region_range(Region r) const;
  /// The bytes a RANGE op spans: from the first region's start to the last region's end.
  ByteRange resolve_region_bounds(RegionRange r) const;
  std::int64_t total_bytes() const { return m_total; }
  /// The activation pool's bytes (the hull of the pool regions).
  ByteRange pool_range() const;
  /// The bytes the pool would take with no reuse: the sum of its owners' slots.
  std::int64_t pool_slot_bytes() const;
  /// With lifetimes: the most pool bytes live at any one program point, a lower bound for any placement.
  std::int64_t pool_peak_live_bytes() const;

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
  /// The tensor whose bytes `id` views: its owner if it is an alias, else itself (kNoTensor stays kNoTensor).
  TensorId owner_of(TensorId id) const {
    const auto it = m_alias_of.find(id);
    return it == m_alias_of.end() ? id : it->second;
  }

  friend bool operator==(const MemoryPlan& a, const MemoryPlan& b);
  friend bool operator!=(const MemoryPlan& a, const MemoryPlan& b) { return !(a == b); }

  /// Rebuilds a plan from serialised parts (no re-validation of offsets beyond validate()).
  static MemoryPlan from_parts(std::string variant, std::vector<DTensor> tensors, std::map<TensorId, TensorId> aliases,
                               std::vector<ByteRange> regions, std::int64_t total, bool reuse = false,
                               std::map<TensorId, Lifetime> lifetimes = {});
  const std::vector<ByteRange>& region_ranges() const { return m_regions; }

 private:
  TensorId add(const std::string& name, const Shape& s, DType t, Region r, std::int64_t min_slot);
  bool is_owner(const DTensor& t) const { return !m_alias_of.count(t.id); }
  std::int64_t place_pool(std::int64_t start, const MemoryPlan* same_layout);  // returns the pool's bytes
  /// First fit of `items` (pool owners) in a few orders; offsets relative to the pool start into `best`.
  std::int64_t place_first_fit(const std::vector<DTensor*>& items, std::vector<std::int64_t>& best) const;
  std::string m_variant;
  std::vector<DTensor> m_tensors;          // index == id
  std::map<std::string, TensorId> m_by_name;
  std::map<TensorId, TensorId> m_alias_of;  // grad views -> their slot
  int m_grad_slots = 0;
  std::vector<ByteRange> m_regions = std::vector<ByteRange>(kNamedRegions);
  std::int64_t m_total = 0;
  bool m_finalized = false;
  bool m_reuse = false;
  std::map<TensorId, Lifetime> m_lifetimes;  // pool owners -> their lifetimes (reuse only)
};

}  // namespace renaissance::plan
