// Models shared by the GPU runtime tests.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/runtime/trainer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
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
  // RN_TEST_DATA_CACHE=off: the host loader instead of the device cache (race hunting: is the gather beside the step
  // what differs?)
  if (const char* c = std::getenv("RN_TEST_DATA_CACHE"); c != nullptr && std::string(c) == "off")
    o.data_cache = runtime::DataCacheMode::off;
  return o;
}

/// What two trainings that should be one run repeated are compared by when their losses differ (the intermittent
/// AMP failures of 2026-12-03 and 2026-12-04, docs/benchmarks.md): the engine of every convolution pass; the master
/// weights and their FP16 compute copies before the first step; the input slot A and its labels as the first step's
/// loss was read (the same batch in both runs: their schedules are the same).
struct RunFingerprint {
  std::vector<std::string> engines;
  std::vector<float> initial_weights;  // families W and A, in plan order
  std::vector<float> first_input;
  std::vector<std::uint8_t> first_labels;
};
/// Before run(): the weights the first step will read.
inline void fingerprint_start(const runtime::Trainer& t, RunFingerprint* f) {
  for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors()) {
    const RegionFamily fam = region_family(d.region);
    if (fam != RegionFamily::W && fam != RegionFamily::A) continue;
    const std::vector<float> v = t.tensor_values(d.name);
    f->initial_weights.insert(f->initial_weights.end(), v.begin(), v.end());
  }
}
/// In the first on_step_loss: the batch the first step read.
inline void fingerprint_first_step(const runtime::Trainer& t, RunFingerprint* f) {
  const plan::CompiledPlan& p = t.plan();
  const plan::MemoryPlan& mp = p.plan(plan::Variant::TRAIN_BASE);
  f->first_input = t.tensor_values(mp.tensor(p.baseline.data_a).name);
  f->first_labels = t.tensor_bytes(mp.tensor(p.baseline.labels_a).name);
}
template <typename T>
std::size_t count_differing(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t n = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n;
}
/// Prints which of the two fingerprints' parts differ: a differing engine names a cached choice not replayed
/// exactly, a differing weight the initialisation, a differing input or label the data path; none, a difference
/// inside the step (a race or a reduction).
inline void print_divergence(const RunFingerprint& a, const RunFingerprint& b, const char* what) {
  std::size_t engines = 0;
  for (std::size_t i = 0; i < std::max(a.engines.size(), b.engines.size()); ++i) {
    const std::string ea = i < a.engines.size() ? a.engines[i] : "-", eb = i < b.engines.size() ? b.engines[i] : "-";
    if (ea == eb) continue;
    if (engines++ < 5) std::printf("[ diverge ] %s: engine %zu: %s | %s\n", what, i, ea.c_str(), eb.c_str());
  }
  std::printf(
      "[ diverge ] %s: %zu of %zu engine labels differ; %zu of %zu initial weight values; %zu of %zu input values; "
      "%zu of %zu label bytes\n",
      what, engines, a.engines.size(), count_differing(a.initial_weights, b.initial_weights), a.initial_weights.size(),
      count_differing(a.first_input, b.first_input), a.first_input.size(),
      count_differing(a.first_labels, b.first_labels), a.first_labels.size());
}

/// RN_TEST_NODE_HASHES=1 in a test's environment: each training of a determinism test hashes every node's inputs and
/// outputs in its first two steps (RN_DEBUG_NODE_HASHES, docs/kernels-cuda.md) into its own file, and a test whose
/// trainings differ prints where they part. The variable is set while the trainer is made (the session reads it).
struct NodeHashFile {
  std::string path;
  explicit NodeHashFile(std::string p) : path(std::getenv("RN_TEST_NODE_HASHES") ? std::move(p) : std::string()) {
    if (!path.empty()) ::setenv("RN_DEBUG_NODE_HASHES", path.c_str(), 1);
  }
  void release() {
    if (!path.empty()) ::unsetenv("RN_DEBUG_NODE_HASHES");
  }
  ~NodeHashFile() { release(); }
};

/// The first slots whose hashes differ between two RN_DEBUG_NODE_HASHES files: a node whose inputs agree and whose
/// outputs differ computed differently from the same bytes; an input that differs although the node that wrote it
/// gave the same output was changed in between (a race).
/// Returns the layer of the first slot that differs ("" for none).
inline std::string print_hash_divergence(const std::string& a, const std::string& b, const char* what) {
  std::string layer;
  if (a.empty() || b.empty()) return layer;
  std::ifstream fa(a), fb(b);
  std::string la, lb;
  int shown = 0, differing = 0, lines = 0;
  while (std::getline(fa, la) && std::getline(fb, lb)) {
    ++lines;
    if (la == lb) continue;
    if (layer.empty()) {  // "step 1<TAB>slot 32<TAB>hash<TAB>graph #1 OP layer out0 NB"
      std::istringstream words(la.substr(la.rfind('\t') + 1));
      std::string graph, index, op;
      words >> graph >> index >> op >> layer;
    }
    if (shown++ < 12) std::printf("[ hashes  ] %s:\n  a: %s\n  b: %s\n", what, la.c_str(), lb.c_str());
    ++differing;
  }
  std::printf("[ hashes  ] %s: %d of %d hashed tensors differ (%s, %s)\n", what, differing, lines, a.c_str(),
              b.c_str());
  return layer;
}

}  // namespace renaissance::test
