#include <renaissance/plan/computation_graph.h>

#include <algorithm>

namespace renaissance::plan {

namespace {
constexpr const char* kGraphNames[] = {
#define RN_GID_STR(name) #name,
    RN_GRAPH_IDS(RN_GID_STR)
#undef RN_GID_STR
};
constexpr const char* kOpNames[] = {
#define RN_OP_STR(name) #name,
    RN_OP_KINDS(RN_OP_STR)
#undef RN_OP_STR
};
constexpr const char* kRangeNames[] = {
#define RN_ROP_STR(name) #name,
    RN_RANGE_OPS(RN_ROP_STR)
#undef RN_ROP_STR
};
}  // namespace

const char* graph_id_name(GraphId g) {
  const int i = static_cast<int>(g);
  return i >= 0 && i < kGraphIds ? kGraphNames[i] : "?";
}
const char* op_kind_name(OpKind k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < static_cast<int>(OpKind::COUNT) ? kOpNames[i] : "?";
}
const char* range_op_name(RangeOp k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < static_cast<int>(RangeOp::COUNT) ? kRangeNames[i] : "?";
}

bool operator==(const Node& a, const Node& b) {
  return a.type == b.type && a.op == b.op && a.layer_kind == b.layer_kind && a.layer_index == b.layer_index &&
         a.params == b.params && a.accumulate == b.accumulate && a.inputs == b.inputs && a.outputs == b.outputs &&
         a.sub == b.sub && a.range_op == b.range_op && a.input_ranges == b.input_ranges &&
         a.output_ranges == b.output_ranges && a.apply_weight_decay == b.apply_weight_decay && a.fusions == b.fusions;
}

std::size_t ComputationGraph::node_count() const {
  std::size_t n = 0;
  for (const auto& b : m_buckets) n += b.size();
  return n;
}

void set_fused_operands(Node& fused) {
  fused.inputs.clear();
  fused.outputs.clear();
  auto add = [](std::vector<TensorId>& to, const std::vector<TensorId>& ids) {
    for (TensorId t : ids)
      if (t != kNoTensor && std::find(to.begin(), to.end(), t) == to.end()) to.push_back(t);
  };
  for (const Node& s : fused.sub) {
    add(fused.inputs, s.inputs);
    add(fused.outputs, s.outputs);
  }
}

Node compute_node(OpKind op, std::vector<TensorId> in, std::vector<TensorId> out, LayerParams params) {
  Node n;
  n.type = NodeType::COMPUTE;
  n.op = op;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.params = std::move(params);
  return n;
}

Node range_node(RangeOp op, std::vector<RegionRange> in, std::vector<RegionRange> out, std::vector<TensorId> scalars) {
  Node n;
  n.type = NodeType::RANGE;
  n.range_op = op;
  n.input_ranges = std::move(in);
  n.output_ranges = std::move(out);
  n.inputs = std::move(scalars);
  return n;
}

}  // namespace renaissance::plan
