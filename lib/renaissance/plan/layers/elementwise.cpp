// Element-wise kinds: ReLU, Tanh, channel padding, the residual add, and the pass-through markers.
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

namespace {

LayerDescriptor unary(LayerKind kind, OpKind fwd_op, OpKind bwd_op, bool bwd_reads_y) {
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
  d.build_backward = [bwd_op, bwd_reads_y](const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx, bool acc,
                                           const BuildFlags&) {
    std::vector<Node> v;
    if (dx == kNoTensor) return v;
    Node n = layer_node(bwd_op, l, {bwd_reads_y ? ids.y : ids.x, dy}, {dx});
    n.accumulate = acc;
    v.push_back(n);
    return v;
  };
  return d;
}

LayerDescriptor pass_through(LayerKind kind) {
  LayerDescriptor d;
  d.kind = kind;
  d.pass_through = true;
  d.infer_tensors = [](const ArchLayer&, const Shape&, const Shape&, const InferContext&) { return LayerTensors{}; };
  auto none = [](const ArchLayer&, const LayerIds&, const BuildFlags&) { return std::vector<Node>{}; };
  d.build_forward = none;
  d.build_inference = none;
  d.build_backward = [](const ArchLayer&, const LayerIds&, TensorId, TensorId, bool, const BuildFlags&) {
    return std::vector<Node>{};  // gradients route through the compiler's gradient map
  };
  return d;
}
}  // namespace

void register_elementwise_layers(LayerRegistry& r) {
  r.add(unary(LayerKind::Relu, OpKind::RELU_FWD, OpKind::RELU_BWD, true));
  r.add(unary(LayerKind::Tanh, OpKind::TANH_FWD, OpKind::TANH_BWD, true));
  // ops/activations.h: the backward pass reads x.
#define RN_PLAN_ACT_LAYER(F, P, key) r.add(unary(LayerKind::F, OpKind::P##_FWD, OpKind::P##_BWD, false));
  RN_ACTIVATIONS(RN_PLAN_ACT_LAYER)
#undef RN_PLAN_ACT_LAYER
  r.add(unary(LayerKind::ChannelPadding, OpKind::CHANNEL_PAD_FWD, OpKind::CHANNEL_PAD_BWD, false));
  r.add(pass_through(LayerKind::Identity));
  r.add(pass_through(LayerKind::Add2Start));
  r.add(pass_through(LayerKind::Add2ShortcutEnd));

  // y = main + shortcut. Backward needs no node: the compiler hands dy to both branches.
  LayerDescriptor add;
  add.kind = LayerKind::Add2End;
  add.infer_tensors = [](const ArchLayer&, const Shape&, const Shape& out, const InferContext& ctx) {
    return LayerTensors{{}, {output_feature(out, ctx)}};
  };
  auto fwd = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags&) {
    return std::vector<Node>{layer_node(OpKind::ADD2_FWD, l, {ids.x, ids.x2}, {ids.y})};
  };
  add.build_forward = fwd;
  add.build_inference = fwd;
  add.build_backward = [](const ArchLayer&, const LayerIds&, TensorId, TensorId, bool, const BuildFlags&) {
    return std::vector<Node>{};
  };
  r.add(std::move(add));
}

}  // namespace renaissance::plan
