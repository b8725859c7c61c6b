// Weights files: Trainer::save_weights and Trainer::load_weights (docs/checkpoints.md).
#include <renaissance/runtime/trainer_impl.h>

namespace renaissance::runtime {

std::vector<io::NamedTensor> Trainer::weight_tensors() const {
  std::vector<io::NamedTensor> out;
  for (const DTensor& t : m_plan->plan(Variant::TRAIN_BASE).tensors()) {
    io::NamedTensor nt;
    if (!weights_group(t, &nt.group, &nt.name)) continue;
    nt.shape = t.shape;
    nt.values = tensor_values(t.name);
    out.push_back(std::move(nt));
  }
  return out;
}

void Trainer::save_weights(const std::string& path) const {
  if (m_impl->opt.amp) require_loss_scale_left(m_impl->read_loss_scale(), m_step);
  const std::vector<io::NamedTensor> out = weight_tensors();
  require_not_diverged(out, m_step);
  io::WeightsMeta meta;
  meta.strings = {{"model", m_plan->arch.model_name},
                  {"arch_plan", m_plan->arch.to_yaml()},
                  {"plan_hash", fmt::format("{:016x}", m_plan->hash)}};
  // The validation transform's short side (--val-resize; 0: size/0.875): eval and predict score as the run did.
  meta.ints = {{"step", m_step}, {"val_resize", m_impl->opt.augmentation.val_resize}};
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
  // The tensors are matched as a checkpoint's are (docs/checkpoints.md), by name, with the first conv's channels
  // padded or cut across AMP settings: weights written by an AMP run failed in an FP32 eval (and an FP32 run's in an
  // AMP eval) on the first conv's shape. Not by position: a weights file lists its tensors by name, not plan order.
  // load_state also refuses --ema for a file without /ema.
  (void)load_state(InitialState::of_weights(wf, path));
}

}  // namespace renaissance::runtime
