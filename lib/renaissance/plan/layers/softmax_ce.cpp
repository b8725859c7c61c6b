// Softmax cross-entropy with label smoothing ε: loss = (1−ε)·CE(target) + ε·mean_c(−log p_c).
// Forward writes the probabilities (kept for backward) and the batch loss into the step result;
// backward writes dlogits = (p − q)·loss_scale / N. Its output is its input (the logits) for metrics.
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

void register_loss_layers(LayerRegistry& r) {
  LayerDescriptor d;
  d.kind = LayerKind::SoftmaxCE;
  d.pass_through = true;
  d.infer_tensors = [](const ArchLayer& l, const Shape& in, const Shape&, const InferContext&) {
    return LayerTensors{{}, {{"probs", Shape{in.n, 1, 1, l.fc().out}, DType::F32, Region::T_TEMP_FP32}}};
  };
  auto fwd = [](const ArchLayer& l, const LayerIds& ids, const BuildFlags&) {
    return std::vector<Node>{layer_node(OpKind::SOFTMAX_CE_FWD, l, {ids.x, ids.labels, ids.hyper},
                                        {ids.tensor("probs"), ids.result})};
  };
  d.build_forward = fwd;
  d.build_inference = fwd;
  d.build_backward = [](const ArchLayer& l, const LayerIds& ids, TensorId, TensorId dx, bool acc, const BuildFlags&) {
    Node n = layer_node(OpKind::SOFTMAX_CE_BWD, l, {ids.tensor("probs"), ids.labels, ids.hyper, ids.loss_scale}, {dx});
    n.accumulate = acc;
    return std::vector<Node>{n};
  };
  r.add(std::move(d));
}

}  // namespace renaissance::plan
