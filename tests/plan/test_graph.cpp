// ComputationGraph: the 33 buckets, the RANGE ops a training step needs per configuration, fused nodes, tensor
// ids, and a gradient-slot lifetime check that replays the backward pass (STYLE habit 8).
#include "compile_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

using namespace plan_test;
using renaissance::RegionRange;
using rp::GraphId;
using rp::Node;
using rp::NodeType;
using rp::OpKind;
using rp::RangeOp;

namespace {

std::vector<const Node*> range_ops(const rp::ComputationGraph& g, GraphId id, RangeOp op) {
  std::vector<const Node*> v;
  for (const Node& n : g.bucket(id))
    if (n.type == NodeType::RANGE && n.range_op == op) v.push_back(&n);
  return v;
}

bool spans(const std::vector<RegionRange>& v, RegionRange r) { return std::find(v.begin(), v.end(), r) != v.end(); }

std::int64_t count_ops(const rp::ComputationGraph& g, std::initializer_list<GraphId> ids, OpKind op) {
  std::int64_t n = 0;
  for (GraphId id : ids) visit(g.bucket(id), [&](const Node& x) { n += x.type == NodeType::COMPUTE && x.op == op; });
  return n;
}

const RegionRange kGAll{Region::G_BN_BIAS, Region::G_DEEP_CONV};
const RegionRange kWBias{Region::W_BN_BIAS, Region::W_FC_BIAS};
const RegionRange kWWeight{Region::W_FC_WEIGHT, Region::W_DEEP_CONV};

// ---- the lifetime checker ---------------------------------------------------------------------------

/// Replays nodes in order and checks every read of a gradient-slot view: the bytes of its slot must still hold a
/// value meant for that view, i.e. the last overwrite of the slot was a write of the same feature's gradient, or of
/// the output of a residual add the feature feeds (the add hands dy to both its inputs without a copy).
class GradSlotChecker {
 public:
  GradSlotChecker(const rp::MemoryPlan& mp, const std::vector<const Node*>& forward) : m_mp(mp) {
    for (const Node* n : forward)
      if (n->op == OpKind::ADD2_FWD && n->type == NodeType::COMPUTE)
        for (TensorId in : n->inputs) m_add_inputs[n->outputs.at(0)].push_back(in);
  }

  void run(const std::vector<const Node*>& nodes) {
    for (const Node* n : nodes) step(*n);
  }
  const std::vector<std::string>& errors() const { return m_errors; }
  int views_seen() const { return static_cast<int>(m_seen.size()); }

 private:
  struct SlotState {
    TensorId writer = renaissance::kNoTensor;  // the feature whose gradient was last written here
  };

  /// A view of a gradient slot (in-place features are aliases too, of other features: not views here).
  bool is_view(TensorId id) const {
    if (id == renaissance::kNoTensor || m_mp.aliases().count(id) == 0) return false;
    const Region r = m_mp.tensor(m_mp.aliases().at(id)).region;
    return r == Region::F_GRAD_SLOT_FP32 || r == Region::F_GRAD_SLOT_FP16;
  }
  TensorId slot_of(TensorId view) const { return m_mp.aliases().at(view); }
  /// "<feature>.grad@<slot>" -> the feature's id
  TensorId feature_of(TensorId view) const {
    const std::string& name = m_mp.tensor(view).name;
    const auto at = name.rfind(".grad@");
    EXPECT_NE(at, std::string::npos) << name;
    return m_mp.at(name.substr(0, at));
  }
  /// May a view of feature `f` read a slot last written for feature `writer`?
  bool related(TensorId f, TensorId writer) const {
    if (f == writer) return true;
    auto it = m_add_inputs.find(writer);
    if (it == m_add_inputs.end()) return false;
    for (TensorId in : it->second)
      if (related(f, in)) return true;
    return false;
  }
  std::string what(const Node& n) const {
    return fmt::format("{} (layer #{}, {})", rp::op_kind_name(n.op), n.layer_index, rp::layer_kind_name(n.layer_kind));
  }

  void read(const Node& n, TensorId v) {
    m_seen.insert(v);
    auto it = m_slot.find(slot_of(v));
    if (it == m_slot.end()) {
      m_errors.push_back(
          fmt::format("{} reads '{}' before anything was written to its slot", what(n), m_mp.tensor(v).name));
      return;
    }
    if (!related(feature_of(v), it->second.writer))
      m_errors.push_back(fmt::format("{} reads '{}' but its slot was overwritten with the gradient of '{}'", what(n),
                                     m_mp.tensor(v).name, m_mp.tensor(it->second.writer).name));
  }

  void step(const Node& n) {
    if (n.type != NodeType::COMPUTE) return;
    std::set<TensorId> read_slots;
    std::map<TensorId, TensorId> read_view_of_slot;
    for (TensorId v : n.inputs)
      if (is_view(v)) {
        read(n, v);
        read_view_of_slot[slot_of(v)] = v;
      }
    for (TensorId v : n.outputs) {
      if (!is_view(v)) continue;
      m_seen.insert(v);
      const TensorId s = slot_of(v);
      if (n.accumulate || n.op == OpKind::ACCUMULATE) {
        read(n, v);  // adding into it: the slot must hold this view's partial gradient
        continue;
      }
      auto r = read_view_of_slot.find(s);
      if (r != read_view_of_slot.end() && r->second != v)
        m_errors.push_back(fmt::format("{} overwrites '{}' in place while reading '{}' from the same slot", what(n),
                                       m_mp.tensor(v).name, m_mp.tensor(r->second).name));
      m_slot[s].writer = feature_of(v);
    }
  }

  const rp::MemoryPlan& m_mp;
  std::map<TensorId, std::vector<TensorId>> m_add_inputs;  // add output -> its two inputs
  std::map<TensorId, SlotState> m_slot;
  std::set<TensorId> m_seen;
  std::vector<std::string> m_errors;
};

std::vector<const Node*> concat(std::initializer_list<std::vector<const Node*>> parts) {
  std::vector<const Node*> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

}  // namespace

// ---- buckets -----------------------------------------------------------------------------------------------

TEST(Graph, ThirtyThreeGraphIds) {
  EXPECT_EQ(rp::kGraphIds, 33);
  std::set<std::string> names;
  for (int i = 0; i < rp::kGraphIds; ++i) names.insert(rp::graph_id_name(static_cast<GraphId>(i)));
  EXPECT_EQ(names.size(), 33u);
  // Every bucket DESIGN §6 names
  for (const char* n : {"TRANSFER_A",
                        "TRANSFER_B",
                        "FIRST_LAYER_FWD_A",
                        "FIRST_LAYER_FWD_B",
                        "DEEP_FWD_BWD",
                        "ZERO_GRAD",
                        "FIRST_LAYER_BWD_A",
                        "FIRST_LAYER_BWD_B",
                        "FIRST_COMM",
                        "DEEP_COMM",
                        "CAST_W_TO_A",
                        "CAST_G16_TO_G",
                        "NAN_CHECK_AND_GRAD_SCALING",
                        "STATS_COMM",
                        "UPDATE_STATS",
                        "OPTIMIZER",
                        "EMA_UPDATE",
                        "INF_MAIN_A",
                        "INF_MAIN_B",
                        "INF_EMA_A",
                        "INF_EMA_B",
                        "ACCUM_METRICS_TRAIN",
                        "VAL_RESULT_COMM",
                        "CLEAR_METRICS",
                        "LARS_NORM_OPT",
                        "LARS_BIAS_OPT",
                        "LARS_WEIGHT_OPT",
                        "UPDATE_BN_INF_PARAMS"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_STREQ(rp::graph_id_name(GraphId::TRANSFER_A), "TRANSFER_A");
}

TEST(Graph, TrainGraphRangeOpsPerConfiguration) {
  for (OptimizerKind opt : {OptimizerKind::SGD, OptimizerKind::MOMENTUM, OptimizerKind::NESTEROV, OptimizerKind::ADAM,
                            OptimizerKind::ADAMW, OptimizerKind::LARS})
    for (bool amp : {false, true})
      for (bool ema : {false, true}) {
        SCOPED_TRACE(::testing::Message() << rp::optimizer_name(opt) << " amp=" << amp << " ema=" << ema);
        Cfg c;
        c.model = "tiny_resnet.yaml";
        c.amp = c.fuse = amp;
        c.opt = opt;
        c.ema = ema;
        const rp::CompiledPlan p = compile(c);
        const rp::ComputationGraph& T = p.train;
        // zero-grad: one CLEAR over all FP32 gradients (+ one over the FP16 ones under AMP)
        const auto clears = range_ops(T, GraphId::ZERO_GRAD, RangeOp::CLEAR);
        ASSERT_EQ(clears.size(), amp ? 2u : 1u);
        EXPECT_TRUE(spans(clears[0]->output_ranges, kGAll));
        if (amp) {
          EXPECT_TRUE(
              spans(clears[1]->output_ranges, (RegionRange{Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16})));
        }
        // NaN check over every gradient; grad scaling only with a loss scale (AMP)
        const auto nan = range_ops(T, GraphId::NAN_CHECK_AND_GRAD_SCALING, RangeOp::NAN_CHECK);
        ASSERT_EQ(nan.size(), 1u);
        EXPECT_TRUE(spans(nan[0]->input_ranges, kGAll));
        EXPECT_EQ(range_ops(T, GraphId::NAN_CHECK_AND_GRAD_SCALING, RangeOp::GRAD_SCALE).size(), amp ? 1u : 0u);
        // comms: bucket 1 = G_DEEP_CONV, bucket 2 = G_BN_BIAS..G_FIRST_CONV
        const auto deep = range_ops(T, GraphId::DEEP_COMM, RangeOp::ALLREDUCE_MEAN);
        const auto first = range_ops(T, GraphId::FIRST_COMM, RangeOp::ALLREDUCE_MEAN);
        ASSERT_EQ(deep.size(), 1u);
        ASSERT_EQ(first.size(), 1u);
        EXPECT_TRUE(spans(deep[0]->output_ranges, rp::kGradBucketDeep));
        EXPECT_TRUE(spans(first[0]->output_ranges, rp::kGradBucketFirst));
        // BN statistics
        EXPECT_EQ(range_ops(T, GraphId::STATS_COMM, RangeOp::BN_STATS_ALLREDUCE).size(), 1u);
        EXPECT_EQ(range_ops(T, GraphId::UPDATE_STATS, RangeOp::BN_RUNNING_UPDATE).size(), 1u);
        // casts only with AMP
        EXPECT_EQ(T.has(GraphId::CAST_W_TO_A), amp);
        EXPECT_EQ(T.has(GraphId::CAST_G16_TO_G), amp);
        if (amp) {
          const auto w2a = range_ops(T, GraphId::CAST_W_TO_A, RangeOp::CAST_F32_TO_F16);
          ASSERT_EQ(w2a.size(), 1u);
          EXPECT_TRUE(spans(w2a[0]->input_ranges, kWWeight));
          EXPECT_TRUE(spans(w2a[0]->output_ranges, (RegionRange{Region::A_FC_WEIGHT, Region::A_DEEP_CONV})));
          // G16 -> G per bucket: bucket 1's cast leads its all-reduce (so both run beside the first layer's backward),
          // the rest of the gradients are cast after it.
          const auto g2g = range_ops(T, GraphId::CAST_G16_TO_G, RangeOp::CAST_F16_TO_F32);
          ASSERT_EQ(g2g.size(), 1u);
          EXPECT_TRUE(spans(g2g[0]->input_ranges, (RegionRange{Region::G_FC_WEIGHT_FP16, Region::G_FIRST_CONV_FP16})));
          EXPECT_TRUE(spans(g2g[0]->output_ranges, (RegionRange{Region::G_FC_WEIGHT, Region::G_FIRST_CONV})));
          const auto deep_cast = range_ops(T, GraphId::DEEP_COMM, RangeOp::CAST_F16_TO_F32);
          ASSERT_EQ(deep_cast.size(), 1u);
          EXPECT_TRUE(spans(deep_cast[0]->input_ranges, (RegionRange{Region::G_DEEP_CONV_FP16, Region::G_DEEP_CONV_FP16})));
          EXPECT_TRUE(spans(deep_cast[0]->output_ranges, rp::kGradBucketDeep));
          EXPECT_EQ(T.bucket(GraphId::DEEP_COMM).front().range_op, RangeOp::CAST_F16_TO_F32);  // cast, then reduce
        } else {
          EXPECT_TRUE(range_ops(T, GraphId::DEEP_COMM, RangeOp::CAST_F16_TO_F32).empty());
        }
        // EMA only with EMA
        EXPECT_EQ(T.has(GraphId::EMA_UPDATE), ema);
        if (ema) {
          EXPECT_EQ(range_ops(T, GraphId::EMA_UPDATE, RangeOp::EMA_UPDATE).size(), 1u);
        }
        // optimizer: the bias/BN block without weight decay, the weight block with it
        const bool lars = opt == OptimizerKind::LARS;
        EXPECT_EQ(T.has(GraphId::OPTIMIZER), !lars);
        EXPECT_EQ(T.has(GraphId::LARS_NORM_OPT), lars);
        EXPECT_EQ(T.has(GraphId::LARS_BIAS_OPT), lars);
        EXPECT_EQ(T.has(GraphId::LARS_WEIGHT_OPT), lars);
        const std::map<OptimizerKind, RangeOp> update = {{OptimizerKind::SGD, RangeOp::SGD_UPDATE},
                                                         {OptimizerKind::MOMENTUM, RangeOp::MOMENTUM_UPDATE},
                                                         {OptimizerKind::NESTEROV, RangeOp::NESTEROV_UPDATE},
                                                         {OptimizerKind::ADAM, RangeOp::ADAM_UPDATE},
                                                         {OptimizerKind::ADAMW, RangeOp::ADAMW_UPDATE}};
        if (!lars) {
          const auto ops = range_ops(T, GraphId::OPTIMIZER, update.at(opt));
          ASSERT_EQ(ops.size(), 2u);
          ASSERT_EQ(T.bucket(GraphId::OPTIMIZER).size(), 2u);
          const Node* bias = spans(ops[0]->output_ranges, kWBias) ? ops[0] : ops[1];
          const Node* weight = bias == ops[0] ? ops[1] : ops[0];
          EXPECT_TRUE(spans(bias->output_ranges, kWBias));
          EXPECT_FALSE(bias->apply_weight_decay);
          EXPECT_TRUE(spans(weight->output_ranges, kWWeight));
          EXPECT_TRUE(weight->apply_weight_decay);
          EXPECT_TRUE(spans(bias->input_ranges, (RegionRange{Region::G_BN_BIAS, Region::G_FC_BIAS})));
          EXPECT_TRUE(spans(weight->input_ranges, (RegionRange{Region::G_FC_WEIGHT, Region::G_DEEP_CONV})));
          const bool m = opt != OptimizerKind::SGD;
          const bool v = opt == OptimizerKind::ADAM || opt == OptimizerKind::ADAMW;
          EXPECT_EQ(spans(weight->output_ranges, (RegionRange{Region::M_FC_WEIGHT, Region::M_DEEP_CONV})), m);
          EXPECT_EQ(spans(weight->output_ranges, (RegionRange{Region::V_FC_WEIGHT, Region::V_DEEP_CONV})), v);
          EXPECT_EQ(spans(bias->output_ranges, (RegionRange{Region::M_BN_BIAS, Region::M_FC_BIAS})), m);
        } else {
          const auto norms = range_ops(T, GraphId::LARS_NORM_OPT, RangeOp::LARS_NORMS);
          ASSERT_EQ(norms.size(), 1u);
          EXPECT_TRUE(spans(norms[0]->output_ranges, (RegionRange{Region::N_FC_WEIGHT, Region::N_DEEP_CONV})));
          const auto w = range_ops(T, GraphId::LARS_WEIGHT_OPT, RangeOp::LARS_UPDATE);
          ASSERT_EQ(w.size(), 1u);
          EXPECT_TRUE(w[0]->apply_weight_decay);
          EXPECT_TRUE(spans(w[0]->output_ranges, kWWeight));
          ASSERT_EQ(T.bucket(GraphId::LARS_BIAS_OPT).size(), 1u);
          EXPECT_FALSE(T.bucket(GraphId::LARS_BIAS_OPT)[0].apply_weight_decay);
          EXPECT_TRUE(spans(T.bucket(GraphId::LARS_BIAS_OPT)[0].output_ranges, kWBias));
        }
        // input transfers, metrics
        EXPECT_EQ(range_ops(T, GraphId::TRANSFER_A, RangeOp::H2D_COPY).size(), 1u);
        EXPECT_EQ(range_ops(T, GraphId::TRANSFER_B, RangeOp::H2D_COPY).size(), 1u);
        EXPECT_EQ(count_ops(T, {GraphId::ACCUM_METRICS_TRAIN}, OpKind::METRICS), 1);
        EXPECT_EQ(range_ops(T, GraphId::ACCUM_METRICS_TRAIN, RangeOp::METRIC_ACCUMULATE).size(), 1u);
        EXPECT_TRUE(T.has(GraphId::CLEAR_METRICS));
        // the train graph has no inference buckets and vice versa
        for (GraphId g : {GraphId::INF_MAIN_A, GraphId::INF_MAIN_B, GraphId::INF_EMA_A, GraphId::INF_EMA_B})
          EXPECT_FALSE(T.has(g));
        const rp::ComputationGraph& I = p.inference;
        EXPECT_TRUE(I.has(GraphId::INF_MAIN_A));
        EXPECT_TRUE(I.has(GraphId::INF_MAIN_B));
        EXPECT_EQ(I.has(GraphId::INF_EMA_A), ema);
        EXPECT_EQ(I.has(GraphId::INF_EMA_B), ema);
        EXPECT_EQ(I.has(GraphId::CAST_E_TO_E16), ema && amp);
        for (GraphId g : {GraphId::OPTIMIZER, GraphId::DEEP_FWD_BWD, GraphId::ZERO_GRAD, GraphId::LARS_WEIGHT_OPT,
                          GraphId::EMA_UPDATE, GraphId::FIRST_LAYER_BWD_A})
          EXPECT_FALSE(I.has(g));
        EXPECT_EQ(count_ops(I, {GraphId::INF_MAIN_A}, OpKind::BN_FWD_TRAIN), 0);
        EXPECT_GT(count_ops(I, {GraphId::INF_MAIN_A}, OpKind::BN_FWD_INFER), 0);
      }
}

TEST(Graph, EveryLayerHasItsPasses) {
  // ResNet-50: 1 stem + 16·3 + 4 projection = 53 convolutions, 53 BNs, 1 fc, 16 residual adds.
  for (bool amp : {false, true}) {
    SCOPED_TRACE(amp);
    Cfg c;
    c.model = "resnet50";
    c.amp = c.fuse = amp;
    c.batch = 2;
    c.dataset = 10;
    c.val = 4;
    c.resolution = 64;
    const rp::CompiledPlan p = compile(c);
    const rp::ComputationGraph& T = p.train;
    const auto fwd = {GraphId::FIRST_LAYER_FWD_A, GraphId::DEEP_FWD_BWD};
    const auto bwd = {GraphId::DEEP_FWD_BWD, GraphId::FIRST_LAYER_BWD_A};
    EXPECT_EQ(count_ops(T, fwd, OpKind::CONV_FWD), 53);
    EXPECT_EQ(count_ops(T, fwd, OpKind::BN_FWD_TRAIN), 53);
    EXPECT_EQ(count_ops(T, fwd, OpKind::ADD2_FWD), 16);
    EXPECT_EQ(count_ops(T, fwd, OpKind::FC_FWD), 1);
    EXPECT_EQ(count_ops(T, fwd, OpKind::SOFTMAX_CE_FWD), 1);
    EXPECT_EQ(count_ops(T, bwd, OpKind::CONV_BWD_FILTER), 53);
    EXPECT_EQ(count_ops(T, bwd, OpKind::CONV_BWD_DATA), 52);  // not for the first layer: its input is the data
    EXPECT_EQ(count_ops(T, bwd, OpKind::BN_BWD), 53);
    EXPECT_EQ(count_ops(T, bwd, OpKind::SOFTMAX_CE_BWD), 1);
    EXPECT_EQ(count_ops(T, {GraphId::FIRST_LAYER_BWD_A}, OpKind::CONV_BWD_DATA), 0);
    EXPECT_EQ(count_ops(T, {GraphId::FIRST_LAYER_BWD_A}, OpKind::CONV_BWD_FILTER), 1);
    EXPECT_EQ(count_ops(T, {GraphId::FIRST_LAYER_FWD_B}, OpKind::CONV_FWD), 1);
    EXPECT_EQ(count_ops(p.inference, {GraphId::INF_MAIN_A}, OpKind::CONV_FWD), 53);
    // the first layer reads the A data buffer in *_A and the B buffer in *_B
    bool reads_a = false, reads_b = false;
    visit(T.bucket(GraphId::FIRST_LAYER_FWD_A),
          [&](const Node& n) { reads_a |= n.op == OpKind::CONV_FWD && n.inputs[0] == p.baseline.data_a; });
    visit(T.bucket(GraphId::FIRST_LAYER_FWD_B),
          [&](const Node& n) { reads_b |= n.op == OpKind::CONV_FWD && n.inputs[0] == p.baseline.data_b; });
    EXPECT_TRUE(reads_a);
    EXPECT_TRUE(reads_b);
    // AMP: weights read from the FP16 copies (A_*), weight gradients written to G_*_FP16
    visit(T.bucket(GraphId::DEEP_FWD_BWD), [&](const Node& n) {
      const auto& m = p.memory[0];
      if (n.op == OpKind::CONV_FWD) {
        EXPECT_EQ(m.tensor(n.inputs[1]).region, amp ? Region::A_DEEP_CONV : Region::W_DEEP_CONV);
      }
      if (n.op == OpKind::CONV_BWD_FILTER) {
        EXPECT_EQ(m.tensor(n.outputs[0]).region, amp ? Region::G_DEEP_CONV_FP16 : Region::G_DEEP_CONV);
      }
    });
    // freezing the first layer drops its backward
    c.freeze_first = true;
    const rp::CompiledPlan frozen = compile(c);
    EXPECT_FALSE(frozen.train.has(GraphId::FIRST_LAYER_BWD_A));
    EXPECT_FALSE(frozen.train.has(GraphId::FIRST_LAYER_BWD_B));
  }
}

TEST(Graph, FusedLayersAreFusedNodesOfPlainOps) {
  Cfg c;
  c.model = "resnet50";
  c.amp = c.fuse = true;
  c.batch = 2;
  c.dataset = 10;
  c.val = 4;
  c.resolution = 64;
  const rp::CompiledPlan p = compile(c);
  std::map<OpKind, int> fused;
  auto check = [&](const Node& n) {
    if (n.op != OpKind::FUSED_FWD && n.op != OpKind::FUSED_BWD && n.op != OpKind::FUSED_INFER) {
      EXPECT_TRUE(n.sub.empty());
      return;
    }
    ++fused[n.op];
    EXPECT_TRUE(rp::is_fused(n.layer_kind)) << rp::layer_kind_name(n.layer_kind);
    ASSERT_GE(n.layer_index, 0);
    EXPECT_EQ(p.arch.layers[static_cast<std::size_t>(n.layer_index)].kind, n.layer_kind);
    EXPECT_FALSE(n.sub.empty());
    for (const Node& s : n.sub) {
      EXPECT_TRUE(s.sub.empty());
      EXPECT_NE(s.op, OpKind::FUSED_FWD);
      EXPECT_NE(s.op, OpKind::FUSED_BWD);
      EXPECT_NE(s.op, OpKind::FUSED_INFER);
      EXPECT_EQ(s.layer_index, n.layer_index);
    }
  };
  for (const Node& n : p.train.bucket(GraphId::FIRST_LAYER_FWD_A)) check(n);
  for (const Node& n : p.train.bucket(GraphId::DEEP_FWD_BWD)) check(n);
  for (const Node& n : p.inference.bucket(GraphId::INF_MAIN_A)) check(n);
  // forward: the stem CBR (first layer) + 16 blocks + GapFC; backward in DEEP_FWD_BWD: 16 blocks + GapFC
  EXPECT_EQ(fused[OpKind::FUSED_FWD], 18);
  EXPECT_EQ(fused[OpKind::FUSED_BWD], 17);
  EXPECT_EQ(fused[OpKind::FUSED_INFER], 18);
  ASSERT_FALSE(p.train.bucket(GraphId::FIRST_LAYER_FWD_A).empty());
  const Node& stem = p.train.bucket(GraphId::FIRST_LAYER_FWD_A).back();
  EXPECT_EQ(stem.op, OpKind::FUSED_FWD);
  EXPECT_EQ(stem.layer_kind, LayerKind::CBR);
  EXPECT_EQ(stem.layer_index, 0);
  // a bottleneck's forward: conv+bn+relu ×2, conv+bn, projection conv+bn, add, relu
  const Node* proj = nullptr;
  for (const Node& n : p.train.bucket(GraphId::DEEP_FWD_BWD))
    if (n.op == OpKind::FUSED_FWD && n.layer_kind == LayerKind::BottleneckProjection) {
      proj = &n;
      break;
    }
  ASSERT_NE(proj, nullptr);
  std::map<OpKind, int> sub;
  for (const Node& s : proj->sub) ++sub[s.op];
  EXPECT_EQ(sub[OpKind::CONV_FWD], 4);
  EXPECT_EQ(sub[OpKind::BN_FWD_TRAIN], 4);
  EXPECT_EQ(sub[OpKind::RELU_FWD], 3);
  EXPECT_EQ(sub[OpKind::ADD2_FWD], 1);
  // FP32 fuses the same layers (the same fused nodes in FP32); without --fuse blocks stay plain, and only Conv+BN+ReLU
  // (CBR) and GAP + FC are fused nodes
  c.amp = false;
  const rp::CompiledPlan fp32 = compile(c);
  std::map<LayerKind, int> kinds_amp, kinds_fp32;
  for (GraphId g : {GraphId::FIRST_LAYER_FWD_A, GraphId::DEEP_FWD_BWD}) {
    visit(p.train.bucket(g), [&](const Node& n) { kinds_amp[n.layer_kind] += n.sub.empty() ? 0 : 1; });
    visit(fp32.train.bucket(g), [&](const Node& n) { kinds_fp32[n.layer_kind] += n.sub.empty() ? 0 : 1; });
  }
  EXPECT_EQ(kinds_amp, kinds_fp32);
  EXPECT_EQ(kinds_fp32[LayerKind::BottleneckProjection], 4 * 2);  // forward and backward of each
  c.fuse = false;
  const rp::CompiledPlan plain = compile(c);
  for (GraphId g : {GraphId::FIRST_LAYER_FWD_A, GraphId::DEEP_FWD_BWD})
    visit(plain.train.bucket(g), [&](const Node& n) {
      if (!n.sub.empty()) {
        EXPECT_TRUE(n.layer_kind == LayerKind::GapFC || n.layer_kind == LayerKind::CBR) << rp::layer_kind_name(n.layer_kind);
      }
    });
}

TEST(Graph, EveryReferencedTensorExists) {
  for (const Cfg& c : {Cfg{}, Cfg{"resnet18_cifar", true, true, OptimizerKind::ADAMW, true},
                       Cfg{"tiny_resnet.yaml", false, false, OptimizerKind::LARS, true},
                       Cfg{"mobilenet_v2", true, true, OptimizerKind::SGD, true, 2, 10, 4, 0, false, 64}}) {
    SCOPED_TRACE(c.model);
    const rp::CompiledPlan p = compile(c);
    const auto n_tensors = static_cast<TensorId>(p.memory[0].tensors().size());
    std::int64_t refs = 0;
    for (const rp::ComputationGraph* g : {&p.train, &p.inference})
      for (int b = 0; b < rp::kGraphIds; ++b)
        visit(g->bucket(static_cast<GraphId>(b)), [&](const Node& n) {
          for (const auto* ids : {&n.inputs, &n.outputs})
            for (TensorId t : *ids) {
              ++refs;
              EXPECT_TRUE(t >= 0 && t < n_tensors)
                  << "tensor id " << t << " in " << rp::graph_id_name(static_cast<GraphId>(b)) << " op "
                  << rp::op_kind_name(n.op);
            }
          for (const auto* rs : {&n.input_ranges, &n.output_ranges})
            for (RegionRange r : *rs) EXPECT_LE(renaissance::region_index(r.first), renaissance::region_index(r.last));
          if (n.type == NodeType::RANGE) {
            EXPECT_FALSE(n.input_ranges.empty() && n.output_ranges.empty() && n.range_op != RangeOp::LOSS_SCALE_UPDATE);
          }
        });
    EXPECT_GT(refs, 100);
    for (TensorId t : {p.baseline.labels_a, p.baseline.data_a, p.baseline.labels_b, p.baseline.data_b, p.baseline.hyper,
                       p.baseline.loss_scale, p.baseline.nan_flag, p.baseline.labels, p.baseline.result,
                       p.baseline.predicted, p.baseline.accumulated, p.baseline.logits})
      EXPECT_TRUE(t >= 0 && t < n_tensors);
    EXPECT_EQ(p.memory[0].tensor(p.baseline.data_a).region, Region::I_A_DATA);
    EXPECT_EQ(p.memory[0].tensor(p.baseline.data_b).region, Region::I_B_DATA);
    EXPECT_EQ(p.memory[0].tensor(p.baseline.result).region, Region::R_RESULT);
  }
}

// ---- gradient-slot lifetimes ----------------------------------------------------------------------------

TEST(GradSlots, CheckerCatchesAnOverwrite) {
  // Two features whose gradients share slot 0: writing b's gradient while a's is still to be read is a bug.
  rp::MemoryPlan mp("hand");
  const TensorId fa = mp.alloc_feature("a.y", Shape{2, 4, 4, 8}, renaissance::DType::F32);
  const TensorId fb = mp.alloc_feature("b.y", Shape{2, 4, 4, 8}, renaissance::DType::F32);
  mp.alloc_grad_slot(0, Shape{2, 4, 4, 8}, renaissance::DType::F32);
  mp.alloc_grad_slot(1, Shape{2, 4, 4, 8}, renaissance::DType::F32);
  const TensorId ga = mp.alias_grad_slot("a.y.grad@0", 0, Shape{2, 4, 4, 8}, renaissance::DType::F32);
  const TensorId gb = mp.alias_grad_slot("b.y.grad@0", 0, Shape{2, 4, 4, 8}, renaissance::DType::F32);
  const TensorId gb1 = mp.alias_grad_slot("b.y.grad@1", 1, Shape{2, 4, 4, 8}, renaissance::DType::F32);
  const Node wa = rp::compute_node(OpKind::RELU_BWD, {fa}, {ga});
  const Node wb = rp::compute_node(OpKind::RELU_BWD, {fb}, {gb});
  const Node wb1 = rp::compute_node(OpKind::RELU_BWD, {fb}, {gb1});
  const Node ra = rp::compute_node(OpKind::RELU_BWD, {fa, ga}, {});
  {
    GradSlotChecker ok(mp, {});
    ok.run({&wa, &wb1, &ra});
    EXPECT_TRUE(ok.errors().empty());
  }
  {
    GradSlotChecker bad(mp, {});
    bad.run({&wa, &wb, &ra});
    ASSERT_EQ(bad.errors().size(), 1u);
    EXPECT_NE(bad.errors()[0].find("a.y.grad@0"), std::string::npos) << bad.errors()[0];
  }
  {  // in place through another view
    const Node inplace = rp::compute_node(OpKind::RELU_BWD, {fa, ga}, {gb});
    GradSlotChecker bad(mp, {});
    bad.run({&wa, &inplace});
    EXPECT_EQ(bad.errors().size(), 1u);
  }
  {  // reading a slot nothing wrote
    GradSlotChecker bad(mp, {});
    bad.run({&ra});
    EXPECT_EQ(bad.errors().size(), 1u);
  }
  {  // a residual add hands its gradient to its inputs: reading a's gradient from the add's is fine
    const TensorId fy = mp.alloc_feature("add.y", Shape{2, 4, 4, 8}, renaissance::DType::F32);
    const TensorId gy = mp.alias_grad_slot("add.y.grad@0", 0, Shape{2, 4, 4, 8}, renaissance::DType::F32);
    const Node add = rp::compute_node(OpKind::ADD2_FWD, {fa, fb}, {fy});
    const Node wy = rp::compute_node(OpKind::RELU_BWD, {fy}, {gy});
    GradSlotChecker ok(mp, {&add});
    ok.run({&wy, &ra});
    EXPECT_TRUE(ok.errors().empty());
    GradSlotChecker unrelated(mp, {});
    unrelated.run({&wy, &ra});
    EXPECT_EQ(unrelated.errors().size(), 1u);
  }
}

TEST(GradSlots, NoGradientViewIsOverwrittenWhileStillToBeRead) {
  for (const Cfg& c : {Cfg{}, Cfg{"tiny_resnet.yaml"}, Cfg{"tiny_resnet.yaml", true, true},
                       Cfg{"resnet18_cifar", false, false}, Cfg{"resnet18_cifar", true, true},
                       Cfg{"resnet50", false, false, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"resnet50", true, true, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"mobilenet_v2", false, false, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"mobilenet_v2", true, true, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"vgg16", false, false, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 32}}) {
    SCOPED_TRACE(::testing::Message() << c.model << " amp=" << c.amp);
    const rp::CompiledPlan p = compile(c);
    const auto forward =
        concat({flat(p.train.bucket(GraphId::FIRST_LAYER_FWD_A)), flat(p.train.bucket(GraphId::DEEP_FWD_BWD))});
    for (GraphId first : {GraphId::FIRST_LAYER_BWD_A, GraphId::FIRST_LAYER_BWD_B}) {
      GradSlotChecker checker(p.memory[0], forward);
      checker.run(concat({flat(p.train.bucket(GraphId::DEEP_FWD_BWD)), flat(p.train.bucket(first))}));
      for (const std::string& e : checker.errors()) ADD_FAILURE() << e;
      EXPECT_GT(checker.views_seen(), 0);
    }
    // every view of a gradient slot is used by some node
    std::set<TensorId> used;
    for (GraphId g : {GraphId::DEEP_FWD_BWD, GraphId::FIRST_LAYER_BWD_A, GraphId::FIRST_LAYER_BWD_B})
      visit(p.train.bucket(g), [&](const Node& n) {
        used.insert(n.inputs.begin(), n.inputs.end());
        used.insert(n.outputs.begin(), n.outputs.end());
      });
    for (auto [view, slot] : p.memory[0].aliases()) {
      const Region r = p.memory[0].tensor(slot).region;
      if (r != Region::F_GRAD_SLOT_FP32 && r != Region::F_GRAD_SLOT_FP16) continue;  // an in-place feature
      EXPECT_TRUE(used.count(view)) << p.memory[0].tensor(view).name;
    }
  }
}

namespace {
// In-place features (ReLU over a BN output, a residual sum over its main branch) overwrite their base: no backward
// node may read the base's value, and the base may have no other reader in the forward pass.
TEST(InPlace, OverwrittenFeaturesAreNeverReadInBackward) {
  for (const char* model : {"resnet50", "resnet18", "mobilenet_v2", "vgg16", "fmnist_cnn"})
    for (bool amp : {false, true}) {
      SCOPED_TRACE(std::string(model) + (amp ? " amp" : " fp32"));
      renaissance::plan::BuildOptions bo;
      bo.amp = amp;
      bo.fuse = amp;
      renaissance::plan::TrainConfig cfg;
      cfg.amp = amp;
      cfg.batch = 8;
      const auto p = renaissance::plan::Compiler::compile(
          renaissance::plan::ArchPlan::build(renaissance::blueprint::zoo_model(model), bo), cfg);
      const auto& mp = p.memory[0];
      std::map<TensorId, std::vector<TensorId>> aliases_of_base;  // base -> in-place results written over it
      for (auto [alias, base] : mp.aliases()) {
        const Region r = mp.tensor(base).region;
        if (r == Region::F_FEATURE_FP32 || r == Region::F_FEATURE_FP16) aliases_of_base[base].push_back(alias);
      }
      if (std::string(model) != "vgg16") {
        EXPECT_FALSE(aliases_of_base.empty());
      }
      for (GraphId g : {GraphId::DEEP_FWD_BWD, GraphId::FIRST_LAYER_BWD_A, GraphId::FIRST_LAYER_BWD_B})
        visit(p.train.bucket(g), [&](const Node& n) {
          const std::string op = renaissance::plan::op_kind_name(n.op);
          if (op.find("BWD") == std::string::npos) return;
          for (TensorId in : n.inputs)
            EXPECT_EQ(aliases_of_base.count(in), 0u) << op << " reads " << mp.tensor(in).name
                                                      << ", which an in-place result overwrote";
        });
      // every alias of a feature has the base's offset
      for (auto& [base, list] : aliases_of_base)
        for (TensorId a : list) EXPECT_EQ(mp.tensor(a).offset, mp.tensor(base).offset);
    }
}
}  // namespace
