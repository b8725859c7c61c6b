// Batch norm 2d/1d: y = (x − μ_B)/√(σ²_B + ε)·γ + β in training; running statistics in inference.
// Batch statistics go to B_NEXT_* (all-reduced for sync BN), running statistics live in B_PREV_*
// and are blended from B_NEXT_* by one UPDATE_STATS range op per step.
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

namespace {
LayerDescriptor bn_descriptor(LayerKind kind) {
  LayerDescriptor d;
  d.kind = kind;
  d.infer_tensors = [](const ArchLayer&, const Shape& in, const Shape& out, const InferContext& ctx) {
    LayerTensors t;
    const Shape ch{1, 1, 1, in.c};
    t.params.push_back({"gamma", ch, ParamKind::BN_WEIGHT});
    t.params.push_back({"beta", ch, ParamKind::BN_BIAS});
    t.tensors.push_back(output_feature(out, ctx));
    t.tensors.push_back({"running_mean", ch, DType::F32, Region::B_PREV_MEAN});
    t.tensors.push_back({"running_var", ch, DType::F32, Region::B_PREV_VAR});
    t.tensors.push_back({"batch_mean", ch, DType::F32, Region::B_NEXT_MEAN});
    t.tensors.push_back({"batch_var", ch, DType::F32, Region::B_NEXT_VAR});
    t.tensors.push_back({"invstd", ch, DType::F32, Region::T_TEMP_FP32});
    return t;
  };
  d.build_forward = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags& f) {
    return std::vector<Node>{layer_node(OpKind::BN_FWD_TRAIN, l,
                                        {ids.x, ids.param("gamma").master, ids.param("beta").master, ids.hyper},
                                        {ids.y, ids.tensor("batch_mean"), ids.tensor("batch_var"), ids.tensor("invstd")})};
  };
  d.build_inference = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags& f) {
    return std::vector<Node>{layer_node(OpKind::BN_FWD_INFER, l,
                                        {ids.x, ids.param("gamma").read(false, f.ema_weights),
                                         ids.param("beta").read(false, f.ema_weights), ids.tensor("running_mean"),
                                         ids.tensor("running_var"), ids.hyper},
                                        {ids.y})};
  };
  d.build_backward = [](const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx, bool acc, const BuildFlags&) {
    // β (input 5) is not needed by the BN backward itself: a fused BN → ReLU backward recomputes the ReLU mask from x.
    Node n = layer_node(OpKind::BN_BWD, l,
                        {ids.x, dy, ids.param("gamma").master, ids.tensor("batch_mean"), ids.tensor("invstd"),
                         ids.param("beta").master},
                        {dx, ids.param("gamma").grad, ids.param("beta").grad});
    n.accumulate = acc;
    return std::vector<Node>{n};
  };
  return d;
}
}  // namespace

void register_bn_layers(LayerRegistry& r) {
  r.add(bn_descriptor(LayerKind::Bn2d));
  r.add(bn_descriptor(LayerKind::Bn1d));
}

}  // namespace renaissance::plan
