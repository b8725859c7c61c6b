// The compiler's five phases (DESIGN §4): derive shapes, max slots, memory plans, graphs, sharing.
#include <renaissance/core/error.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/plan/fusion.h>
#include <renaissance/plan/liveness.h>
#include <renaissance/plan/recompute.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <optional>

namespace renaissance::plan {

namespace {

constexpr int kData = -1;  // feature key of the data buffer
constexpr int kNone = -2;  // no second input (every layer but a residual add's end)

std::string full_name(const LoweredLayer& l, const std::string& local) { return l.layer.name + "." + local; }

bool is_fused_owner(const ArchPlan& arch, int owner) {
  return owner >= 0 && is_fused(arch.layers[static_cast<std::size_t>(owner)].kind);
}

/// Forward data chain over the lowered layers: which feature each layer reads and writes.
struct Chain {
  std::vector<int> x, x2, y;  // feature keys (index of the owning lowered layer, or kData; x2: kNone where unused)
};

Chain forward_chain(const std::vector<LoweredLayer>& layers) {
  const LayerRegistry& reg = LayerRegistry::instance();
  Chain c;
  const std::size_t n = layers.size();
  c.x.assign(n, kData);
  c.x2.assign(n, kNone);
  c.y.assign(n, kData);
  struct Open {
    int block_in, shortcut_out;
  };
  std::vector<Open> open;
  int cur = kData;
  for (std::size_t i = 0; i < n; ++i) {
    const LayerKind k = layers[i].layer.kind;
    c.x[i] = cur;
    if (k == LayerKind::Add2Start) {
      open.push_back({cur, kData});
    } else if (k == LayerKind::Add2ShortcutEnd) {
      open.back().shortcut_out = cur;
      cur = open.back().block_in;
    } else if (k == LayerKind::Add2End) {
      c.x2[i] = open.back().shortcut_out;
      open.pop_back();
      cur = static_cast<int>(i);
    } else if (!reg.get(k).pass_through) {
      cur = static_cast<int>(i);
    }
    c.y[i] = cur;
  }
  return c;
}

/// Everything graph building needs, shared by the phases below.
struct Build {
  const ArchPlan& arch;
  const TrainConfig& cfg;
  std::vector<Compiler::VariantTensors>& vt;  // per variant
  std::vector<MemoryPlan>& plans;
  const std::vector<LoweredLayer>& layers;  // variant 0's shapes
  Chain chain;
  BaselineIds base;
  std::vector<LayerIds> ids;      // per lowered layer (x/y filled per data buffer at emission)
  std::vector<TensorId> feature;  // per lowered layer: its "y" tensor or kNoTensor
  std::size_t first_end = 0;      // lowered layers [0, first_end) are the first ArchLayer
  int grad_slots = 0;

  DType act() const { return cfg.amp ? DType::F16 : DType::F32; }
  TensorId feat(int key, TensorId data) const { return key == kData ? data : feature[static_cast<std::size_t>(key)]; }

  LayerIds layer_ids(std::size_t i, TensorId data) const {
    LayerIds l = ids[i];
    l.x = feat(chain.x[i], data);
    // A shortcut straight off the data buffer (an add2 whose shortcut is the identity, first in the model) reads it.
    l.x2 = chain.x2[i] == kNone ? kNoTensor : feat(chain.x2[i], data);
    l.y = feature[i] != kNoTensor ? feature[i] : l.x;
    return l;
  }
};

// ---- gradient slots -------------------------------------------------------------------------

/// The backward walk: assigns each feature's gradient to one of <= 4 reusable slots (reference-counted,
/// so both branches of a residual add share dy without a copy) and emits the backward nodes.
class GradWalker {
 public:
  GradWalker(Build& b, bool emit) : m_b(b), m_emit(emit) {}

  int max_slots() const { return m_max_used; }

  // Backward of lowered layers [begin, end) in reverse; `data` is the data buffer for the first layer.
  void run(std::size_t begin, std::size_t end, TensorId data, std::vector<std::pair<int, Node>>* out) {
    const LayerRegistry& reg = LayerRegistry::instance();
    for (std::size_t ii = end; ii-- > begin;) {
      const LoweredLayer& L = m_b.layers[ii];
      const LayerKind k = L.layer.kind;
      const int i = static_cast<int>(ii);
      const BuildFlags flags{m_b.cfg.amp, false};
      if (k == LayerKind::Add2End) {
        if (!has(i)) continue;
        const TensorId dy = view(i);
        for (int key : {m_b.chain.x[ii], m_b.chain.x2[ii]}) {
          if (key == kData || key == kNone) continue;  // a residual add straight off the data buffer has nothing to feed
          if (has(key)) {
            const TensorId dst = unshare(key, L.owner, out);
            push(out, L.owner, tag(compute_node(OpKind::ACCUMULATE, {dy}, {dst}), L));
          } else {
            share(key, i);
          }
        }
        release(i);
        continue;
      }
      const LayerDescriptor& d = reg.get(k);
      const bool loss = k == LayerKind::SoftmaxCE;
      if (d.pass_through && !loss) continue;
      if (!loss && !has(i)) continue;  // nothing downstream needs this layer's gradient
      // The sums a residual join deferred to this layer (fold_residual_sums): into its gradient before its backward.
      if (const auto pending = m_addends.find(i); pending != m_addends.end()) {
        for (const auto& [addend, slot] : pending->second) {
          const TensorId g = unshare(i, L.owner, out);
          push(out, L.owner, tag(compute_node(OpKind::ACCUMULATE, {addend}, {g}), L));
          --m_ref[static_cast<std::size_t>(slot)];
        }
        m_addends.erase(pending);
      }
      const TensorId dy = loss ? kNoTensor : view(i);
      const int xk = m_b.chain.x[ii];
      TensorId dx = kNoTensor;
      bool acc = false;
      if (xk != kData) {
        if (has(xk) && folds_sum(k, xk)) {
          dx = addend(xk);
        } else if (has(xk)) {
          dx = unshare(xk, L.owner, out);
          acc = true;
        } else {
          dx = fresh(xk);
        }
      }
      if (m_emit)
        for (Node& n : d.build_backward(L.layer, m_b.layer_ids(ii, data), dy, dx, acc, flags)) push(out, L.owner, n);
      if (!loss) release(i);
    }
  }

 private:
  bool has(int key) const { return m_slot_of.count(key) > 0; }

  /// fold_residual_sums: a convolution whose data gradient would add into the gradient of `key`, where `key` is the
  /// end ReLU of a fused residual block (its backward is an element-wise pass that can read both addends), and a
  /// gradient slot is free for the addend.
  bool folds_sum(LayerKind k, int key) const {
    // AMP plans only: in FP32 ones (fused layers since 2026-12-05) the own buffer and the sum cost the CPU ~10 % of the
    // narrow ResNet-18's step (1,050 against 1,180 img/s), and the beta = 0 gain measured was cuDNN's FP16 dgrad.
    if (!m_b.cfg.fold_residual_sums || !m_b.cfg.amp || k != LayerKind::Conv) return false;
    const LoweredLayer& c = m_b.layers[static_cast<std::size_t>(key)];
    if (c.layer.kind != LayerKind::Relu || !is_fused_owner(m_b.arch, c.owner)) return false;
    const int in = m_b.chain.x[static_cast<std::size_t>(key)];
    if (in == kData || m_b.layers[static_cast<std::size_t>(in)].layer.kind != LayerKind::Add2End) return false;
    return std::any_of(m_ref.begin(), m_ref.end(), [](int r) { return r == 0; });
  }
  /// A gradient buffer of its own for one addend of `key`'s gradient, summed in when `key`'s layer is walked.
  TensorId addend(int key) {
    const int s = alloc_slot();
    new_buffer(key, s);
    m_ref[static_cast<std::size_t>(s)] = 1;
    const TensorId id = make_view(key, s);  // "<feature>.grad@<slot>": another slot than the gradient's own
    m_addends[key].emplace_back(id, s);
    return id;
  }
  TensorId view(int key) const { return m_emit ? m_view_of.at(key) : kNoTensor; }

  int alloc_slot() {
    for (int s = 0; s < kMaxGradSlots; ++s)
      if (m_ref[static_cast<std::size_t>(s)] == 0) {
        m_max_used = std::max(m_max_used, s + 1);
        return s;
      }
    RN_FAIL("the backward pass needs more than {} live gradient slots (hint: nested residual branches)", kMaxGradSlots);
  }

  TensorId make_view(int key, int slot, const char* what = "grad") {
    if (!m_emit) return kNoTensor;
    // Views are named per (feature, slot): the A and B first-layer walks reuse the same views.
    const TensorId fid = m_b.feature[static_cast<std::size_t>(key)];
    const std::string name = fmt::format("{}.{}@{}", m_b.plans[0].tensor(fid).name, what, slot);
    if (const TensorId id = m_b.plans[0].find(name); id != kNoTensor) {
      RN_CHECK(!reuse() || m_b.plans[0].aliases().at(id) == m_buffer[static_cast<std::size_t>(slot)],
               "internal: gradient view '{}' would view two buffers", name);
      return id;
    }
    TensorId id = kNoTensor;
    for (MemoryPlan& plan : m_b.plans) {
      const DTensor& f = plan.tensor(fid);
      id = reuse() ? plan.alias_grad(name, m_buffer[static_cast<std::size_t>(slot)], f.shape, f.dtype)
                   : plan.alias_grad_slot(name, slot, f.shape, f.dtype);
    }
    return id;
  }

  bool reuse() const { return m_b.cfg.reuse_memory; }

  // With reuse, each time a slot is taken afresh its gradient gets a buffer of its own, sized by the feature and
  // placed by its lifetime: the "slot" only counts live gradients (<= 4). The views sharing it (the two inputs of
  // a residual add) have the feature's shape too.
  void new_buffer(int key, int slot) {
    if (!m_emit || !reuse()) return;
    const TensorId fid = m_b.feature[static_cast<std::size_t>(key)];
    const std::string name = fmt::format("grad_buffer.{}", m_buffers++);
    TensorId id = m_b.plans[0].find(name);
    if (id == kNoTensor) {  // the A and B first-layer walks make the same buffers
      std::int64_t bytes = 0;
      for (const MemoryPlan& plan : m_b.plans) {
        const DTensor& f = plan.tensor(fid);
        bytes = std::max(
            bytes, compute_slot_bytes(f.shape, f.dtype,
                                      f.dtype == DType::F32 ? Region::F_GRAD_SLOT_FP32 : Region::F_GRAD_SLOT_FP16));
      }
      for (MemoryPlan& plan : m_b.plans) {
        const DTensor& f = plan.tensor(fid);
        id = plan.alloc_grad_buffer(name, f.shape, f.dtype, bytes);
      }
    } else {
      RN_CHECK(m_b.plans[0].tensor(id).shape == m_b.plans[0].tensor(fid).shape,
               "internal: gradient buffer '{}' differs between the A and B first-layer walks", name);
    }
    m_buffer[static_cast<std::size_t>(slot)] = id;
  }

  TensorId fresh(int key) {
    const int s = alloc_slot();
    new_buffer(key, s);
    m_ref[static_cast<std::size_t>(s)] = 1;
    m_slot_of[key] = s;
    return m_view_of[key] = make_view(key, s);
  }

  void share(int key, int from) {
    const int s = m_slot_of.at(from);
    ++m_ref[static_cast<std::size_t>(s)];
    m_slot_of[key] = s;
    m_view_of[key] = make_view(key, s);
  }

  // Before accumulating into a key's gradient, make sure no other live key shares its slot.
  TensorId unshare(int key, int owner, std::vector<std::pair<int, Node>>* out) {
    const int s = m_slot_of.at(key);
    if (m_ref[static_cast<std::size_t>(s)] == 1) return view(key);
    const TensorId old = view(key);
    --m_ref[static_cast<std::size_t>(s)];
    const TensorId now = fresh(key);
    push(out, owner, compute_node(OpKind::COPY, {old}, {now}));
    return now;
  }

  void release(int key) {
    const int s = m_slot_of.at(key);
    --m_ref[static_cast<std::size_t>(s)];
    m_slot_of.erase(key);
    m_view_of.erase(key);
  }

  Node tag(Node n, const LoweredLayer& L) const {
    n.layer_kind = L.layer.kind;
    return n;
  }
  void push(std::vector<std::pair<int, Node>>* out, int owner, Node n) {
    if (m_emit && out) out->emplace_back(owner, std::move(n));
  }

  Build& m_b;
  bool m_emit;
  std::map<int, int> m_slot_of;
  std::map<int, TensorId> m_view_of;
  std::map<int, std::vector<std::pair<TensorId, int>>> m_addends;  // key -> (addend view, its slot) to sum in
  std::array<int, kMaxGradSlots> m_ref{};
  std::array<TensorId, kMaxGradSlots> m_buffer{};  // reuse: the buffer a slot's current gradient lives in
  int m_buffers = 0;
  int m_max_used = 0;
};

// ---- node grouping ------------------------------------------------------------------------------

/// Wraps consecutive nodes of one fused layer into a single FUSED_* node carrying them as sub-nodes.
std::vector<Node> group(const ArchPlan& arch, std::vector<std::pair<int, Node>> nodes, OpKind fused_op) {
  std::vector<Node> out;
  for (std::size_t i = 0; i < nodes.size();) {
    const int owner = nodes[i].first;
    if (!is_fused_owner(arch, owner)) {
      nodes[i].second.layer_index = owner;
      out.push_back(std::move(nodes[i].second));
      ++i;
      continue;
    }
    const ArchLayer& L = arch.layers[static_cast<std::size_t>(owner)];
    Node f = compute_node(fused_op, {}, {}, L.params);
    f.layer_kind = L.kind;
    f.layer_index = owner;
    for (; i < nodes.size() && nodes[i].first == owner; ++i) {
      Node& s = nodes[i].second;
      s.layer_index = owner;
      f.sub.push_back(std::move(s));
    }
    set_fused_operands(f);
    out.push_back(std::move(f));
  }
  return out;
}

void add_all(ComputationGraph& g, GraphId id, std::vector<Node> nodes) {
  for (Node& n : nodes) g.add(id, std::move(n));
}

}  // namespace

// ---- phases ---------------------------------------------------------------------------------------

std::vector<LoweredLayer> Compiler::lower(const ArchPlan& arch) {
  std::vector<LoweredLayer> out;
  for (std::size_t i = 0; i < arch.layers.size(); ++i)
    for (ArchLayer& part : lower_layer(arch.layers[i])) out.push_back({std::move(part), static_cast<int>(i)});
  return out;
}

std::vector<Compiler::VariantTensors> Compiler::derive_all_shapes(const std::vector<LoweredLayer>& lowered,
                                                                  const std::vector<CompileSpec>& specs,
                                                                  const ArchPlan& arch) {
  const LayerRegistry& reg = LayerRegistry::instance();
  std::vector<VariantTensors> all;
  for (std::size_t v = 0; v < specs.size(); ++v) {
    const CompileSpec& s = specs[v];
    const std::string ctx = fmt::format("variant '{}' (batch {}, {}x{})", variant_name(static_cast<Variant>(v)),
                                        s.batch_size, s.actual_resolution, s.actual_resolution);
    VariantTensors vt;
    std::vector<ArchLayer> layers;
    for (const LoweredLayer& l : lowered) layers.push_back(l.layer);
    try {
      steps::infer_shapes(layers, Shape{s.batch_size, s.actual_resolution, s.actual_resolution, arch.input.c});
    } catch (const Error& e) {
      throw e.with_context(ctx);
    }
    InferContext ictx{s.amp_enabled, s.amp_enabled ? DType::F16 : DType::F32, false};
    for (std::size_t i = 0; i < lowered.size(); ++i) {
      vt.layers.push_back({layers[i], lowered[i].owner});
      ictx.first_layer = layers[i].is_first_layer;
      vt.tensors.push_back(
          reg.get(layers[i].kind).infer_tensors(layers[i], layers[i].in_shape, layers[i].out_shape, ictx));
    }
    all.push_back(std::move(vt));
  }
  // Cross-variant consistency: one topology, so the same tensors (shapes may differ).
  for (std::size_t v = 1; v < all.size(); ++v)
    for (std::size_t i = 0; i < lowered.size(); ++i) {
      const LayerTensors& a = all[0].tensors[i];
      const LayerTensors& b = all[v].tensors[i];
      const std::string ctx =
          fmt::format("layer '{}', variant '{}'", lowered[i].layer.name, variant_name(static_cast<Variant>(v)));
      RN_CHECK_CTX(a.params.size() == b.params.size() && a.tensors.size() == b.tensors.size(), ctx,
                   "tensor count differs from train_base ({}+{} vs {}+{})", a.params.size(), a.tensors.size(),
                   b.params.size(), b.tensors.size());
      for (std::size_t t = 0; t < a.params.size(); ++t) {
        RN_CHECK_CTX(a.params[t].name == b.params[t].name && a.params[t].kind == b.params[t].kind, ctx,
                     "parameter '{}' differs from train_base", a.params[t].name);
        // A flatten before a fully connected layer: its weights' size follows the input size.
        RN_CHECK_CTX(a.params[t].shape == b.params[t].shape, ctx,
                     "parameter '{}' is {} here but {} in train_base: every variant shares one set of weights, so a "
                     "layer whose parameters follow the input size (a fully connected layer after a flatten) allows "
                     "no variant of another input size (progressive resize, --start-resolution, needs global pooling "
                     "before the classifier)",
                     a.params[t].name, b.params[t].shape.str(), a.params[t].shape.str());
      }
      for (std::size_t t = 0; t < a.tensors.size(); ++t)
        RN_CHECK_CTX(a.tensors[t].name == b.tensors[t].name && a.tensors[t].region == b.tensors[t].region &&
                         a.tensors[t].dtype == b.tensors[t].dtype,
                     ctx, "tensor '{}' differs from train_base in name, region or dtype", a.tensors[t].name);
    }
  return all;
}

std::optional<SingleValueBatchNorm> single_value_batch_norm(const CompiledPlan& plan) {
  const std::vector<Compiler::VariantTensors> all =
      Compiler::derive_all_shapes(Compiler::lower(plan.arch), plan.specs, plan.arch);
  for (std::size_t v = 0; v < all.size(); ++v) {
    if (!is_train_variant(static_cast<Variant>(v))) continue;
    for (std::size_t i = 0; i < all[v].layers.size(); ++i) {
      const ArchLayer& l = all[v].layers[i].layer;
      const auto& params = all[v].tensors[i].params;
      const bool has_bn = std::any_of(params.begin(), params.end(),
                                      [](const ParamDesc& p) { return p.kind == ParamKind::BN_WEIGHT; });
      // A layer's BNs see at least its output's positions (a block ends in one; the others sit before a stride).
      if (has_bn && l.out_shape.n * l.out_shape.h * l.out_shape.w <= 1)
        return SingleValueBatchNorm{l.name, static_cast<Variant>(v), plan.specs[v].batch_size};
    }
  }
  return std::nullopt;
}

namespace {
std::atomic<std::int64_t> g_compilations{0};
}  // namespace

std::int64_t Compiler::compilations() { return g_compilations.load(); }

// ---- the compiler's phases -----------------------------------------------------------------------
namespace {

/// One compile: the plan being built and the state the phases hand on. Compiler::compile runs the phases in order.
class CompileRun {
 public:
  CompileRun(const ArchPlan& arch, const TrainConfig& cfg) : arch(arch), cfg(cfg) {
    RN_CHECK(arch.amp == cfg.amp, "the arch plan was built with amp={} but the training config says amp={}", arch.amp,
             cfg.amp);
    RN_CHECK(!arch.layers.empty() && arch.layers.back().kind == LayerKind::SoftmaxCE,
             "the arch plan must end in SoftmaxCE (build it with ArchPlan::build)");
    out.arch = arch;
    out.config = cfg;
    out.specs = derive_variant_specs(cfg, arch.input.h, arch.input.c);
    lowered = Compiler::lower(arch);
  }

  /// Phase 1: shapes and tensors per variant.
  void derive_shapes() {
    vt = Compiler::derive_all_shapes(lowered, out.specs, arch);
    nv = vt.size();
  }

  /// Phase 3a: the baseline tensors every plan has (input buffers, scalars, results), the same in every variant.
  void allocate_baseline() {
    out.memory.clear();
    for (std::size_t v = 0; v < nv; ++v) out.memory.emplace_back(variant_name(static_cast<Variant>(v)));
    const DType act = cfg.amp ? DType::F16 : DType::F32;
    const std::int64_t C = arch.input.c;
    auto batch_vec = [](const CompileSpec& s) { return Shape{s.batch_size, 1, 1, 1}; };
    auto data_shape = [C](const CompileSpec& s) {
      return Shape{s.batch_size, s.actual_resolution, s.actual_resolution, C};
    };
    auto fixed = [](std::int64_t c) { return [c](const CompileSpec&) { return Shape{1, 1, 1, c}; }; };
    BaselineIds& B = out.baseline;
    B.labels_a = baseline(Region::I_A_LABEL, "input.a.labels", batch_vec, DType::I32);
    B.data_a = baseline(Region::I_A_DATA, "input.a.data", data_shape, act);
    B.labels_b = baseline(Region::I_B_LABEL, "input.b.labels", batch_vec, DType::I32);
    B.data_b = baseline(Region::I_B_DATA, "input.b.data", data_shape, act);
    B.hyper = baseline(Region::S_SCALAR_FP32, "scalars.hyper", fixed(kHyperSlots), DType::F32);
    B.loss_scale = baseline(Region::S_SCALAR_FP32, "scalars.loss_scale", fixed(kLossScaleSlots), DType::F32);
    B.nan_flag = baseline(Region::S_SCALAR_INT32, "scalars.nan_flag", fixed(1), DType::I32);
    B.step = baseline(Region::S_SCALAR_INT32, "scalars.step", fixed(2), DType::I32);
    B.labels = baseline(Region::T_TEMP_INT32, "labels", batch_vec, DType::I32);
    B.result = baseline(Region::R_RESULT, "result.step", fixed(kResultSlots), DType::F32);
    B.predicted = baseline(Region::R_PREDICTED_LABEL, "result.predicted", batch_vec, DType::I32);
    B.accumulated = baseline(Region::R_RESULT_ACCUMULATED, "result.accumulated", fixed(kResultSlots), DType::F32);
  }

  /// Phase 3b: per lowered layer, its parameters (with their gradients, FP16 twins, EMA and optimizer state) and its
  /// tensors, in place where a ReLU or residual add may overwrite its input.
  void allocate_layer_tensors() {
    build.emplace(
        Build{arch, cfg, vt, out.memory, vt[0].layers, forward_chain(vt[0].layers), out.baseline, {}, {}, 0, 0});
    Build& b = *build;
    BaselineIds& B = out.baseline;
    b.ids.resize(lowered.size());
    b.feature.assign(lowered.size(), kNoTensor);
    const bool twin_amp = cfg.amp;
    // In place: a ReLU overwrites its input, and a residual add its main branch, when that input has no other reader
    // and the backward pass of its producer does not read it (BN, conv and FC backward read their inputs, the
    // residual add reads nothing). This is what PyTorch's inplace=True and `out += identity` do, planned statically.
    std::vector<int> readers(lowered.size(), 0);
    for (std::size_t j = 0; j < lowered.size(); ++j)
      for (int key : {b.chain.x[j], b.chain.x2[j]})
        if (key >= 0) ++readers[static_cast<std::size_t>(key)];
    auto output_unread_by_backward = [](LayerKind k) {
      return k == LayerKind::Conv || k == LayerKind::Fc || k == LayerKind::Bn2d || k == LayerKind::Bn1d ||
             k == LayerKind::Add2End || k == LayerKind::MaxPool || k == LayerKind::Gap || k == LayerKind::Flatten;
    };
    auto in_place_base = [&](std::size_t i) -> int {
      const LayerKind k = vt[0].layers[i].layer.kind;
      if (k != LayerKind::Relu && k != LayerKind::Add2End) return kData;
      const int key = b.chain.x[i];
      if (key == kData || readers[static_cast<std::size_t>(key)] != 1) return kData;
      if (!output_unread_by_backward(vt[0].layers[static_cast<std::size_t>(key)].layer.kind)) return kData;
      return key;
    };
    for (std::size_t i = 0; i < lowered.size(); ++i) {
      const LoweredLayer& L = vt[0].layers[i];
      LayerIds& ids = b.ids[i];
      ids.labels = B.labels;
      ids.hyper = B.hyper;
      ids.loss_scale = B.loss_scale;
      ids.result = B.result;
      for (const ParamDesc& p : vt[0].tensors[i].params) {
        const std::string n = full_name(L, p.name);
        ParamIds pi;
        pi.kind = p.kind;
        auto one = [&](auto alloc, const std::string& name) {
          return each(
              [&](MemoryPlan& mp, const CompileSpec&, std::size_t) { return (mp.*alloc)(p.kind, name, p.shape); });
        };
        pi.master = one(&MemoryPlan::alloc_master, n);
        pi.grad = one(&MemoryPlan::alloc_grad, n + ".grad");
        if (twin_amp && has_fp16_twin(p.kind)) {
          pi.compute = one(&MemoryPlan::alloc_compute_weight, n + ".fp16");
          pi.grad16 = one(&MemoryPlan::alloc_grad_fp16, n + ".grad16");
        }
        if (cfg.ema) {
          pi.ema = one(&MemoryPlan::alloc_ema, n + ".ema");
          if (twin_amp && has_fp16_twin(p.kind)) pi.ema16 = one(&MemoryPlan::alloc_ema_fp16, n + ".ema16");
        }
        if (optimizer_has_m(cfg.optimizer)) pi.m = one(&MemoryPlan::alloc_momentum, n + ".m");
        if (optimizer_has_v(cfg.optimizer)) pi.v = one(&MemoryPlan::alloc_second_moment, n + ".v");
        if (optimizer_has_n(cfg.optimizer) && has_fp16_twin(p.kind))
          pi.norm = each(
              [&](MemoryPlan& mp, const CompileSpec&, std::size_t) { return mp.alloc_lars_norm(p.kind, n + ".norm"); });
        ids.p[p.name] = pi;
      }
      for (std::size_t t = 0; t < vt[0].tensors[i].tensors.size(); ++t) {
        const std::int64_t slot = max_slot(i, t);
        const TensorDesc& d0 = vt[0].tensors[i].tensors[t];
        const TensorId id = each([&](MemoryPlan& mp, const CompileSpec&, std::size_t v) {
          const TensorDesc& d = vt[v].tensors[i].tensors[t];
          const std::string n = full_name(L, d.name);
          const RegionFamily f = region_family(d.region);
          if (d.region == Region::F_FEATURE_FP32 || d.region == Region::F_FEATURE_FP16) {
            const int base = d.name == "y" ? in_place_base(i) : kData;
            if (base != kData) return mp.alias_feature(n, b.feature[static_cast<std::size_t>(base)], d.shape, d.dtype);
            return mp.alloc_feature(n, d.shape, d.dtype, slot);
          }
          if (f == RegionFamily::B) return mp.alloc_bn_stat(d.region, n, d.shape.c);
          return mp.alloc_other(d.region, n, d.shape, d.dtype, slot);
        });
        ids.t[d0.name] = id;
        if (d0.name == "y") b.feature[i] = id;
      }
    }
    // The first ArchLayer's lowered parts run in FIRST_LAYER_* (they read the A or B data buffer).
    while (b.first_end < lowered.size() && vt[0].layers[b.first_end].owner == 0) ++b.first_end;
    {
      const std::size_t sm = lowered.size() - 1;
      b.ids[sm].x = b.feat(b.chain.x[sm], B.data_a);
      B.logits = b.ids[sm].x;
    }
  }

  /// Phase 4a: a dry backward walk counts the gradient slots; they are sized by the largest feature.
  void size_gradient_slots() {
    const BaselineIds& B = out.baseline;
    const bool train_first = !cfg.freeze_first_layer;
    {
      Build& b = *build;
      GradWalker dry(b, false);
      dry.run(b.first_end, lowered.size(), B.data_a, nullptr);
      if (train_first) dry.run(0, b.first_end, B.data_a, nullptr);
      b.grad_slots = dry.max_slots();
    }
    const Build& b = *build;
    const DType act = cfg.amp ? DType::F16 : DType::F32;
    std::int64_t grad_slot_bytes = 0;
    std::size_t largest = 0;
    for (std::size_t v = 0; v < nv; ++v)
      for (std::size_t i = 0; i < lowered.size(); ++i)
        if (b.feature[i] != kNoTensor) {
          const DTensor& f = out.memory[v].tensor(b.feature[i]);
          const std::int64_t s = compute_slot_bytes(
              f.shape, f.dtype, act == DType::F16 ? Region::F_GRAD_SLOT_FP16 : Region::F_GRAD_SLOT_FP32);
          if (s > grad_slot_bytes) {
            grad_slot_bytes = s;
            largest = i;
          }
        }
    if (!cfg.reuse_memory)
      for (int s = 0; s < b.grad_slots; ++s)
        each([&](MemoryPlan& mp, const CompileSpec&, std::size_t) {
          return mp.alloc_grad_slot(s, mp.tensor(b.feature[largest]).shape, act, grad_slot_bytes);
        });
  }

  /// Phase 4b: the train graph.
  void build_train_graph() {
    ComputationGraph& T = out.train;
    Build& b = *build;
    const BaselineIds& B = out.baseline;
    const bool train_first = !cfg.freeze_first_layer;
    const bool amp = cfg.amp;
    const RegionRange g_all{Region::G_BN_BIAS, Region::G_DEEP_CONV};
    const RegionRange g16_all{Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16};

    T.add(GraphId::TRANSFER_A, range_node(RangeOp::H2D_COPY, {}, {in_a}));
    T.add(GraphId::TRANSFER_B, range_node(RangeOp::H2D_COPY, {}, {in_b}));
    for (auto [gid, labels, data] : {std::tuple{GraphId::FIRST_LAYER_FWD_A, B.labels_a, B.data_a},
                                     std::tuple{GraphId::FIRST_LAYER_FWD_B, B.labels_b, B.data_b}}) {
      T.add(gid, compute_node(OpKind::COPY, {labels}, {B.labels}));
      add_all(T, gid, forward(0, b.first_end, data, false, false));
    }
    add_all(T, GraphId::DEEP_FWD_BWD, forward(b.first_end, lowered.size(), B.data_a, false, false));
    const std::size_t deep_backward_begin = T.bucket(GraphId::DEEP_FWD_BWD).size();
    GradWalker walker(b, true);
    {
      std::vector<std::pair<int, Node>> nodes;
      walker.run(b.first_end, lowered.size(), B.data_a, &nodes);
      add_all(T, GraphId::DEEP_FWD_BWD, group(arch, std::move(nodes), OpKind::FUSED_BWD));
    }
    if (train_first)
      for (auto [gid, data] :
           {std::pair{GraphId::FIRST_LAYER_BWD_A, B.data_a}, std::pair{GraphId::FIRST_LAYER_BWD_B, B.data_b}}) {
        GradWalker w = walker;  // the same gradient state for both data buffers
        std::vector<std::pair<int, Node>> nodes;
        w.run(0, b.first_end, data, &nodes);
        add_all(T, gid, group(arch, std::move(nodes), OpKind::FUSED_BWD));
      }
    if (cfg.recompute_bn_relu)
      out.config.recompute_limit = plan_recompute_bn_relu(T, deep_backward_begin, out.memory, cfg.recompute_limit);

    T.add(GraphId::ZERO_GRAD, range_node(RangeOp::CLEAR, {}, {g_all}));
    if (amp) {
      T.add(GraphId::ZERO_GRAD, range_node(RangeOp::CLEAR, {}, {g16_all}));
      // Per bucket, so bucket 1 (deep convolutions) can be cast and all-reduced while the first layer's backward
      // still runs (DESIGN §9): its cast leads DEEP_COMM; the rest is cast after the first layer's backward.
      T.add(GraphId::CAST_G16_TO_G,
            range_node(RangeOp::CAST_F16_TO_F32, {{Region::G_FC_WEIGHT_FP16, Region::G_FIRST_CONV_FP16}},
                       {{Region::G_FC_WEIGHT, Region::G_FIRST_CONV}}));
      T.add(GraphId::DEEP_COMM, range_node(RangeOp::CAST_F16_TO_F32,
                                           {{Region::G_DEEP_CONV_FP16, Region::G_DEEP_CONV_FP16}}, {kGradBucketDeep}));
    }
    T.add(GraphId::DEEP_COMM, range_node(RangeOp::ALLREDUCE_MEAN, {kGradBucketDeep}, {kGradBucketDeep}));
    T.add(GraphId::FIRST_COMM, range_node(RangeOp::ALLREDUCE_MEAN, {kGradBucketFirst}, {kGradBucketFirst}));
    T.add(GraphId::NAN_CHECK_AND_GRAD_SCALING, range_node(RangeOp::NAN_CHECK, {g_all}, {}, {B.nan_flag}));
    if (amp) {
      T.add(GraphId::NAN_CHECK_AND_GRAD_SCALING,
            range_node(RangeOp::GRAD_SCALE, {g_all}, {g_all}, {B.loss_scale, B.nan_flag}));
      T.add(GraphId::NAN_CHECK_AND_GRAD_SCALING,
            range_node(RangeOp::LOSS_SCALE_UPDATE, {}, {}, {B.loss_scale, B.nan_flag}));
    }
    const RegionRange b_next{Region::B_NEXT_MEAN, Region::B_NEXT_VAR}, b_prev{Region::B_PREV_MEAN, Region::B_PREV_VAR};
    T.add(GraphId::STATS_COMM, range_node(RangeOp::BN_STATS_ALLREDUCE, {b_next}, {b_next}));
    T.add(GraphId::UPDATE_STATS, range_node(RangeOp::BN_RUNNING_UPDATE, {b_next}, {b_prev}, {B.hyper, B.nan_flag}));

    // Optimizer: one range op for the bias/BN block (no weight decay) and one for the weight block.
    const RegionRange w_bias{Region::W_BN_BIAS, Region::W_FC_BIAS}, w_weight{Region::W_FC_WEIGHT, Region::W_DEEP_CONV};
    const RegionRange g_bias{Region::G_BN_BIAS, Region::G_FC_BIAS}, g_weight{Region::G_FC_WEIGHT, Region::G_DEEP_CONV};
    const RegionRange m_bias{Region::M_BN_BIAS, Region::M_FC_BIAS}, m_weight{Region::M_FC_WEIGHT, Region::M_DEEP_CONV};
    const RegionRange v_bias{Region::V_BN_BIAS, Region::V_FC_BIAS}, v_weight{Region::V_FC_WEIGHT, Region::V_DEEP_CONV};
    const RegionRange n_weight{Region::N_FC_WEIGHT, Region::N_DEEP_CONV};
    auto opt = [&](RangeOp op, std::vector<RegionRange> in, std::vector<RegionRange> outr, bool wd) {
      Node n = range_node(op, std::move(in), std::move(outr), {B.hyper, B.nan_flag});
      n.apply_weight_decay = wd;
      return n;
    };
    switch (cfg.optimizer) {
      case OptimizerKind::SGD:
        T.add(GraphId::OPTIMIZER, opt(RangeOp::SGD_UPDATE, {w_bias, g_bias}, {w_bias}, false));
        T.add(GraphId::OPTIMIZER, opt(RangeOp::SGD_UPDATE, {w_weight, g_weight}, {w_weight}, true));
        break;
      case OptimizerKind::MOMENTUM:
      case OptimizerKind::NESTEROV: {
        const RangeOp op =
            cfg.optimizer == OptimizerKind::MOMENTUM ? RangeOp::MOMENTUM_UPDATE : RangeOp::NESTEROV_UPDATE;
        T.add(GraphId::OPTIMIZER, opt(op, {w_bias, g_bias, m_bias}, {w_bias, m_bias}, false));
        T.add(GraphId::OPTIMIZER, opt(op, {w_weight, g_weight, m_weight}, {w_weight, m_weight}, true));
        break;
      }
      case OptimizerKind::ADAM:
      case OptimizerKind::ADAMW: {
        const RangeOp op = cfg.optimizer == OptimizerKind::ADAM ? RangeOp::ADAM_UPDATE : RangeOp::ADAMW_UPDATE;
        T.add(GraphId::OPTIMIZER, opt(op, {w_bias, g_bias, m_bias, v_bias}, {w_bias, m_bias, v_bias}, false));
        T.add(GraphId::OPTIMIZER,
              opt(op, {w_weight, g_weight, m_weight, v_weight}, {w_weight, m_weight, v_weight}, true));
        break;
      }
      case OptimizerKind::LARS:
        T.add(GraphId::LARS_NORM_OPT, opt(RangeOp::LARS_NORMS, {w_weight, g_weight}, {n_weight}, true));
        T.add(GraphId::LARS_BIAS_OPT, opt(RangeOp::MOMENTUM_UPDATE, {w_bias, g_bias, m_bias}, {w_bias, m_bias}, false));
        T.add(GraphId::LARS_WEIGHT_OPT,
              opt(RangeOp::LARS_UPDATE, {w_weight, g_weight, m_weight, n_weight}, {w_weight, m_weight}, true));
        break;
    }
    if (amp)
      T.add(GraphId::CAST_W_TO_A, range_node(RangeOp::CAST_F32_TO_F16, {{Region::W_FC_WEIGHT, Region::W_DEEP_CONV}},
                                             {{Region::A_FC_WEIGHT, Region::A_DEEP_CONV}}));
    const RegionRange w_all{Region::W_BN_BIAS, Region::W_DEEP_CONV}, e_all{Region::E_BN_BIAS, Region::E_DEEP_CONV};
    if (cfg.ema) {
      T.add(GraphId::EMA_UPDATE, range_node(RangeOp::EMA_UPDATE, {w_all}, {e_all}, {B.hyper, B.nan_flag}));
      T.add(GraphId::EMA_SWITCH, range_node(RangeOp::EMA_SWITCH, {e_all}, {w_all}));
    }
    metrics(T, GraphId::ACCUM_METRICS_TRAIN, B.labels);
    T.add(GraphId::TRAIN_RESULT_COMM, range_node(RangeOp::ALLREDUCE_SUM, {kResultAccumulated}, {kResultAccumulated}));
    T.add(GraphId::CLEAR_METRICS, range_node(RangeOp::CLEAR, {}, {kResultAccumulated}));
  }

  /// Phase 4c: the inference graph (validation variants have only this one).
  void build_inference_graph() {
    ComputationGraph& I = out.inference;
    const BaselineIds& B = out.baseline;
    const bool amp = cfg.amp;
    I.add(GraphId::TRANSFER_A, range_node(RangeOp::H2D_COPY, {}, {in_a}));
    I.add(GraphId::TRANSFER_B, range_node(RangeOp::H2D_COPY, {}, {in_b}));
    for (auto [gid, labels, data, ema] : {std::tuple{GraphId::INF_MAIN_A, B.labels_a, B.data_a, false},
                                          std::tuple{GraphId::INF_MAIN_B, B.labels_b, B.data_b, false},
                                          std::tuple{GraphId::INF_EMA_A, B.labels_a, B.data_a, true},
                                          std::tuple{GraphId::INF_EMA_B, B.labels_b, B.data_b, true}}) {
      if (ema && !cfg.ema) continue;
      I.add(gid, compute_node(OpKind::COPY, {labels}, {B.labels}));
      add_all(I, gid, forward(0, lowered.size(), data, true, ema));
    }
    if (cfg.ema && amp)
      I.add(GraphId::CAST_E_TO_E16, range_node(RangeOp::CAST_F32_TO_F16, {{Region::E_FC_WEIGHT, Region::E_DEEP_CONV}},
                                               {{Region::E_FC_WEIGHT_FP16, Region::E_DEEP_CONV_FP16}}));
    metrics(I, GraphId::ACCUM_METRICS_VAL_A, B.labels_a);
    metrics(I, GraphId::ACCUM_METRICS_VAL_B, B.labels_b);
    I.add(GraphId::VAL_RESULT_COMM, range_node(RangeOp::ALLREDUCE_SUM, {kResultAccumulated}, {kResultAccumulated}));
    I.add(GraphId::CLEAR_METRICS, range_node(RangeOp::CLEAR, {}, {kResultAccumulated}));
    // UPDATE_BN_INF_PARAMS stays empty until BN is folded into the next conv (W_EQ_* regions, DESIGN §11).
  }

  /// Phase 5: the step schedule, then every variant finalized (with reuse, the activation pool placed by the
  /// lifetimes its tensors have in the schedule: the same in every variant, one topology) and checked to share one
  /// layout.
  void place_memory() {
    // The fusion phase first: the lifetimes below read the fused passes' operands.
    plan_fusions(out.train, out.memory[0], cfg.fuse_kernels, cfg.fuse_residual_bn_backward,
                 cfg.fuse_shortcut_bn_backward);
    plan_fusions(out.inference, out.memory[0], cfg.fuse_kernels, cfg.fuse_residual_bn_backward,
                 cfg.fuse_shortcut_bn_backward);
    if (cfg.fuse_kernels && cfg.relu_masks) plan_relu_masks(out.train, out.memory);
    out.schedule = build_step_schedule();
    if (cfg.reuse_memory) {
      const Liveness live = compute_liveness(out.memory[0], out.train, out.inference, &out.schedule);
      for (MemoryPlan& p : out.memory) p.set_lifetimes(live.lifetimes);
    }
    for (std::size_t v = 0; v < nv; ++v) out.memory[v].finalize(v == 0 ? nullptr : &out.memory[0]);
    for (std::size_t v = 1; v < nv; ++v) {
      const auto& a = out.memory[0].tensors();
      const auto& c = out.memory[v].tensors();
      RN_CHECK(a.size() == c.size(), "internal: variant '{}' has {} tensors, train_base {}", out.memory[v].variant(),
               c.size(), a.size());
      for (std::size_t t = 0; t < a.size(); ++t)
        RN_CHECK(a[t].offset == c[t].offset && a[t].name == c[t].name && a[t].slot_bytes == c[t].slot_bytes,
                 "internal: tensor '{}' has offset {} in train_base but {} in '{}'", a[t].name, a[t].offset,
                 c[t].offset, out.memory[v].variant());
    }
  }

  CompiledPlan finish() {
    out.hash = content_hash(out);
    return std::move(out);
  }

 private:
  /// Runs `fn(plan, spec, variant)` on every variant's memory plan; the tensor ids must agree.
  template <typename F>
  TensorId each(F&& fn) {
    TensorId id = kNoTensor;
    for (std::size_t v = 0; v < nv; ++v) {
      const TensorId got = fn(out.memory[v], out.specs[v], v);
      RN_CHECK(v == 0 || got == id, "internal: tensor ids diverge between variants");
      id = got;
    }
    return id;
  }
  /// Phase 2: the slot of (layer, tensor) is its largest size over the variants.
  std::int64_t max_slot(std::size_t layer, std::size_t t) const {
    std::int64_t m = 0;
    for (std::size_t v = 0; v < nv; ++v) {
      const TensorDesc& d = vt[v].tensors[layer].tensors[t];
      m = std::max(m, compute_slot_bytes(d.shape, d.dtype, d.region));
    }
    return m;
  }
  /// A baseline tensor of region `r`, shaped per variant, with one slot (the largest) in all.
  template <typename ShapeOf>
  TensorId baseline(Region r, const char* name, ShapeOf shape_of, DType t) {
    std::int64_t slot = 0;
    for (std::size_t v = 0; v < nv; ++v) slot = std::max(slot, compute_slot_bytes(shape_of(out.specs[v]), t, r));
    return each(
        [&](MemoryPlan& p, const CompileSpec& s, std::size_t) { return p.alloc_other(r, name, shape_of(s), t, slot); });
  }
  /// The forward (or inference) nodes of lowered layers [begin, end), grouped into fused nodes.
  std::vector<Node> forward(std::size_t begin, std::size_t end, TensorId data, bool inference, bool ema) const {
    const LayerRegistry& reg = LayerRegistry::instance();
    const bool amp = cfg.amp;
    const Build& b = *build;
    std::vector<std::pair<int, Node>> nodes;
    for (std::size_t i = begin; i < end; ++i) {
      const LoweredLayer& L = vt[0].layers[i];
      const LayerDescriptor& d = reg.get(L.layer.kind);
      const LayerIds ids = b.layer_ids(i, data);
      const BuildFlags f{amp, ema};
      for (Node& n : inference ? d.build_inference(L.layer, ids, f) : d.build_forward(L.layer, ids, f))
        nodes.emplace_back(L.owner, std::move(n));
    }
    return group(arch, std::move(nodes), inference ? OpKind::FUSED_INFER : OpKind::FUSED_FWD);
  }
  /// METRICS on the logits and `labels`, then the accumulation of the step's result.
  void metrics(ComputationGraph& g, GraphId gid, TensorId labels) const {
    const BaselineIds& B = out.baseline;
    g.add(gid, compute_node(OpKind::METRICS, {B.logits, labels}, {B.result, B.predicted}));
    g.add(gid, range_node(RangeOp::METRIC_ACCUMULATE, {kResultStep}, {kResultAccumulated}));
  }

  static constexpr RegionRange kResultStep{Region::R_RESULT, Region::R_RESULT};
  static constexpr RegionRange kResultAccumulated{Region::R_RESULT_ACCUMULATED, Region::R_RESULT_ACCUMULATED};
  static constexpr RegionRange in_a{Region::I_A_LABEL, Region::I_A_DATA};
  static constexpr RegionRange in_b{Region::I_B_LABEL, Region::I_B_DATA};

  const ArchPlan& arch;
  const TrainConfig& cfg;
  CompiledPlan out;
  std::vector<LoweredLayer> lowered;
  std::vector<Compiler::VariantTensors> vt;
  std::size_t nv = 0;
  std::optional<Build> build;  ///< from phase 3b on
};

}  // namespace

namespace {
CompiledPlan compile_once(const ArchPlan& arch, const TrainConfig& cfg) {
  CompileRun run(arch, cfg);
  run.derive_shapes();
  run.allocate_baseline();
  run.allocate_layer_tensors();
  run.size_gradient_slots();
  run.build_train_graph();
  run.build_inference_graph();
  run.place_memory();
  return run.finish();
}
}  // namespace

CompiledPlan Compiler::compile(const ArchPlan& arch, const TrainConfig& cfg) {
  g_compilations.fetch_add(1);
  RN_CHECK(cfg.recompute_budget_bytes >= 0, "recompute budget: {} bytes", cfg.recompute_budget_bytes);
  RN_CHECK(cfg.recompute_budget_bytes == 0 || cfg.recompute_bn_relu,
           "a recompute budget (--recompute-budget) needs recomputation on (--recompute bn-relu)");
  if (!cfg.recompute_bn_relu || cfg.recompute_budget_bytes == 0 || cfg.recompute_limit >= 0)
    return compile_once(arch, cfg);
  // The fewest recomputed values (forward order) that bring the arena within the budget: recomputing more keeps
  // fewer values through the peak, so the arena shrinks as the count grows (a bisection; the plan it returns is
  // within the budget unless even recomputing all is not).
  TrainConfig c = cfg;
  CompiledPlan best = compile_once(arch, c);  // limit -1: every candidate; its config records how many
  const std::int64_t budget = cfg.recompute_budget_bytes;
  if (best.arena_bytes() > budget) return best;
  c.recompute_limit = 0;
  CompiledPlan none = compile_once(arch, c);
  if (none.arena_bytes() <= budget) return none;
  int lo = 0, hi = best.config.recompute_limit;  // arena(lo) > budget >= arena(hi)
  while (hi - lo > 1) {
    c.recompute_limit = lo + (hi - lo) / 2;
    CompiledPlan p = compile_once(arch, c);
    if (p.arena_bytes() <= budget) {
      hi = c.recompute_limit;
      best = std::move(p);
    } else {
      lo = c.recompute_limit;
    }
  }
  return best;
}

std::int64_t CompiledPlan::arena_bytes() const {
  std::int64_t m = 0;
  for (const MemoryPlan& p : memory) m = std::max(m, p.total_bytes());
  return m;
}

bool operator==(const CompiledPlan& a, const CompiledPlan& b) {
  auto same_base = [](const BaselineIds& x, const BaselineIds& y) {
    return x.labels_a == y.labels_a && x.data_a == y.data_a && x.labels_b == y.labels_b && x.data_b == y.data_b &&
           x.hyper == y.hyper && x.loss_scale == y.loss_scale && x.nan_flag == y.nan_flag && x.step == y.step &&
           x.labels == y.labels && x.result == y.result && x.predicted == y.predicted &&
           x.accumulated == y.accumulated && x.logits == y.logits;
  };
  return a.arch == b.arch && a.config == b.config && a.specs == b.specs && a.memory == b.memory && a.train == b.train &&
         a.inference == b.inference && same_base(a.baseline, b.baseline) && a.hash == b.hash;
}

}  // namespace renaissance::plan
