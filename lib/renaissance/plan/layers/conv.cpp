// Conv: y = conv(x, w) (+ b). Weight OHWI [out][k][k][in/groups]; the first layer's weight lives in *_FIRST_CONV.
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

namespace {
Shape weight_shape(const ArchLayer& l, const Shape& in) {
  const ConvParams& p = l.conv();
  return Shape{p.out_c, p.k, p.k, in.c / p.groups};
}
}  // namespace

void register_conv_layers(LayerRegistry& r) {
  LayerDescriptor d;
  d.kind = LayerKind::Conv;
  d.infer_tensors = [](const ArchLayer& l, const Shape& in, const Shape& out, const InferContext& ctx) {
    LayerTensors t;
    t.params.push_back({"w", weight_shape(l, in), ctx.first_layer ? ParamKind::FIRST_CONV : ParamKind::DEEP_CONV});
    if (l.conv().bias) t.params.push_back({"b", Shape{1, 1, 1, out.c}, ParamKind::FC_BIAS});
    t.tensors.push_back(output_feature(out, ctx));
    return t;
  };
  auto fwd = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags& f) {
    std::vector<TensorId> in{ids.x, ids.param("w").read(f.amp, f.ema_weights)};
    if (ids.has_param("b")) in.push_back(ids.param("b").read(f.amp, f.ema_weights));
    return std::vector<Node>{layer_node(OpKind::CONV_FWD, l, in, {ids.y})};
  };
  d.build_forward = fwd;
  d.build_inference = fwd;
  d.build_backward = [](const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx, bool acc,
                        const BuildFlags& f) {
    std::vector<Node> v;
    std::vector<TensorId> grads{ids.param("w").grad_target(f.amp)};
    if (ids.has_param("b")) grads.push_back(ids.param("b").grad);
    // The weight gradient overwrites: each weight belongs to one layer, so nothing else adds to it (ZERO_GRAD still
    // clears the region for the layers a step does not reach). An overwriting pass is what cuDNN's graph API runs
    // without an add epilogue.
    Node wgrad = layer_node(OpKind::CONV_BWD_FILTER, l, {ids.x, dy}, grads);
    v.push_back(wgrad);
    if (dx != kNoTensor) {
      Node dgrad = layer_node(OpKind::CONV_BWD_DATA, l, {dy, ids.param("w").read(f.amp, false)}, {dx});
      dgrad.accumulate = acc;
      v.push_back(dgrad);
    }
    return v;
  };
  r.add(std::move(d));
}

}  // namespace renaissance::plan
