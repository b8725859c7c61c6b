// Max-pool (argmax saved for backward as a one-byte window position), global average pool, flatten (a compacting
// copy).
#include <renaissance/core/error.h>
#include <renaissance/ops/pool.h>
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

namespace {

LayerDescriptor simple(LayerKind kind, OpKind fwd_op, OpKind bwd_op) {
  LayerDescriptor d;
  d.kind = kind;
  d.infer_tensors = [](const ArchLayer&, const Shape&, const Shape& out, const InferContext& ctx) {
    return LayerTensors{{}, {output_feature(out, ctx)}};
  };
  auto fwd = [fwd_op](const ArchLayer& l, const LayerIds& ids, const BuildFlags&) {
    return std::vector<Node>{layer_node(fwd_op, l, {ids.x}, {ids.y})};
  };
  d.build_forward = fwd;
  d.build_inference = fwd;
  d.build_backward = [bwd_op](const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx, bool acc,
                              const BuildFlags&) {
    std::vector<Node> v;
    if (dx == kNoTensor) return v;
    Node n = layer_node(bwd_op, l, {dy}, {dx});
    n.accumulate = acc;
    v.push_back(n);
    return v;
  };
  return d;
}
}  // namespace

void register_pool_layers(LayerRegistry& r) {
  LayerDescriptor mp;
  mp.kind = LayerKind::MaxPool;
  mp.infer_tensors = [](const ArchLayer& l, const Shape&, const Shape& out, const InferContext& ctx) {
    RN_CHECK(l.pool().k * l.pool().k <= ops::kMaxPoolWindow, "max-pool '{}': a {}x{} window has more positions than its one-byte argmax "
             "holds (at most 15x15)", l.name, l.pool().k, l.pool().k);
    // One byte per output: the winner's position in its window (kh·k + kw), which the backward pass reads.
    return LayerTensors{{}, {output_feature(out, ctx), {"argmax", out, DType::U8, Region::T_TEMP_INT8}}};
  };
  auto fwd = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags&) {
    // Operands in the order of ops::MaxPoolFwd.
    return std::vector<Node>{layer_node(OpKind::MAXPOOL_FWD, l, {ids.x}, {ids.y, ids.tensor("argmax")})};
  };
  mp.build_forward = fwd;
  mp.build_inference = fwd;
  mp.build_backward = [](const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx, bool acc,
                         const BuildFlags&) {
    std::vector<Node> v;
    if (dx == kNoTensor) return v;
    Node n = layer_node(OpKind::MAXPOOL_BWD, l, {dy, ids.tensor("argmax")}, {dx});  // ops::MaxPoolBwd
    n.accumulate = acc;
    v.push_back(n);
    return v;
  };
  r.add(std::move(mp));
  r.add(simple(LayerKind::Gap, OpKind::GAP_FWD, OpKind::GAP_BWD));
  r.add(simple(LayerKind::Flatten, OpKind::FLATTEN_FWD, OpKind::FLATTEN_BWD));
}

}  // namespace renaissance::plan
