#include <renaissance/core/error.h>
#include <renaissance/plan/compile_spec.h>

#include <algorithm>

namespace renaissance::plan {

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::SGD: return "sgd";
    case OptimizerKind::MOMENTUM: return "momentum";
    case OptimizerKind::NESTEROV: return "nesterov";
    case OptimizerKind::ADAM: return "adam";
    case OptimizerKind::ADAMW: return "adamw";
    case OptimizerKind::LARS: return "lars";
  }
  return "?";
}

OptimizerKind optimizer_from_name(const std::string& s) {
  for (auto k : {OptimizerKind::SGD, OptimizerKind::MOMENTUM, OptimizerKind::NESTEROV, OptimizerKind::ADAM,
                 OptimizerKind::ADAMW, OptimizerKind::LARS})
    if (s == optimizer_name(k)) return k;
  RN_FAIL("unknown optimizer '{}' (known: sgd, momentum, nesterov, adam, adamw, lars)", s);
}

bool optimizer_has_m(OptimizerKind k) { return k != OptimizerKind::SGD; }
bool optimizer_has_v(OptimizerKind k) { return k == OptimizerKind::ADAM || k == OptimizerKind::ADAMW; }
bool optimizer_has_n(OptimizerKind k) { return k == OptimizerKind::LARS; }

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::TRAIN_BASE: return "train_base";
    case Variant::TRAIN_LAST: return "train_last";
    case Variant::TRAIN_LOWRES: return "train_lowres";
    case Variant::TRAIN_LOWRES_LAST: return "train_lowres_last";
    case Variant::VAL_BASE: return "val_base";
    case Variant::VAL_LAST: return "val_last";
  }
  return "?";
}

std::vector<CompileSpec> derive_variant_specs(const TrainConfig& cfg, std::int64_t model_resolution,
                                              std::int64_t channels) {
  RN_CHECK(cfg.batch >= 1 && cfg.batch <= (std::int64_t(1) << 31), "--batch must be from 1 to 2^31, got {}",
           cfg.batch);
  RN_CHECK(cfg.dataset_size <= (std::int64_t(1) << 40) && cfg.val_size <= (std::int64_t(1) << 40) &&
               cfg.val_batch <= (std::int64_t(1) << 31),
           "training config: dataset sizes must be at most 2^40 and the validation batch at most 2^31");
  RN_CHECK(cfg.dataset_size >= 1, "training config: dataset size must be >= 1, got {}", cfg.dataset_size);
  RN_CHECK(cfg.val_size >= 1, "training config: validation size must be >= 1, got {}", cfg.val_size);
  RN_CHECK(cfg.val_batch >= 0, "training config: validation batch must be >= 0, got {}", cfg.val_batch);
  const std::int64_t end_res = cfg.end_resolution > 0 ? cfg.end_resolution : model_resolution;
  const std::int64_t start_res = cfg.start_resolution > 0 ? cfg.start_resolution : end_res;
  RN_CHECK(end_res >= 1 && start_res >= 1, "training config: resolutions must be >= 1");
  const std::int64_t max_res = std::max(start_res, end_res);
  const std::int64_t val_batch = cfg.val_batch > 0 ? cfg.val_batch : cfg.batch;
  // The last partial batch is trained, never dropped; when the split divides evenly it is a full batch.
  auto last = [](std::int64_t n, std::int64_t b) { return n % b == 0 ? b : n % b; };
  const std::int64_t train_batch = std::min(cfg.batch, cfg.dataset_size);
  const std::int64_t vb = std::min(val_batch, cfg.val_size);
  auto spec = [&](std::int64_t res, std::int64_t batch) {
    CompileSpec s;
    s.amp_enabled = cfg.amp;
    s.max_sample_resolution = max_res;
    s.actual_resolution = res;
    s.batch_size = batch;
    s.num_color_channels = channels;
    s.freeze_first_layer = cfg.freeze_first_layer;
    return s;
  };
  return {spec(end_res, train_batch),   spec(end_res, last(cfg.dataset_size, train_batch)),
          spec(start_res, train_batch), spec(start_res, last(cfg.dataset_size, train_batch)),
          spec(end_res, vb),            spec(end_res, last(cfg.val_size, vb))};
}

}  // namespace renaissance::plan
