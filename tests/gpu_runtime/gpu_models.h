// Models shared by the GPU runtime tests.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/runtime/trainer.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace renaissance::test {

/// A residual network at a realistic size for the determinism and exact-resume tests: 32×32×3 input and every fused
/// kind of an AMP plan (CBR, BasicBlock identity/projection, Bottleneck identity/projection, InvResidual
/// identity/no-shortcut, GapFC), a max-pool, a 7×7 stride-2 stem-like first conv and stride-2 convolutions.
inline blueprint::BluePrint realistic_residual_model() {
  namespace bp = renaissance::blueprint;
  bp::BluePrint m;
  m.name = "realistic_residual";
  m.in_h = m.in_w = 32;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(32, 7, 1, 3), bp::maxpool(3, 1, 1), bp::block(32, 32, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(32, 64, bp::BlockKind::RESNET_3_3, 2), bp::block(32, 64, bp::BlockKind::RESNET_1_3_1, 1),
                   bp::block(64, 128, bp::BlockKind::RESNET_1_3_1, 2),
                   bp::block(256, 128, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(256, 96, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

/// The run the determinism tests and tests/gpu_runtime/gpu_race_probe repeat: the residual model above on a
/// synthetic 32×32 store, 2 epochs at batch 128, Nesterov, pad-crop 2, side streams on.
inline runtime::TrainOptions residual_run_options(const std::string& data, bool amp) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.backend = runtime::Backend::CUDA;
  o.amp = amp;
  o.batch = 128;
  o.epochs = 2;
  o.lr = 0.05;
  o.optimizer = plan::OptimizerKind::NESTEROV;
  o.seed = 23;
  o.augmentation.crop_padding = 2;
  o.concurrent_streams = true;
  return o;
}

/// What two trainings that should be one run repeated are compared by when their losses differ (the intermittent
/// failures of 2026-12-03, docs/benchmarks.md): the engine of every convolution pass, and the input slot A as the
/// first step's loss was read (the same batch in both runs: their schedules are the same).
struct RunFingerprint {
  std::vector<std::string> engines;
  std::vector<float> first_input;
};
inline std::string input_tensor_name(const runtime::Trainer& t) {
  const plan::CompiledPlan& p = t.plan();
  return p.plan(plan::Variant::TRAIN_BASE).tensor(p.baseline.data_a).name;
}
/// Prints which of the two fingerprints' parts differ: a differing engine names a cached choice not replayed
/// exactly, a differing input the data path; neither, a difference inside the step (a race or a reduction).
inline void print_divergence(const RunFingerprint& a, const RunFingerprint& b, const char* what) {
  std::size_t engines = 0;
  for (std::size_t i = 0; i < std::max(a.engines.size(), b.engines.size()); ++i) {
    const std::string ea = i < a.engines.size() ? a.engines[i] : "-", eb = i < b.engines.size() ? b.engines[i] : "-";
    if (ea == eb) continue;
    if (engines++ < 5) std::printf("[ diverge ] %s: engine %zu: %s | %s\n", what, i, ea.c_str(), eb.c_str());
  }
  std::size_t inputs = 0;
  for (std::size_t i = 0; i < std::min(a.first_input.size(), b.first_input.size()); ++i)
    inputs += a.first_input[i] != b.first_input[i];
  std::printf("[ diverge ] %s: %zu of %zu engine labels differ; %zu of %zu input values differ%s\n", what, engines,
              a.engines.size(), inputs, a.first_input.size(),
              a.first_input.size() == b.first_input.size() ? "" : " (sizes differ)");
}

}  // namespace renaissance::test
