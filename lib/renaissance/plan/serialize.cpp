// Binary serialisation of a CompiledPlan (for the MPI broadcast) and its content hash (FNV-1a 64).
#include <renaissance/core/error.h>
#include <renaissance/core/hash.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/plan/fusion.h>

#include <cstring>
#include <type_traits>
#include <variant>

namespace renaissance::plan {

namespace {

constexpr char kMagic[8] = {'R', 'N', 'P', 'L', 'A', 'N', '0', '5'};

class Writer {
 public:
  std::vector<std::uint8_t> buf;
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    buf.insert(buf.end(), b, b + n);
  }
  void u8(std::uint8_t v) { raw(&v, 1); }
  void i32(std::int32_t v) { raw(&v, 4); }
  void i64(std::int64_t v) { raw(&v, 8); }
  void u64(std::uint64_t v) { raw(&v, 8); }
  void b(bool v) { u8(v ? 1 : 0); }
  void str(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    raw(s.data(), s.size());
  }
  void shape(const Shape& s) {
    i64(s.n);
    i64(s.h);
    i64(s.w);
    i64(s.c);
  }
};

class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : m_p(p), m_n(n) {}
  void raw(void* dst, std::size_t n) {
    RN_CHECK(m_pos + n <= m_n, "serialised plan is truncated at byte {} of {}", m_pos, m_n);
    std::memcpy(dst, m_p + m_pos, n);
    m_pos += n;
  }
  std::uint8_t u8() { std::uint8_t v; raw(&v, 1); return v; }
  std::int32_t i32() { std::int32_t v; raw(&v, 4); return v; }
  std::int64_t i64() { std::int64_t v; raw(&v, 8); return v; }
  std::uint64_t u64() { std::uint64_t v; raw(&v, 8); return v; }
  bool b() { return u8() != 0; }
  std::size_t count(std::size_t max = 1u << 28) {
    const std::int64_t n = i64();
    RN_CHECK(n >= 0 && static_cast<std::size_t>(n) <= max && static_cast<std::size_t>(n) <= m_n - m_pos + max,
             "serialised plan: bad count {} at byte {}", n, m_pos);
    return static_cast<std::size_t>(n);
  }
  std::string str() {
    const std::size_t n = count();
    RN_CHECK(m_pos + n <= m_n, "serialised plan is truncated at byte {} of {}", m_pos, m_n);
    std::string s(reinterpret_cast<const char*>(m_p + m_pos), n);
    m_pos += n;
    return s;
  }
  Shape shape() {
    Shape s;
    s.n = i64();
    s.h = i64();
    s.w = i64();
    s.c = i64();
    return s;
  }
  template <typename E>
  E enumv(int count) {
    const int v = u8();
    RN_CHECK(v < count, "serialised plan: enum value {} out of range at byte {}", v, m_pos);
    return static_cast<E>(v);
  }
  std::size_t pos() const { return m_pos; }
  bool done() const { return m_pos == m_n; }

 private:
  const std::uint8_t* m_p;
  std::size_t m_n, m_pos = 0;
};

// The variant's index, then every field in field-list order (ops/params.h): i64, or u8 for bool.
void write_params(Writer& w, const LayerParams& p) {
  w.u8(static_cast<std::uint8_t>(p.index()));
  std::visit(
      [&w](const auto& q) {
        ops::for_each_field(q, [&w](const char*, const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>)
            w.b(v);
          else
            w.i64(v);
        });
      },
      p);
}

template <std::size_t I = 0>
LayerParams params_of_tag(std::size_t tag, std::size_t pos) {
  if constexpr (I < std::variant_size_v<LayerParams>) {
    if (tag == I) return LayerParams(std::in_place_index<I>);
    return params_of_tag<I + 1>(tag, pos);
  } else {
    RN_FAIL("serialised plan: bad layer parameter tag at byte {}", pos);
  }
}

LayerParams read_params(Reader& r) {
  const std::uint8_t tag = r.u8();
  LayerParams p = params_of_tag(tag, r.pos());
  std::visit(
      [&r](auto& q) {
        ops::for_each_field(q, [&r](const char*, auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>)
            v = r.b();
          else
            v = r.i64();
        });
      },
      p);
  return p;
}

void write_ids(Writer& w, const std::vector<TensorId>& v) {
  w.i64(static_cast<std::int64_t>(v.size()));
  for (TensorId t : v) w.i32(t);
}
std::vector<TensorId> read_ids(Reader& r) {
  std::vector<TensorId> v(r.count());
  for (TensorId& t : v) t = r.i32();
  return v;
}
void write_ranges(Writer& w, const std::vector<RegionRange>& v) {
  w.i64(static_cast<std::int64_t>(v.size()));
  for (RegionRange x : v) {
    w.u8(static_cast<std::uint8_t>(x.first));
    w.u8(static_cast<std::uint8_t>(x.last));
  }
}
std::vector<RegionRange> read_ranges(Reader& r) {
  std::vector<RegionRange> v(r.count());
  for (RegionRange& x : v) {
    x.first = r.enumv<Region>(kNamedRegions);
    x.last = r.enumv<Region>(kNamedRegions);
  }
  return v;
}

void write_node(Writer& w, const Node& n) {
  w.u8(static_cast<std::uint8_t>(n.type));
  w.u8(static_cast<std::uint8_t>(n.op));
  w.u8(static_cast<std::uint8_t>(n.layer_kind));
  w.i32(n.layer_index);
  write_params(w, n.params);
  w.b(n.accumulate);
  write_ids(w, n.inputs);
  write_ids(w, n.outputs);
  w.u8(static_cast<std::uint8_t>(n.range_op));
  write_ranges(w, n.input_ranges);
  write_ranges(w, n.output_ranges);
  w.b(n.apply_weight_decay);
  w.i64(static_cast<std::int64_t>(n.sub.size()));
  for (const Node& s : n.sub) write_node(w, s);
  w.i64(static_cast<std::int64_t>(n.fusions.size()));
  for (const FusedPass& f : n.fusions) {
    w.u8(static_cast<std::uint8_t>(f.kind));
    for (std::int32_t v : {f.at, f.bn, f.relu, f.add, f.shortcut_bn}) w.i32(v);
    w.i64(static_cast<std::int64_t>(f.parts.size()));
    for (std::int32_t v : f.parts) w.i32(v);
    w.b(f.fallback_only);
    for (const auto* ops : {&f.inputs, &f.outputs, &f.saved}) {
      w.i64(static_cast<std::int64_t>(ops->size()));
      for (const FusedOperand& o : *ops) {
        w.str(o.name);
        w.i32(o.id);
      }
    }
  }
}

Node read_node(Reader& r, int depth = 0) {
  RN_CHECK(depth < 4, "serialised plan: nodes nested too deeply");
  Node n;
  n.type = r.enumv<NodeType>(2);
  n.op = r.enumv<OpKind>(static_cast<int>(OpKind::COUNT));
  n.layer_kind = r.enumv<LayerKind>(static_cast<int>(all_layer_kinds().size()));
  n.layer_index = r.i32();
  n.params = read_params(r);
  n.accumulate = r.b();
  n.inputs = read_ids(r);
  n.outputs = read_ids(r);
  n.range_op = r.enumv<RangeOp>(static_cast<int>(RangeOp::COUNT));
  n.input_ranges = read_ranges(r);
  n.output_ranges = read_ranges(r);
  n.apply_weight_decay = r.b();
  const std::size_t subs = r.count();
  for (std::size_t i = 0; i < subs; ++i) n.sub.push_back(read_node(r, depth + 1));
  n.fusions.resize(r.count());
  for (FusedPass& f : n.fusions) {
    f.kind = r.enumv<ops::FusedKind>(static_cast<int>(ops::FusedKind::COUNT));
    for (std::int32_t* v : {&f.at, &f.bn, &f.relu, &f.add, &f.shortcut_bn}) *v = r.i32();
    f.parts.resize(r.count());
    for (std::int32_t& v : f.parts) v = r.i32();
    f.fallback_only = r.b();
    for (auto* ops : {&f.inputs, &f.outputs, &f.saved}) {
      ops->resize(r.count());
      for (FusedOperand& o : *ops) {
        o.name = r.str();
        o.id = r.i32();
      }
    }
  }
  if (!n.fusions.empty()) (void)fused_step_of(n);  // parts in range, none twice
  return n;
}

void write_graph(Writer& w, const ComputationGraph& g) {
  w.str(g.name());
  for (int i = 0; i < kGraphIds; ++i) {
    const auto& b = g.bucket(static_cast<GraphId>(i));
    w.i64(static_cast<std::int64_t>(b.size()));
    for (const Node& n : b) write_node(w, n);
  }
}
ComputationGraph read_graph(Reader& r) {
  ComputationGraph g(r.str());
  for (int i = 0; i < kGraphIds; ++i) {
    const std::size_t n = r.count();
    for (std::size_t k = 0; k < n; ++k) g.add(static_cast<GraphId>(i), read_node(r));
  }
  return g;
}

void write_memory(Writer& w, const MemoryPlan& p) {
  w.str(p.variant());
  w.i64(static_cast<std::int64_t>(p.tensors().size()));
  for (const DTensor& t : p.tensors()) {
    w.i32(t.id);
    w.str(t.name);
    w.shape(t.shape);
    w.u8(static_cast<std::uint8_t>(t.dtype));
    w.u8(static_cast<std::uint8_t>(t.region));
    w.i64(t.offset);
    w.i64(t.slot_bytes);
    for (auto s : t.cuda_strides) w.i64(s);
    for (auto s : t.cpu_strides) w.i64(s);
  }
  w.i64(static_cast<std::int64_t>(p.aliases().size()));
  for (auto [view, slot] : p.aliases()) {
    w.i32(view);
    w.i32(slot);
  }
  for (const ByteRange& r : p.region_ranges()) {
    w.i64(r.offset);
    w.i64(r.bytes);
  }
  w.i64(p.total_bytes());
  w.b(p.reuses_memory());
  w.i64(static_cast<std::int64_t>(p.lifetimes().size()));
  for (const auto& [id, life] : p.lifetimes()) {
    w.i32(id);
    w.i64(static_cast<std::int64_t>(life.size()));
    for (const LiveInterval& i : life) {
      w.i32(i.first);
      w.i32(i.last);
    }
  }
}
MemoryPlan read_memory(Reader& r) {
  std::string variant = r.str();
  std::vector<DTensor> tensors(r.count());
  for (DTensor& t : tensors) {
    t.id = r.i32();
    t.name = r.str();
    t.shape = r.shape();
    t.dtype = r.enumv<DType>(5);
    t.region = r.enumv<Region>(kNamedRegions);
    t.offset = r.i64();
    t.slot_bytes = r.i64();
    for (auto& s : t.cuda_strides) s = r.i64();
    for (auto& s : t.cpu_strides) s = r.i64();
  }
  std::map<TensorId, TensorId> aliases;
  const std::size_t na = r.count();
  for (std::size_t i = 0; i < na; ++i) {
    const TensorId v = r.i32();
    aliases[v] = r.i32();
  }
  std::vector<ByteRange> regions(kNamedRegions);
  for (ByteRange& x : regions) {
    x.offset = r.i64();
    x.bytes = r.i64();
  }
  const std::int64_t total = r.i64();
  const bool reuse = r.b();
  std::map<TensorId, Lifetime> lifetimes;
  const std::size_t nl = r.count();
  for (std::size_t i = 0; i < nl; ++i) {
    const TensorId id = r.i32();
    Lifetime& life = lifetimes[id];
    life.resize(r.count());
    for (LiveInterval& x : life) {
      x.first = r.i32();
      x.last = r.i32();
    }
  }
  return MemoryPlan::from_parts(std::move(variant), std::move(tensors), std::move(aliases), std::move(regions), total,
                                reuse, std::move(lifetimes));
}

void write_body(Writer& w, const CompiledPlan& p) {
  w.raw(kMagic, sizeof kMagic);
  w.str(p.arch.to_yaml());
  const TrainConfig& c = p.config;
  w.i64(c.dataset_size);
  w.i64(c.batch);
  w.i64(c.start_resolution);
  w.i64(c.end_resolution);
  w.i64(c.val_size);
  w.i64(c.val_batch);
  w.u8(static_cast<std::uint8_t>(c.optimizer));
  w.b(c.ema);
  w.b(c.amp);
  w.b(c.freeze_first_layer);
  w.b(c.reuse_memory);
  w.b(c.fuse_kernels);
  w.b(c.fold_residual_sums);
  w.b(c.fuse_residual_bn_backward);
  w.b(c.relu_masks);
  w.b(c.fuse_shortcut_bn_backward);
  w.b(c.recompute_bn_relu);
  w.i64(c.recompute_budget_bytes);
  w.i64(c.recompute_limit);
  w.i64(static_cast<std::int64_t>(p.specs.size()));
  for (const CompileSpec& s : p.specs) {
    w.b(s.amp_enabled);
    w.i64(s.max_sample_resolution);
    w.i64(s.actual_resolution);
    w.i64(s.batch_size);
    w.i64(s.num_color_channels);
    w.b(s.freeze_first_layer);
  }
  w.i64(static_cast<std::int64_t>(p.memory.size()));
  for (const MemoryPlan& m : p.memory) write_memory(w, m);
  write_graph(w, p.train);
  write_graph(w, p.inference);
  const BaselineIds& b = p.baseline;
  for (TensorId t : {b.labels_a, b.data_a, b.labels_b, b.data_b, b.hyper, b.loss_scale, b.nan_flag, b.step, b.labels,
                     b.result, b.predicted, b.accumulated, b.logits})
    w.i32(t);
}

}  // namespace

std::uint64_t content_hash(const CompiledPlan& plan) {
  Writer w;
  write_body(w, plan);
  return fnv1a(w.buf.data(), w.buf.size());
}

std::vector<std::uint8_t> serialize(const CompiledPlan& plan) {
  Writer w;
  write_body(w, plan);
  const std::uint64_t h = fnv1a(w.buf.data(), w.buf.size());
  RN_CHECK(plan.hash == 0 || plan.hash == h, "plan hash {:016x} does not match its content {:016x}", plan.hash, h);
  w.u64(h);
  return std::move(w.buf);
}

CompiledPlan deserialize(const std::vector<std::uint8_t>& bytes) {
  RN_CHECK(bytes.size() >= sizeof kMagic + 8, "serialised plan is too short ({} bytes)", bytes.size());
  const std::size_t body = bytes.size() - 8;
  std::uint64_t stored;
  std::memcpy(&stored, bytes.data() + body, 8);
  const std::uint64_t h = fnv1a(bytes.data(), body);
  RN_CHECK(stored == h, "serialised plan is corrupt: hash {:016x} != content {:016x}", stored, h);
  Reader r(bytes.data(), body);
  char magic[8];
  r.raw(magic, 8);
  RN_CHECK(std::memcmp(magic, kMagic, 8) == 0, "not a serialised Renaissance plan (bad magic)");
  CompiledPlan p;
  p.arch = ArchPlan::from_yaml(r.str(), "<serialised plan>");
  TrainConfig& c = p.config;
  c.dataset_size = r.i64();
  c.batch = r.i64();
  c.start_resolution = r.i64();
  c.end_resolution = r.i64();
  c.val_size = r.i64();
  c.val_batch = r.i64();
  c.optimizer = r.enumv<OptimizerKind>(6);
  c.ema = r.b();
  c.amp = r.b();
  c.freeze_first_layer = r.b();
  c.reuse_memory = r.b();
  c.fuse_kernels = r.b();
  c.fold_residual_sums = r.b();
  c.fuse_residual_bn_backward = r.b();
  c.relu_masks = r.b();
  c.fuse_shortcut_bn_backward = r.b();
  c.recompute_bn_relu = r.b();
  c.recompute_budget_bytes = r.i64();
  c.recompute_limit = static_cast<std::int32_t>(r.i64());
  p.specs.resize(r.count(16));
  for (CompileSpec& s : p.specs) {
    s.amp_enabled = r.b();
    s.max_sample_resolution = r.i64();
    s.actual_resolution = r.i64();
    s.batch_size = r.i64();
    s.num_color_channels = r.i64();
    s.freeze_first_layer = r.b();
  }
  const std::size_t nm = r.count(16);
  for (std::size_t i = 0; i < nm; ++i) p.memory.push_back(read_memory(r));
  p.train = read_graph(r);
  p.inference = read_graph(r);
  BaselineIds& b = p.baseline;
  for (TensorId* t : {&b.labels_a, &b.data_a, &b.labels_b, &b.data_b, &b.hyper, &b.loss_scale, &b.nan_flag, &b.step,
                      &b.labels, &b.result, &b.predicted, &b.accumulated, &b.logits})
    *t = r.i32();
  RN_CHECK(r.done(), "serialised plan has {} trailing bytes", body - r.pos());
  p.hash = h;
  p.schedule = build_step_schedule();
  return p;
}

}  // namespace renaissance::plan
