#include <renaissance/core/error.h>
#include <renaissance/plan/layer_descriptor.h>

namespace renaissance::plan {

TensorId ParamIds::read(bool amp, bool ema_weights) const {
  if (ema_weights) return (amp && ema16 != kNoTensor) ? ema16 : ema;
  return (amp && compute != kNoTensor) ? compute : master;
}

TensorId ParamIds::grad_target(bool amp) const { return (amp && grad16 != kNoTensor) ? grad16 : grad; }

TensorId LayerIds::tensor(const std::string& name) const {
  auto it = t.find(name);
  RN_CHECK(it != t.end(), "layer has no tensor '{}'", name);
  return it->second;
}

const ParamIds& LayerIds::param(const std::string& name) const {
  auto it = p.find(name);
  RN_CHECK(it != p.end(), "layer has no parameter '{}'", name);
  return it->second;
}

const LayerRegistry& LayerRegistry::instance() {
  static const LayerRegistry registry = [] {
    LayerRegistry r;
    register_conv_layers(r);
    register_bn_layers(r);
    register_elementwise_layers(r);
    register_pool_layers(r);
    register_fc_layers(r);
    register_loss_layers(r);
    register_fused_layers(r);
    for (LayerKind k : all_layer_kinds())
      if (k != LayerKind::Bn)  // transient: renamed to Bn1d/Bn2d before any plan exists
        RN_CHECK(r.has(k), "layer kind {} has no descriptor in the registry", layer_kind_name(k));
    return r;
  }();
  return registry;
}

void LayerRegistry::add(LayerDescriptor d) {
  RN_CHECK(!m_entries.count(d.kind), "layer kind {} registered twice", layer_kind_name(d.kind));
  m_entries.emplace(d.kind, std::move(d));
}

const LayerDescriptor& LayerRegistry::get(LayerKind k) const {
  auto it = m_entries.find(k);
  if (it == m_entries.end()) {
    std::string known;
    for (const auto& [kind, d] : m_entries) known += (known.empty() ? "" : ", ") + std::string(layer_kind_name(kind));
    RN_FAIL("no descriptor for layer kind {} (registered: {})", layer_kind_name(k), known);
  }
  return it->second;
}

std::vector<LayerKind> LayerRegistry::kinds() const {
  std::vector<LayerKind> v;
  for (const auto& [k, d] : m_entries) v.push_back(k);
  return v;
}

TensorDesc output_feature(const Shape& out, const InferContext& ctx) {
  return {"y", out, ctx.act, ctx.act == DType::F16 ? Region::F_FEATURE_FP16 : Region::F_FEATURE_FP32};
}

Node layer_node(OpKind op, const ArchLayer& l, std::vector<TensorId> in, std::vector<TensorId> out) {
  Node n = compute_node(op, std::move(in), std::move(out), l.params);
  n.layer_kind = l.kind;
  return n;
}

std::vector<ArchLayer> lower_layer(const ArchLayer& l) {
  const LayerDescriptor& d = LayerRegistry::instance().get(l.kind);
  if (!d.decompose) return {l};
  std::vector<ArchLayer> out;
  for (const ArchLayer& part : d.decompose(l))
    for (ArchLayer& p : lower_layer(part)) out.push_back(std::move(p));
  return out;
}

}  // namespace renaissance::plan
