#include <renaissance/core/error.h>
#include <renaissance/plan/memory_plan.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <queue>
#include <set>

namespace renaissance::plan {

namespace {
constexpr std::int64_t kMaxArenaBytes = std::int64_t(1) << 52;  ///< 4 PiB: no device or host has it; sums stay in int64
}  // namespace

bool lifetimes_intersect(const Lifetime& a, const Lifetime& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].last < b[j].first) {
      ++i;
    } else if (b[j].last < a[i].first) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

bool is_pool_region(Region r) {
  return region_index(r) >= region_index(kPoolFirst) && region_index(r) <= region_index(kPoolLast);
}

std::vector<RegionRange> contiguous_ranges() {
  return {
      {Region::B_PREV_MEAN, Region::B_NEXT_VAR},            // BN statistics (STATS_COMM, UPDATE_STATS)
      {Region::W_BN_BIAS, Region::W_DEEP_CONV},             // masters (optimizer, EMA)
      {Region::E_BN_BIAS, Region::E_DEEP_CONV},             // EMA
      {Region::E_FC_WEIGHT_FP16, Region::E_DEEP_CONV_FP16}, // EMA FP16 cast target
      {Region::A_FC_WEIGHT, Region::A_DEEP_CONV},           // W -> A cast target
      {Region::G_BN_BIAS, Region::G_DEEP_CONV},             // all gradients (zero-grad, NaN check)
      kGradBucketFirst,                                     // gradient bucket 2
      {Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16}, // G16 (zero-grad)
      {Region::G_FC_WEIGHT_FP16, Region::G_FIRST_CONV_FP16}, // G16 -> G cast source, bucket 2 part
      {Region::G_FC_WEIGHT, Region::G_FIRST_CONV},           // G16 -> G cast target, bucket 2 part
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
  RN_CHECK(m_by_name.count(name) == 0,
           "memory plan '{}': tensor '{}' allocated twice (two layers whose names give the same tensor name, as a "
           "layer 'c' fused from conv, bn and relu and a layer 'c.conv' do: rename one of them)",
           m_variant, name);
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
  return alias_grad(name, at(fmt::format("grad_slot.{}", slot_index)), s, t);
}
TensorId MemoryPlan::alloc_grad_buffer(const std::string& name, const Shape& s, DType t, std::int64_t min_slot) {
  RN_CHECK(t == DType::F32 || t == DType::F16, "gradient buffer '{}' must be f32 or f16", name);
  return add(name, s, t, t == DType::F32 ? Region::F_GRAD_SLOT_FP32 : Region::F_GRAD_SLOT_FP16, min_slot);
}
TensorId MemoryPlan::alias_grad(const std::string& name, TensorId owner, const Shape& s, DType t) {
  const DTensor& st = tensor(owner);
  RN_CHECK((st.region == Region::F_GRAD_SLOT_FP32 || st.region == Region::F_GRAD_SLOT_FP16) && !m_alias_of.count(owner),
           "gradient view '{}' must view a gradient slot or buffer, not '{}' in {}", name, st.name,
           region_name(st.region));
  RN_CHECK(st.dtype == t, "gradient view '{}' has dtype {} but '{}' is {}", name, dtype_name(t), st.name,
           dtype_name(st.dtype));
  RN_CHECK(compute_slot_bytes(s, t, st.region) <= st.slot_bytes, "gradient view '{}' ({}) does not fit '{}'", name,
           s.str(), st.name);
  const Region region = st.region;
  const TensorId id = add(name, s, t, region, 0);
  m_tensors[static_cast<std::size_t>(id)].slot_bytes = 0;  // a view owns no bytes
  m_alias_of[id] = owner;
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

void MemoryPlan::set_lifetimes(std::map<TensorId, Lifetime> owners) {
  RN_CHECK(!m_finalized, "memory plan '{}': lifetimes set after finalize()", m_variant);
  for (const auto& [id, life] : owners) {
    const DTensor& t = tensor(id);
    RN_CHECK(is_pool_region(t.region) && !m_alias_of.count(id),
             "memory plan '{}': '{}' in {} gets a lifetime but only owners in the activation pool can share bytes",
             m_variant, t.name, region_name(t.region));
    for (std::size_t i = 0; i < life.size(); ++i)
      RN_CHECK(life[i].first <= life[i].last && (i == 0 || life[i - 1].last < life[i].first),
               "memory plan '{}': lifetime of '{}' is not ascending disjoint intervals", m_variant, t.name);
  }
  m_lifetimes = std::move(owners);
  m_reuse = true;
}

std::int64_t MemoryPlan::place_pool(std::int64_t start, const MemoryPlan* same_layout) {
  std::vector<DTensor*> items;
  for (DTensor& t : m_tensors)
    if (is_pool_region(t.region) && is_owner(t)) items.push_back(&t);
  const std::size_t n = items.size();
  std::vector<std::int64_t> best(n);
  std::int64_t best_bytes = 0;
  if (same_layout) {
    RN_CHECK(same_layout->m_finalized && same_layout->m_reuse && same_layout->m_lifetimes == m_lifetimes &&
                 same_layout->pool_range().offset == start && same_layout->m_tensors.size() == m_tensors.size(),
             "memory plan '{}': cannot take the pool layout of '{}' (different pool)", m_variant, same_layout->m_variant);
    for (std::size_t i = 0; i < n; ++i) {
      const DTensor& o = same_layout->tensor(items[i]->id);
      RN_CHECK(o.name == items[i]->name && o.slot_bytes == items[i]->slot_bytes,
               "memory plan '{}': '{}' differs from '{}' in plan '{}'", m_variant, items[i]->name, o.name,
               same_layout->m_variant);
      best[i] = o.offset - start;
      best_bytes = std::max(best_bytes, best[i] + o.slot_bytes);
    }
  } else {
    best_bytes = place_first_fit(items, best);
  }
  for (std::size_t i = 0; i < n; ++i) items[i]->offset = start + best[i];
  const std::int64_t bytes = best_bytes;
  for (int r = region_index(kPoolFirst); r <= region_index(kPoolLast); ++r) {
    std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = start;
    for (const DTensor* t : items)
      if (region_index(t->region) == r) {
        lo = std::min(lo, t->offset);
        hi = std::max(hi, t->offset + t->slot_bytes);
      }
    m_regions[static_cast<std::size_t>(r)] = lo > hi ? ByteRange{start, 0} : ByteRange{lo, hi - lo};
  }
  return bytes;
}

namespace {

/// Above this many pool owners the pairwise first fit below gives way to a sweep over time. The pairwise search is
/// quadratic in the owners: in a deep net every forward activation is still live at the turn of the step, so nearly
/// every pair conflicts (11,000 layers took 50 s, 100,000 never ended). Every zoo model stays below the limit.
constexpr std::size_t kPairwisePlacementMax = 2048;

/// Linear-scan placement, O(n log n): owners in order of their first use, each at the best-fitting free block left
/// by owners whose last use is past (blocks coalesce), else on top. A lifetime counts as its hull [first, last], a
/// superset, so no two owners that are live together can share bytes (check_no_overlap proves it after finalize).
std::int64_t place_by_sweep(const std::vector<std::int64_t>& bytes, const std::vector<LiveInterval>& hull,
                            std::vector<std::int64_t>& off) {
  const std::size_t n = bytes.size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return hull[a].first < hull[b].first; });
  std::map<std::int64_t, std::int64_t> free_at;              // offset -> size
  std::set<std::pair<std::int64_t, std::int64_t>> by_size;  // (size, offset)
  using Active = std::pair<std::int32_t, std::size_t>;       // (last use, owner)
  std::priority_queue<Active, std::vector<Active>, std::greater<Active>> active;
  std::int64_t top = 0;
  auto release = [&](std::size_t i) {
    std::int64_t o = off[i], size = bytes[i];
    auto next = free_at.lower_bound(o);
    if (next != free_at.end() && next->first == o + size) {
      size += next->second;
      by_size.erase({next->second, next->first});
      next = free_at.erase(next);
    }
    if (next != free_at.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == o) {
        o = prev->first;
        size += prev->second;
        by_size.erase({prev->second, prev->first});
        free_at.erase(prev);
      }
    }
    free_at[o] = size;
    by_size.insert({size, o});
  };
  for (std::size_t i : order) {
    off[i] = 0;
    if (bytes[i] == 0) continue;
    while (!active.empty() && active.top().first < hull[i].first) {
      release(active.top().second);
      active.pop();
    }
    const std::int64_t need = bytes[i];
    auto fit = by_size.lower_bound({need, std::numeric_limits<std::int64_t>::min()});
    if (fit != by_size.end()) {
      const auto [size, o] = *fit;
      by_size.erase(fit);
      free_at.erase(o);
      if (size > need) {
        free_at[o + need] = size - need;
        by_size.insert({size - need, o + need});
      }
      off[i] = o;
    } else if (!free_at.empty() && std::prev(free_at.end())->first + std::prev(free_at.end())->second == top) {
      const auto last = std::prev(free_at.end());
      off[i] = last->first;  // the free block at the top grows
      by_size.erase({last->second, last->first});
      free_at.erase(last);
      top = off[i] + need;
    } else {
      off[i] = top;
      top += need;
    }
    active.push({hull[i].last, i});
  }
  return top;
}

}  // namespace

std::int64_t MemoryPlan::place_first_fit(const std::vector<DTensor*>& items, std::vector<std::int64_t>& best) const {
  static const Lifetime kAlways{{0, std::numeric_limits<std::int32_t>::max()}};
  auto life = [this](const DTensor& t) -> const Lifetime& {
    auto it = m_lifetimes.find(t.id);
    return it == m_lifetimes.end() ? kAlways : it->second;
  };
  const std::size_t n = items.size();
  if (n > kPairwisePlacementMax) {
    std::vector<std::int64_t> bytes(n);
    std::vector<LiveInterval> hull(n);
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i] = items[i]->slot_bytes;
      const Lifetime& l = life(*items[i]);
      hull[i] = l.empty() ? LiveInterval{0, -1} : LiveInterval{l.front().first, l.back().last};
    }
    best.assign(n, 0);
    return place_by_sweep(bytes, hull, best);
  }
  // Which pairs may not share bytes (computed once for the strategies below).
  std::vector<std::vector<std::uint32_t>> conflicts(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (lifetimes_intersect(life(*items[i]), life(*items[j]))) {
        conflicts[i].push_back(static_cast<std::uint32_t>(j));
        conflicts[j].push_back(static_cast<std::uint32_t>(i));
      }
  auto start_of = [&](std::size_t i) { const Lifetime& l = life(*items[i]); return l.empty() ? 0 : l.front().first; };
  // First fit in a given order: each tensor at the lowest offset free of the placed tensors it conflicts with.
  // A few orders (largest first; earliest first; most conflicts first), the smallest pool wins; ties keep the first.
  std::vector<std::int64_t> off(n);
  std::int64_t best_bytes = std::numeric_limits<std::int64_t>::max();
  std::vector<std::pair<std::int64_t, std::int64_t>> busy;
  std::vector<char> placed(n);
  for (int strategy = 0; strategy < 3; ++strategy) {
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const std::int64_t sa = items[a]->slot_bytes, sb = items[b]->slot_bytes;
      if (strategy == 1 && start_of(a) != start_of(b)) return start_of(a) < start_of(b);
      if (strategy == 2 && conflicts[a].size() != conflicts[b].size()) return conflicts[a].size() > conflicts[b].size();
      return sa > sb;
    });
    std::fill(placed.begin(), placed.end(), 0);
    std::int64_t bytes = 0;
    for (std::size_t i : order) {
      busy.clear();
      for (std::uint32_t j : conflicts[i])
        if (placed[j]) busy.emplace_back(off[j], off[j] + items[j]->slot_bytes);
      std::sort(busy.begin(), busy.end());
      std::int64_t o = 0;
      for (auto [b, e] : busy) {
        if (b >= o + items[i]->slot_bytes) break;
        o = std::max(o, e);
      }
      off[i] = o;
      placed[i] = 1;
      bytes = std::max(bytes, o + items[i]->slot_bytes);
    }
    if (bytes < best_bytes) {
      best_bytes = bytes;
      best = off;
    }
  }
  return n ? best_bytes : 0;
}

void MemoryPlan::finalize(const MemoryPlan* same_layout) {
  RN_CHECK(!m_finalized, "memory plan '{}' finalized twice", m_variant);
  std::int64_t cursor = 0;
  for (int r = 0; r < kNamedRegions; ++r) {
    if (m_reuse && is_pool_region(region_at(r))) {
      if (region_at(r) == kPoolFirst) cursor += place_pool(cursor, same_layout);
      continue;
    }
    const std::int64_t start = cursor;
    for (DTensor& t : m_tensors) {
      if (region_index(t.region) != r || m_alias_of.count(t.id)) continue;
      t.offset = cursor;
      cursor += t.slot_bytes;
      RN_CHECK(cursor <= kMaxArenaBytes, "memory plan '{}': the arena would exceed {} bytes (at tensor '{}'; hint: a "
               "batch or resolution far too large?)", m_variant, kMaxArenaBytes, t.name);
    }
    m_regions[static_cast<std::size_t>(r)] = ByteRange{start, cursor - start};
  }
  for (auto [view, slot] : m_alias_of) m_tensors[static_cast<std::size_t>(view)].offset = m_tensors[static_cast<std::size_t>(slot)].offset;
  m_total = cursor;
  m_finalized = true;
  validate();
}

void MemoryPlan::check_region_order() const {
  const ByteRange pool = pool_range();
  for (int r = 1; r < kNamedRegions; ++r) {
    // With reuse the pool regions interleave inside the pool, which as a whole keeps its place in the order.
    const bool pa = m_reuse && is_pool_region(region_at(r - 1)), pb = m_reuse && is_pool_region(region_at(r));
    if (pa && pb) continue;
    const ByteRange& a = pa ? pool : m_regions[static_cast<std::size_t>(r - 1)];
    const ByteRange& b = pb ? pool : m_regions[static_cast<std::size_t>(r)];
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

namespace {
std::string lifetime_str(const Lifetime* l) {
  if (!l) return "live throughout";
  std::string s;
  for (const LiveInterval& i : *l) s += fmt::format("{}[{}, {}]", s.empty() ? "" : " ", i.first, i.last);
  return s.empty() ? "never live" : s;
}
}  // namespace

void MemoryPlan::check_no_overlap() const {
  std::vector<const DTensor*> owners;
  for (const DTensor& t : m_tensors)
    if (!m_alias_of.count(t.id) && t.slot_bytes > 0) owners.push_back(&t);
  auto life = [this](const DTensor* t) -> const Lifetime* {
    if (!m_reuse || !is_pool_region(t->region)) return nullptr;
    auto it = m_lifetimes.find(t->id);
    return it == m_lifetimes.end() ? nullptr : &it->second;
  };
  // Bytes may be shared only by two pool tensors that are never live at the same program point. Each tensor is a
  // set of rectangles (bytes x live interval); a sweep over program points keeps the byte ranges live at that point
  // in offset order, so a new range need only be checked against its two neighbours: O(n log n), where comparing
  // every pair of tensors whose bytes overlap was quadratic for deep nets.
  constexpr std::int64_t kAlwaysFirst = std::numeric_limits<std::int64_t>::min() / 2;
  constexpr std::int64_t kAlwaysEnd = std::numeric_limits<std::int64_t>::max() / 2;
  struct Event {
    std::int64_t point;
    int start;  // 0: an interval ends before this point; 1: one starts at it (ends go first)
    std::size_t owner;
  };
  std::vector<Event> events;
  for (std::size_t i = 0; i < owners.size(); ++i) {
    const DTensor* a = owners[i];
    RN_CHECK(a->offset + a->slot_bytes <= m_total, "memory plan '{}': tensor '{}' ends past the arena", m_variant,
             a->name);
    if (const Lifetime* l = life(a)) {
      for (const LiveInterval& iv : *l) {
        events.push_back({iv.first, 1, i});
        events.push_back({std::int64_t(iv.last) + 1, 0, i});
      }
    } else {
      events.push_back({kAlwaysFirst, 1, i});
      events.push_back({kAlwaysEnd, 0, i});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return x.point != y.point ? x.point < y.point : x.start < y.start;
  });
  auto key = [&](std::size_t i) { return std::pair<std::int64_t, std::size_t>(owners[i]->offset, i); };
  std::set<std::pair<std::int64_t, std::size_t>> live;  // (offset, owner)
  auto report = [&](std::size_t i, std::size_t j) {
    const DTensor* a = owners[i];
    const DTensor* b = owners[j];
    if (a->offset > b->offset) std::swap(a, b);
    RN_FAIL("memory plan '{}': tensors '{}' [{}, {}) and '{}' [{}, {}) overlap while both are live ({}; {})", m_variant,
            a->name, a->offset, a->offset + a->slot_bytes, b->name, b->offset, b->offset + b->slot_bytes,
            lifetime_str(life(a)), lifetime_str(life(b)));
  };
  for (const Event& e : events) {
    if (!e.start) {
      live.erase(key(e.owner));
      continue;
    }
    const auto [it, inserted] = live.insert(key(e.owner));
    const DTensor* t = owners[e.owner];
    if (std::next(it) != live.end() && owners[std::next(it)->second]->offset < t->offset + t->slot_bytes)
      report(e.owner, std::next(it)->second);
    if (it != live.begin()) {
      const DTensor* p = owners[std::prev(it)->second];
      if (p->offset + p->slot_bytes > t->offset) report(e.owner, std::prev(it)->second);
    }
  }
}

ByteRange MemoryPlan::pool_range() const {
  std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
  for (int r = region_index(kPoolFirst); r <= region_index(kPoolLast); ++r) {
    const ByteRange& b = m_regions[static_cast<std::size_t>(r)];
    lo = std::min(lo, b.offset);
    hi = std::max(hi, b.end());
  }
  return ByteRange{lo, hi - lo};
}

std::int64_t MemoryPlan::pool_slot_bytes() const {
  std::int64_t sum = 0;
  for (const DTensor& t : m_tensors)
    if (is_pool_region(t.region) && is_owner(t)) sum += t.slot_bytes;
  return sum;
}

std::int64_t MemoryPlan::pool_peak_live_bytes() const {
  if (!m_reuse) return pool_slot_bytes();
  std::int64_t always = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> events;  // (point, +bytes at first / -bytes after last)
  for (const DTensor& t : m_tensors) {
    if (!is_pool_region(t.region) || !is_owner(t)) continue;
    auto it = m_lifetimes.find(t.id);
    if (it == m_lifetimes.end()) {
      always += t.slot_bytes;
      continue;
    }
    for (const LiveInterval& i : it->second) {
      events.emplace_back(static_cast<std::int64_t>(i.first) * 2 + 1, t.slot_bytes);
      events.emplace_back(static_cast<std::int64_t>(i.last) * 2 + 2, -t.slot_bytes);
    }
  }
  std::sort(events.begin(), events.end());  // at one key, releases (even keys) come before the next point's uses
  std::int64_t live = 0, peak = 0;
  for (auto [k, d] : events) {
    live += d;
    peak = std::max(peak, live);
  }
  return always + peak;
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
         a.m_regions == b.m_regions && a.m_total == b.m_total && a.m_finalized == b.m_finalized &&
         a.m_reuse == b.m_reuse && a.m_lifetimes == b.m_lifetimes;
}

MemoryPlan MemoryPlan::from_parts(std::string variant, std::vector<DTensor> tensors,
                                  std::map<TensorId, TensorId> aliases, std::vector<ByteRange> regions,
                                  std::int64_t total, bool reuse, std::map<TensorId, Lifetime> lifetimes) {
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
  if (reuse) p.set_lifetimes(std::move(lifetimes));
  p.m_finalized = true;
  for (const DTensor& t : p.m_tensors)
    if (t.name.rfind("grad_slot.", 0) == 0 && !p.m_alias_of.count(t.id)) ++p.m_grad_slots;
  p.validate();
  return p;
}

}  // namespace renaissance::plan
