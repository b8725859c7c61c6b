// Weights files: Trainer::save_weights and Trainer::load_weights (docs/checkpoints.md).
#include <renaissance/runtime/trainer_impl.h>

namespace renaissance::runtime {

void Trainer::save_weights(const std::string& path) const {
  std::vector<io::NamedTensor> out;
  for (const DTensor& t : m_plan->plan(Variant::TRAIN_BASE).tensors()) {
    io::NamedTensor nt;
    if (!weights_group(t, &nt.group, &nt.name)) continue;
    nt.shape = t.shape;
    nt.values = tensor_values(t.name);
    out.push_back(std::move(nt));
  }
  io::WeightsMeta meta;
  meta.strings = {{"model", m_plan->arch.model_name},
                  {"arch_plan", m_plan->arch.to_yaml()},
                  {"plan_hash", fmt::format("{:016x}", m_plan->hash)}};
  meta.ints = {{"step", m_step}};
  // The dataset's normalisation and class names travel with the weights (predict and other frameworks need them);
  // its path as an absolute one (provenance).
  const io::DatasetFile& data = m_impl->data;
  if (!data.path().empty()) meta.strings["data"] = absolute_path(data.path());
  meta.mean = data.mean();
  meta.std = data.stddev();
  meta.class_names = data.class_names();
  io::write_weights(path, out, meta);
}

void Trainer::load_weights(const std::string& path) { load_weights(io::read_weights(path), path); }

void Trainer::load_weights(const io::WeightsFile& wf, const std::string& path) {
  if (m_impl->opt.ema) wf.require_ema(path);
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);
  for (const DTensor& t : mp.tensors()) {
    std::string group, name;
    if (!weights_group(t, &group, &name)) continue;
    const io::NamedTensor* src = wf.find(group, name);
    RN_CHECK_CTX(src != nullptr, path, "tensor /{}/{} of model '{}' is missing (a different architecture?)", group,
                 name, m_plan->arch.model_name);
    RN_CHECK_CTX(src->shape == t.shape, path, "tensor /{}/{} has shape {} but the model needs {}", group, name,
                 src->shape.str(), t.shape.str());
    m_impl->ctx.upload(t.id, src->values.data(), static_cast<std::int64_t>(src->values.size() * sizeof(float)));
  }
  if (m_impl->opt.amp) m_impl->replay(Variant::TRAIN_BASE, GraphId::CAST_W_TO_A);
}

}  // namespace renaissance::runtime
