// ComputationGraph: COMPUTE and RANGE nodes bucketed by GraphId (DESIGN §6). Nodes hold no shapes:
// a node's tensor ids resolve through the variant's MemoryPlan, so one graph serves every variant.
#pragma once

#include <renaissance/core/dtensor.h>
#include <renaissance/core/region.h>
#include <renaissance/ops/activations.h>
#include <renaissance/ops/fused.h>
#include <renaissance/plan/arch_plan.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::plan {

#define RN_GRAPH_IDS(X)                                                                            \
  X(TRANSFER_A) X(TRANSFER_B) X(FIRST_LAYER_FWD_A) X(FIRST_LAYER_FWD_B) X(DEEP_FWD_BWD) X(ZERO_GRAD) \
  X(FIRST_LAYER_BWD_A) X(FIRST_LAYER_BWD_B) X(FIRST_COMM) X(DEEP_COMM) X(CAST_W_TO_A)               \
  X(CAST_G16_TO_G) X(CAST_E_TO_E16) X(NAN_CHECK_AND_GRAD_SCALING) X(STATS_COMM) X(UPDATE_STATS)     \
  X(OPTIMIZER) X(EMA_UPDATE) X(INF_MAIN_A) X(INF_MAIN_B) X(INF_EMA_A) X(INF_EMA_B)                  \
  X(ACCUM_METRICS_TRAIN) X(ACCUM_METRICS_VAL_A) X(ACCUM_METRICS_VAL_B) X(TRAIN_RESULT_COMM)         \
  X(VAL_RESULT_COMM) X(CLEAR_METRICS) X(LARS_NORM_OPT) X(LARS_BIAS_OPT) X(LARS_WEIGHT_OPT)          \
  X(UPDATE_BN_INF_PARAMS) X(EMA_SWITCH)

enum class GraphId : std::uint8_t {
#define RN_GID_ENUM(name) name,
  RN_GRAPH_IDS(RN_GID_ENUM)
#undef RN_GID_ENUM
  COUNT
};
constexpr int kGraphIds = static_cast<int>(GraphId::COUNT);
static_assert(kGraphIds == 33, "DESIGN §6 has 33 GraphId buckets");
const char* graph_id_name(GraphId g);

/// COMPUTE ops: one per layer pass. Fused layers use FUSED_* with their plain decomposition as sub-nodes.
#define RN_OP_KINDS(X)                                                                                    \
  X(CONV_FWD) X(CONV_BWD_DATA) X(CONV_BWD_FILTER) X(BN_FWD_TRAIN) X(BN_FWD_INFER) X(BN_BWD) X(RELU_FWD)    \
  X(RELU_BWD) X(TANH_FWD) X(TANH_BWD) X(MAXPOOL_FWD) X(MAXPOOL_BWD) X(GAP_FWD) X(GAP_BWD) X(FLATTEN_FWD)   \
  X(FLATTEN_BWD) X(FC_FWD) X(FC_BWD_DATA) X(FC_BWD_WEIGHT) X(SOFTMAX_CE_FWD) X(SOFTMAX_CE_BWD)             \
  X(CHANNEL_PAD_FWD) X(CHANNEL_PAD_BWD) X(ADD2_FWD) X(COPY) X(ACCUMULATE) X(METRICS) X(FUSED_FWD)         \
  X(FUSED_BWD) X(FUSED_INFER) RN_ACTIVATION_OP_KINDS(X) X(BN_APPLY)
enum class OpKind : std::uint8_t {
#define RN_OP_ENUM(name) name,
  RN_OP_KINDS(RN_OP_ENUM)
#undef RN_OP_ENUM
  COUNT
};
const char* op_kind_name(OpKind k);

/// The forward and backward ops of an activation (ops/activations.h).
inline OpKind activation_op(ops::Activation a, bool backward) {
  switch (a) {
#define RN_CG_ACT_OP(F, P, key) \
  case ops::Activation::F: return backward ? OpKind::P##_BWD : OpKind::P##_FWD;
    RN_ACTIVATIONS(RN_CG_ACT_OP)
#undef RN_CG_ACT_OP
  }
  return OpKind::COUNT;
}

/// A weight-gradient pass and the data-gradient pass right after it (same layer): they read the same gradient and
/// neither reads what the other writes, so the runtime may run the first on a second compute stream beside the second
/// (DESIGN §7), and the liveness analysis gives both one program point.
inline bool runs_beside(OpKind weight_grad, OpKind data_grad) {
  return (weight_grad == OpKind::CONV_BWD_FILTER && data_grad == OpKind::CONV_BWD_DATA) ||
         (weight_grad == OpKind::FC_BWD_WEIGHT && data_grad == OpKind::FC_BWD_DATA);
}

/// RANGE ops: one kernel over a whole region range, however many layers the model has.
#define RN_RANGE_OPS(X)                                                                                    \
  X(H2D_COPY) X(CLEAR) X(D2D_COPY) X(CAST_F32_TO_F16) X(CAST_F16_TO_F32) X(SGD_UPDATE) X(MOMENTUM_UPDATE)   \
  X(NESTEROV_UPDATE) X(ADAM_UPDATE) X(ADAMW_UPDATE) X(LARS_NORMS) X(LARS_UPDATE) X(EMA_UPDATE)             \
  X(EMA_SWITCH) X(BN_STATS_ALLREDUCE) X(BN_RUNNING_UPDATE) X(ALLREDUCE_MEAN) X(ALLREDUCE_SUM) X(NAN_CHECK) \
  X(GRAD_SCALE) X(LOSS_SCALE_UPDATE) X(METRIC_ACCUMULATE)
enum class RangeOp : std::uint8_t {
#define RN_ROP_ENUM(name) name,
  RN_RANGE_OPS(RN_ROP_ENUM)
#undef RN_ROP_ENUM
  COUNT
};
const char* range_op_name(RangeOp k);

enum class NodeType : std::uint8_t { COMPUTE, RANGE };

/// A named operand of a fused pass ("x", "gamma", "shortcut.invstd", ...).
struct FusedOperand {
  std::string name;
  TensorId id = kNoTensor;
  friend bool operator==(const FusedOperand& a, const FusedOperand& b) { return a.name == b.name && a.id == b.id; }
};
/// The operand of `v` named `name`, or null.
inline const FusedOperand* find_operand(const std::vector<FusedOperand>& v, const std::string& name) {
  for (const FusedOperand& o : v)
    if (o.name == name) return &o;
  return nullptr;
}

/// One fused pass of a FUSED_* node (ops/fused.h), decided by the compiler (plan/fusion.cpp): it runs where sub-node
/// `at` stands and replaces the sub-nodes in `parts` (indices into Node::sub; `at` among them). The roles name its
/// parts: `bn` the BN (BN_BWD for RELU_BN_BWD), `relu` the RELU_FWD/RELU_BWD, `add` the ADD2_FWD, `shortcut_bn` the
/// projection shortcut's BN whose apply this pass does (-1: none). inputs/outputs are every tensor the fused kernel
/// reads and writes (the liveness analysis reads them, nothing else is guessed); saved are the outputs later
/// passes read (the backward's statistics). A node without passes runs its parts one by one.
struct FusedPass {
  ops::FusedKind kind = ops::FusedKind::BN_RELU;
  std::int32_t at = -1;
  std::vector<std::int32_t> parts;
  std::int32_t bn = -1, relu = -1, add = -1, shortcut_bn = -1;
  std::vector<FusedOperand> inputs, outputs, saved;
  /// BN_RELU_RECOMPUTE only: nothing the fused program runs reads its output (the one reader is a ReLU backward that
  /// a RELU_BN_BWD pass replaces): the backends skip it when they run the passes and run its parts for the plain
  /// fallback, whose ReLU backward reads the copy. The liveness analysis keeps its bytes either way.
  bool fallback_only = false;
  friend bool operator==(const FusedPass& a, const FusedPass& b) {
    return a.kind == b.kind && a.at == b.at && a.parts == b.parts && a.bn == b.bn && a.relu == b.relu &&
           a.add == b.add && a.shortcut_bn == b.shortcut_bn && a.inputs == b.inputs && a.outputs == b.outputs &&
           a.saved == b.saved && a.fallback_only == b.fallback_only;
  }
};

struct Node {
  NodeType type = NodeType::COMPUTE;
  // COMPUTE
  OpKind op = OpKind::COPY;
  LayerKind layer_kind = LayerKind::Identity;  ///< the layer this node belongs to (fused kind for FUSED_*)
  std::int32_t layer_index = -1;               ///< index into ArchPlan::layers, -1 for none
  LayerParams params;
  bool accumulate = false;  ///< outputs are added to (dx of a residual branch, weight gradients)
  std::vector<TensorId> inputs, outputs;
  std::vector<Node> sub;           ///< FUSED_*: the plain decomposition (the per-layer fallback: run one by one)
  std::vector<FusedPass> fusions;  ///< FUSED_*: the fused passes over `sub` the compiler chose, in `at` order
  // RANGE
  RangeOp range_op = RangeOp::CLEAR;
  std::vector<RegionRange> input_ranges, output_ranges;
  bool apply_weight_decay = false;  ///< optimizer on the weight block (true) or the bias/BN block (false)

  friend bool operator==(const Node& a, const Node& b);
  friend bool operator!=(const Node& a, const Node& b) { return !(a == b); }
};

class ComputationGraph {
 public:
  explicit ComputationGraph(std::string name = {}) : m_name(std::move(name)) {}
  void add(GraphId g, Node n) { m_buckets[static_cast<std::size_t>(g)].push_back(std::move(n)); }
  const std::vector<Node>& bucket(GraphId g) const { return m_buckets[static_cast<std::size_t>(g)]; }
  std::vector<Node>& mutable_bucket(GraphId g) { return m_buckets[static_cast<std::size_t>(g)]; }
  bool has(GraphId g) const { return !bucket(g).empty(); }
  std::size_t node_count() const;
  const std::string& name() const { return m_name; }
  friend bool operator==(const ComputationGraph& a, const ComputationGraph& b) {
    return a.m_name == b.m_name && a.m_buckets == b.m_buckets;
  }
  friend bool operator!=(const ComputationGraph& a, const ComputationGraph& b) { return !(a == b); }

 private:
  std::string m_name;
  std::array<std::vector<Node>, kGraphIds> m_buckets;
};

/// A FUSED_* node's operands: the union of its parts' inputs and outputs, in part order (each id once).
void set_fused_operands(Node& fused);

// Node builders.
Node compute_node(OpKind op, std::vector<TensorId> in, std::vector<TensorId> out, LayerParams params = NoParams{});
Node range_node(RangeOp op, std::vector<RegionRange> in, std::vector<RegionRange> out,
                std::vector<TensorId> scalar_inputs = {});

}  // namespace renaissance::plan
