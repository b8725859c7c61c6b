#include <renaissance/core/error.h>
#include <renaissance/plan/memory_plan.h>

#include <fmt/format.h>

#include <algorithm>

namespace renaissance::plan {

std::vector<RegionRange> contiguous_ranges() {
  return {
      {Region::B_PREV_MEAN, Region::B_NEXT_VAR},            // BN statistics (STATS_COMM, UPDATE_STATS)
      {Region::W_BN_BIAS, Region::W_DEEP_CONV},             // masters (optimizer, EMA)
      {Region::E_BN_BIAS, Region::E_DEEP_CONV},             // EMA
      {Region::E_FC_WEIGHT_FP16, Region::E_DEEP_CONV_FP16}, // EMA FP16 cast target
      {Region::A_FC_WEIGHT, Region::A_DEEP_CONV},           // W -> A cast target
      {Region::G_BN_BIAS, Region::G_DEEP_CONV},             // all gradients (zero-grad, NaN check)
      kGradBucketFirst,                                     // gradient bucket 2
      {Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16}, // G16 -> G cast source
      {Region::I_A_LABEL, Region::I_B_DATA},                // double-buffered input
  };
}

namespace {
void check_param_region(ParamKind k, Region r, const char* what) {
  RN_CHECK(r != Region::COUNT, "parameter kind {} has no {} region (only FC_WEIGHT, FIRST_CONV, DEEP_CONV do)",
           param_kind_name(k), what);
}
}  // namespace

TensorId MemoryPlan::add(const std::string& name, const Shape& s, DType t, Region r, std::int64_t min_slot) {
  RN_CHECK(!m_finalized, "memory plan '{}': cannot allocate '{}' after finalize()", m_variant, name);
  RN_CHECK(m_by_name.count(name) == 0, "memory plan '{}': tensor '{}' allocated twice", m_variant, name);
  RN_CHECK(s.n >= 0 && s.h >= 0 && s.w >= 0 && s.c >= 0, "memory plan '{}': tensor '{}' has negative shape {}",
           m_variant, name, s.str());
  const auto id = static_cast<TensorId>(m_tensors.size());
  m_tensors.push_back(make_dtensor(id, name, s, t, r, min_slot));
  m_by_name[name] = id;
  return id;
}

TensorId MemoryPlan::alloc_feature(const std::string& name, const Shape& s, DType t, std::int64_t min_slot) {
  RN_CHECK(t == DType::F32 || t == DType::F16, "feature '{}' must be f32 or f16", name);
  return add(name, s, t, t == DType::F32 ? Region::F_FEATURE_FP32 : Region::F_FEATURE_FP16, min_slot);
}
TensorId MemoryPlan::alloc_grad_slot(int index, const Shape& s, DType t, std::int64_t min_slot) {
  RN_CHECK(index == m_grad_slots && index < kMaxGradSlots, "gradient slot {} out of order or above the limit of {}",
           index, kMaxGradSlots);
  ++m_grad_slots;
  return add(fmt::format("grad_slot.{}", index), s, t, t == DType::F32 ? Region::F_GRAD_SLOT_FP32 : Region::F_GRAD_SLOT_FP16,
             min_slot);
}
TensorId MemoryPlan::alias_grad_slot(const std::string& name, int slot_index, const Shape& s, DType t) {
  const TensorId slot = at(fmt::format("grad_slot.{}", slot_index));
  const DTensor& st = m_tensors[static_cast<std::size_t>(slot)];
  RN_CHECK(st.dtype == t, "gradient view '{}' has dtype {} but slot {} is {}", name, dtype_name(t), slot_index,
           dtype_name(st.dtype));
  RN_CHECK(compute_slot_bytes(s, t, st.region) <= st.slot_bytes, "gradient view '{}' ({}) does not fit slot {}", name,
           s.str(), slot_index);
  const TensorId id = add(name, s, t, st.region, 0);
  m_tensors[static_cast<std::size_t>(id)].slot_bytes = 0;  // a view owns no bytes
  m_alias_of[id] = slot;
  return id;
}
TensorId MemoryPlan::alias_feature(const std::string& name, TensorId base, const Shape& s, DType t) {
  auto it = m_alias_of.find(base);
  const TensorId owner = it == m_alias_of.end() ? base : it->second;
  const DTensor& b = tensor(owner);
  RN_CHECK(b.region == Region::F_FEATURE_FP32 || b.region == Region::F_FEATURE_FP16,
           "in-place feature '{}' must alias a feature, not '{}' in {}", name, b.name, region_name(b.region));
  RN_CHECK(b.dtype == t, "in-place feature '{}' has dtype {} but '{}' is {}", name, dtype_name(t), b.name,
           dtype_name(b.dtype));
  RN_CHECK(compute_slot_bytes(s, t, b.region) <= b.slot_bytes, "in-place feature '{}' ({}) does not fit '{}'", name,
           s.str(), b.name);
  const TensorId id = add(name, s, t, b.region, 0);
  m_tensors[static_cast<std::size_t>(id)].slot_bytes = 0;  // owns no bytes
  m_alias_of[id] = owner;
  return id;
}

TensorId MemoryPlan::alloc_master(ParamKind k, const std::string& n, const Shape& s) {
  return add(n, s, DType::F32, master_region(k), 0);
}
TensorId MemoryPlan::alloc_ema(ParamKind k, const std::string& n, const Shape& s) {
  return add(n, s, DType::F32, ema_region(k), 0);
}
TensorId MemoryPlan::alloc_ema_fp16(ParamKind k, const std::string& n, const Shape& s) {
  check_param_region(k, ema_fp16_region(k), "EMA FP16");
  return add(n, s, DType::F16, ema_fp16_region(k), 0);
}
TensorId MemoryPlan::alloc_compute_weight(ParamKind k, const std::string& n, const Shape& s) {
  check_param_region(k, compute_region(k), "FP16 compute");
  return add(n, s, DType::F16, compute_region(k), 0);
}
TensorId MemoryPlan::alloc_grad(ParamKind k, const std::string& n, const Shape& s) {
  return add(n, s, DType::F32, grad_region(k), 0);
}
TensorId MemoryPlan::alloc_grad_fp16(ParamKind k, const std::string& n, const Shape& s) {
  check_param_region(k, grad_fp16_region(k), "FP16 gradient");
  return add(n, s, DType::F16, grad_fp16_region(k), 0);
}
TensorId MemoryPlan::alloc_momentum(ParamKind k, const std::string& n, const Shape& s) {
  return add(n, s, DType::F32, m_region(k), 0);
}
TensorId MemoryPlan::alloc_second_moment(ParamKind k, const std::string& n, const Shape& s) {
  return add(n, s, DType::F32, v_region(k), 0);
}
TensorId MemoryPlan::alloc_lars_norm(ParamKind k, const std::string& n) {
  check_param_region(k, n_region(k), "LARS norm");
  return add(n, Shape{1, 1, 1, 2}, DType::F32, n_region(k), 0);
}
TensorId MemoryPlan::alloc_bn_stat(Region r, const std::string& n, std::int64_t channels) {
  RN_CHECK(region_family(r) == RegionFamily::B, "'{}' is not a BN statistics region", region_name(r));
  return add(n, Shape{1, 1, 1, channels}, DType::F32, r, 0);
}
TensorId MemoryPlan::alloc_other(Region r, const std::string& n, const Shape& s, DType t, std::int64_t min_slot) {
  const RegionFamily f = region_family(r);
  RN_CHECK(f == RegionFamily::I || f == RegionFamily::S || f == RegionFamily::T || f == RegionFamily::R ||
               r == Region::W_EQ_BIAS || r == Region::W_EQ_SCALE,
           "tensor '{}': region {} has a semantic allocation call; use it", n, region_name(r));
  return add(n, s, t, r, min_slot);
}

void MemoryPlan::finalize() {
  RN_CHECK(!m_finalized, "memory plan '{}' finalized twice", m_variant);
  std::int64_t cursor = 0;
  for (int r = 0; r < kNamedRegions; ++r) {
    const std::int64_t start = cursor;
    for (DTensor& t : m_tensors) {
      if (region_index(t.region) != r || m_alias_of.count(t.id)) continue;
      t.offset = cursor;
      cursor += t.slot_bytes;
    }
    m_regions[static_cast<std::size_t>(r)] = ByteRange{start, cursor - start};
  }
  for (auto [view, slot] : m_alias_of) m_tensors[static_cast<std::size_t>(view)].offset = m_tensors[static_cast<std::size_t>(slot)].offset;
  m_total = cursor;
  m_finalized = true;
  validate();
}

void MemoryPlan::check_region_order() const {
  for (int r = 1; r < kNamedRegions; ++r) {
    const ByteRange& a = m_regions[static_cast<std::size_t>(r - 1)];
    const ByteRange& b = m_regions[static_cast<std::size_t>(r)];
    RN_CHECK(a.end() <= b.offset, "memory plan '{}': region {} ends at {} after region {} starts at {}", m_variant,
             region_name(region_at(r - 1)), a.end(), region_name(region_at(r)), b.offset);
  }
  for (const DTensor& t : m_tensors) {
    const ByteRange& rr = m_regions[static_cast<std::size_t>(region_index(t.region))];
    const std::int64_t size = m_alias_of.count(t.id) ? 0 : t.slot_bytes;
    RN_CHECK(t.offset >= rr.offset && t.offset + size <= rr.end() && (size > 0 || t.offset < rr.end() || rr.bytes == 0),
             "memory plan '{}': tensor '{}' at [{}, {}) lies outside its region {} [{}, {})", m_variant, t.name,
             t.offset, t.offset + size, region_name(t.region), rr.offset, rr.end());
  }
}

void MemoryPlan::check_contiguity() const {
  for (RegionRange range : contiguous_ranges()) {
    for (int r = region_index(range.first); r < region_index(range.last); ++r) {
      const ByteRange& a = m_regions[static_cast<std::size_t>(r)];
      const ByteRange& b = m_regions[static_cast<std::size_t>(r + 1)];
      RN_CHECK(a.end() == b.offset, "memory plan '{}': range {} has a hole between {} (ends {}) and {} (starts {})",
               m_variant, range_name(range), region_name(region_at(r)), a.end(), region_name(region_at(r + 1)),
               b.offset);
    }
    // Inside a region the slots must tile it exactly, so one kernel can sweep the bytes.
    for (int r = region_index(range.first); r <= region_index(range.last); ++r) {
      std::int64_t sum = 0;
      for (const DTensor& t : m_tensors)
        if (region_index(t.region) == r && !m_alias_of.count(t.id)) sum += t.slot_bytes;
      RN_CHECK(sum == m_regions[static_cast<std::size_t>(r)].bytes,
               "memory plan '{}': region {} holds {} bytes of slots but spans {}", m_variant, region_name(region_at(r)),
               sum, m_regions[static_cast<std::size_t>(r)].bytes);
    }
  }
}

void MemoryPlan::check_layer_correspondence() const {
  auto shapes_of = [this](Region r) {
    std::vector<Shape> v;
    for (TensorId id : region_tensors(r)) v.push_back(tensor(id).shape);
    return v;
  };
  for (int ki = 0; ki < kParamKinds; ++ki) {
    const auto k = static_cast<ParamKind>(ki);
    const std::vector<Shape> w = shapes_of(master_region(k));
    auto expect = [&](Region r, bool optional, const char* what) {
      if (r == Region::COUNT) return;
      const std::vector<Shape> s = shapes_of(r);
      if (optional && s.empty()) return;
      RN_CHECK(s.size() == w.size(),
               "memory plan '{}': {} has {} tensors but {} has {} (every {} weight needs its {})", m_variant,
               region_name(r), s.size(), region_name(master_region(k)), w.size(), param_kind_name(k), what);
      for (std::size_t i = 0; i < s.size(); ++i)
        RN_CHECK(s[i] == w[i], "memory plan '{}': {}[{}] has shape {} but its weight {} has {}", m_variant,
                 region_name(r), i, s[i].str(), tensor(region_tensors(master_region(k))[i]).name, w[i].str());
    };
    expect(grad_region(k), false, "gradient");
    expect(ema_region(k), true, "EMA copy");
    expect(m_region(k), true, "first moment");
    expect(v_region(k), true, "second moment");
    if (has_fp16_twin(k)) {
      expect(compute_region(k), true, "FP16 copy");
      expect(grad_fp16_region(k), true, "FP16 gradient");
      expect(ema_fp16_region(k), true, "FP16 EMA copy");
      const auto a = shapes_of(compute_region(k)).size(), g16 = shapes_of(grad_fp16_region(k)).size();
      RN_CHECK(a == g16, "memory plan '{}': {} has {} tensors but {} has {}", m_variant,
               region_name(compute_region(k)), a, region_name(grad_fp16_region(k)), g16);
      const auto n = shapes_of(n_region(k)).size();
      RN_CHECK(n == 0 || n == w.size(), "memory plan '{}': {} has {} LARS norms for {} weights", m_variant,
               region_name(n_region(k)), n, w.size());
    }
  }
  // Whole-region casts need FP32 ranges exactly twice their FP16 twins.
  auto twice = [this](RegionRange f32, RegionRange f16) {
    const ByteRange a = resolve_region_bounds(f32), b = resolve_region_bounds(f16);
    RN_CHECK(b.bytes == 0 || a.bytes == 2 * b.bytes, "memory plan '{}': {} spans {} bytes, not twice {} ({} bytes)",
             m_variant, range_name(f32), a.bytes, range_name(f16), b.bytes);
  };
  twice({Region::W_FC_WEIGHT, Region::W_DEEP_CONV}, {Region::A_FC_WEIGHT, Region::A_DEEP_CONV});
  twice({Region::G_FC_WEIGHT, Region::G_DEEP_CONV}, {Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16});
  twice({Region::E_FC_WEIGHT, Region::E_DEEP_CONV}, {Region::E_FC_WEIGHT_FP16, Region::E_DEEP_CONV_FP16});
}

void MemoryPlan::check_alignment() const {
  for (const DTensor& t : m_tensors) {
    RN_CHECK(t.offset % kSlotAlignment == 0, "memory plan '{}': tensor '{}' at offset {} is not {}-byte aligned",
             m_variant, t.name, t.offset, kSlotAlignment);
    RN_CHECK(t.slot_bytes % kSlotAlignment == 0, "memory plan '{}': tensor '{}' has a slot of {} bytes, not a multiple of {}",
             m_variant, t.name, t.slot_bytes, kSlotAlignment);
  }
}

void MemoryPlan::check_no_overlap() const {
  std::vector<const DTensor*> owners;
  for (const DTensor& t : m_tensors)
    if (!m_alias_of.count(t.id) && t.slot_bytes > 0) owners.push_back(&t);
  std::sort(owners.begin(), owners.end(), [](const DTensor* a, const DTensor* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < owners.size(); ++i)
    RN_CHECK(owners[i - 1]->offset + owners[i - 1]->slot_bytes <= owners[i]->offset,
             "memory plan '{}': tensors '{}' and '{}' overlap", m_variant, owners[i - 1]->name, owners[i]->name);
  RN_CHECK(owners.empty() || owners.back()->offset + owners.back()->slot_bytes <= m_total,
           "memory plan '{}': tensor '{}' ends past the arena", m_variant, owners.back()->name);
}

void MemoryPlan::validate() const {
  try {
    check_region_order();
    check_contiguity();
    check_layer_correspondence();
    check_alignment();
    check_no_overlap();
  } catch (const Error& e) {
    throw e.with_context("memory plan validation");
  }
}

ByteRange MemoryPlan::region_range(Region r) const {
  RN_CHECK(m_finalized, "memory plan '{}': region_range before finalize()", m_variant);
  return m_regions[static_cast<std::size_t>(region_index(r))];
}

ByteRange MemoryPlan::resolve_region_bounds(RegionRange r) const {
  RN_CHECK(region_index(r.first) <= region_index(r.last), "region range {} is reversed", range_name(r));
  const ByteRange a = region_range(r.first), b = region_range(r.last);
  return ByteRange{a.offset, b.end() - a.offset};
}

const DTensor& MemoryPlan::tensor(TensorId id) const {
  RN_CHECK(id >= 0 && static_cast<std::size_t>(id) < m_tensors.size(), "memory plan '{}': no tensor id {}", m_variant,
           id);
  return m_tensors[static_cast<std::size_t>(id)];
}
DTensor& MemoryPlan::mutable_tensor(TensorId id) { return const_cast<DTensor&>(tensor(id)); }

TensorId MemoryPlan::find(const std::string& name) const {
  auto it = m_by_name.find(name);
  return it == m_by_name.end() ? kNoTensor : it->second;
}
TensorId MemoryPlan::at(const std::string& name) const {
  const TensorId id = find(name);
  RN_CHECK(id != kNoTensor, "memory plan '{}': no tensor named '{}'", m_variant, name);
  return id;
}

std::int64_t MemoryPlan::region_tensor_count(Region r) const {
  return static_cast<std::int64_t>(region_tensors(r).size());
}

std::vector<TensorId> MemoryPlan::region_tensors(Region r) const {
  std::vector<TensorId> v;
  for (const DTensor& t : m_tensors)
    if (t.region == r && !m_alias_of.count(t.id)) v.push_back(t.id);
  std::stable_sort(v.begin(), v.end(), [this](TensorId a, TensorId b) { return tensor(a).offset < tensor(b).offset; });
  return v;
}

bool operator==(const MemoryPlan& a, const MemoryPlan& b) {
  return a.m_variant == b.m_variant && a.m_tensors == b.m_tensors && a.m_alias_of == b.m_alias_of &&
         a.m_regions == b.m_regions && a.m_total == b.m_total && a.m_finalized == b.m_finalized;
}

MemoryPlan MemoryPlan::from_parts(std::string variant, std::vector<DTensor> tensors,
                                  std::map<TensorId, TensorId> aliases, std::vector<ByteRange> regions,
                                  std::int64_t total) {
  MemoryPlan p(std::move(variant));
  RN_CHECK(regions.size() == static_cast<std::size_t>(kNamedRegions), "serialised memory plan has {} regions, not {}",
           regions.size(), kNamedRegions);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    RN_CHECK(tensors[i].id == static_cast<TensorId>(i), "serialised memory plan: tensor ids out of order");
    p.m_by_name[tensors[i].name] = tensors[i].id;
  }
  p.m_tensors = std::move(tensors);
  p.m_alias_of = std::move(aliases);
  p.m_regions = std::move(regions);
  p.m_total = total;
  p.m_finalized = true;
  for (const DTensor& t : p.m_tensors)
    if (t.region == Region::F_GRAD_SLOT_FP32 || t.region == Region::F_GRAD_SLOT_FP16)
      if (!p.m_alias_of.count(t.id)) ++p.m_grad_slots;
  p.validate();
  return p;
}

}  // namespace renaissance::plan
