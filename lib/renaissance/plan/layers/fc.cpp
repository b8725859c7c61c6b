// Fully connected: y = x·Wᵀ + b, W [out][in] stored as (out,1,1,in).
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

void register_fc_layers(LayerRegistry& r) {
  LayerDescriptor d;
  d.kind = LayerKind::Fc;
  d.infer_tensors = [](const ArchLayer& l, const Shape& in, const Shape& out, const InferContext& ctx) {
    LayerTensors t;
    t.params.push_back({"w", Shape{l.fc().out, 1, 1, in.h * in.w * in.c}, ParamKind::FC_WEIGHT});
    t.params.push_back({"b", Shape{1, 1, 1, l.fc().out}, ParamKind::FC_BIAS});
    t.tensors.push_back(output_feature(out, ctx));
    return t;
  };
  auto fwd = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags& f) {
    return std::vector<Node>{layer_node(
        OpKind::FC_FWD, l, {ids.x, ids.param("w").read(f.amp, f.ema_weights), ids.param("b").read(f.amp, f.ema_weights)},
        {ids.y})};
  };
  d.build_forward = fwd;
  d.build_inference = fwd;
  d.build_backward = [](const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx, bool acc,
                        const BuildFlags& f) {
    std::vector<Node> v;
    Node wgrad = layer_node(OpKind::FC_BWD_WEIGHT, l, {ids.x, dy},
                            {ids.param("w").grad_target(f.amp), ids.param("b").grad});
    wgrad.accumulate = true;
    v.push_back(wgrad);
    if (dx != kNoTensor) {
      Node dgrad = layer_node(OpKind::FC_BWD_DATA, l, {dy, ids.param("w").read(f.amp, false)}, {dx});
      dgrad.accumulate = acc;
      v.push_back(dgrad);
    }
    return v;
  };
  r.add(std::move(d));
}

}  // namespace renaissance::plan
