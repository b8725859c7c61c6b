// Trainer: the training loop (DESIGN §8). It reads like the algorithm: data → forward → backward/reduce →
// update → log; schedules, validation and metrics are small pieces called from it.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/schedule.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::io {
class DatasetFile;
}

namespace renaissance::runtime {

struct TrainOptions {
  std::string data_path;
  Backend backend = Backend::CPU;
  std::int64_t workspace_mib = 256;  ///< GPU: the one cuDNN/cuBLASLt workspace, allocated at start-up
  std::int64_t epochs = 3;
  std::int64_t batch = 128;
  std::int64_t val_batch = 0;  ///< 0: the training batch
  plan::OptimizerKind optimizer = plan::OptimizerKind::NESTEROV;
  double lr = 0.1;
  double momentum = 0.9;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 5e-4;  ///< not applied to BN parameters and biases
  double lars_eta = 0.001;
  ScheduleKind schedule = ScheduleKind::ONE_CYCLE;
  double warmup_epochs = 0.0;
  std::int64_t step_epochs = 0;  ///< STEP: decay every this many epochs
  double step_gamma = 0.1;
  double label_smoothing = 0.1;
  bool ema = false;
  double ema_decay = 0.999;
  bool amp = false;
  bool fuse = true;  ///< with amp
  std::uint64_t seed = 0;
  std::int64_t max_steps = -1;  ///< stop after this many optimizer steps (-1: all epochs)
  Augmentation augmentation;
  bool shuffle = true;
  std::int64_t start_resolution = 0;  ///< progressive resize: the first `lowres_epochs` epochs at this size
  std::int64_t lowres_epochs = 0;
  double bn_momentum = 0.1, bn_eps = 1e-5;
  double loss_scale = 65536.0;  ///< AMP: initial dynamic loss scale
  std::int64_t loss_scale_interval = 2000;
  bool validate = true;
};

struct EpochMetrics {
  std::int64_t epoch = 0;        ///< 1-based
  std::int64_t step = 0;         ///< optimizer steps so far
  std::int64_t train_samples = 0;
  double train_loss = 0, train_top1 = 0;
  double val_loss = 0, val_top1 = 0, val_top5 = 0;
  double ema_val_top1 = -1;      ///< -1 without EMA
  double images_per_s = 0;       ///< training throughput of the epoch
  double seconds = 0;
  double lr = 0;                 ///< at the last step of the epoch
  double loss_scale = 0;
};

struct BenchResult {
  std::int64_t steps = 0, batch = 0;
  double ms_per_step = 0, images_per_s = 0;
  std::int64_t arena_bytes = 0;
  std::int64_t captures = 0;  ///< distinct captured subgraphs after deduplication
};

/// Progress reporting hook: called after every step (for the progress bar) and every epoch.
struct TrainObserver {
  std::function<void(std::int64_t epoch, std::int64_t batch, std::int64_t batches, double images_per_s)> on_step;
  std::function<void(const EpochMetrics&)> on_epoch;
};

class Trainer {
 public:
  Trainer(const blueprint::BluePrint& model, TrainOptions opts);
  ~Trainer();

  /// Trains for the configured epochs (or max_steps); returns one entry per epoch.
  std::vector<EpochMetrics> run(const TrainObserver& observer = {});
  /// Times `steps` training steps on one staged batch after `warmup` steps (graphs: captured replay; off: the
  /// same nodes launched one by one). Measures the step itself: no loader, no validation.
  BenchResult benchmark(std::int64_t warmup, std::int64_t steps, bool graphs = true);
  /// Scores the current weights on the validation split: {loss, top1, top5}. ema: on the EMA weights.
  EpochMetrics evaluate(bool ema = false);

  const plan::CompiledPlan& plan() const { return *m_plan; }
  std::int64_t steps() const { return m_step; }
  /// FP32 values of a named tensor (e.g. "conv1.w", "bn2d1.running_mean") in the arena.
  std::vector<float> tensor_values(const std::string& name) const;
  /// Every FP32 master weight, BN running statistic, in plan order (for bit-exact comparisons).
  std::vector<float> state_values() const;

  /// Masters (/params), BN running statistics (/bn) and EMA weights (/ema) as named tensors in HDF5.
  void save_weights(const std::string& path) const;
  /// Loads a weights file written for the same architecture; the first tensor that is missing or has
  /// another shape is an error naming it. EMA weights are loaded when both sides have them.
  void load_weights(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  std::unique_ptr<plan::CompiledPlan> m_plan;
  std::int64_t m_step = 0;
};

}  // namespace renaissance::runtime
