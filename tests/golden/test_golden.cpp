// Golden end-to-end tests against PyTorch (STYLE habit 7). scripts/golden_pytorch.py trained the PyTorch twin of each
// model on one fixed batch and wrote tests/golden/data/<case>/: the batch as a dataset, the initial weights, and
// golden.h5 with the eval-mode logits of the initial weights, every parameter gradient of step 1, the loss of 10
// SGD-with-momentum steps, the update of every weight, the BN running statistics and the eval-mode logits after
// them. Here the Trainer runs the same 10 steps from the same weights on the same batch and every tensor is compared
// with its own tolerance (tests/golden/README.md lists them and what was measured).
//
// Built twice: test_golden (CPU backend, in CI) and, with CUDA, test_golden_gpu (RN_GOLDEN_CUDA: the CUDA backend;
// skips without a device). The AMP goldens come from PyTorch on a GPU (CUDA autocast); without them those cases skip.
#include "golden_util.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/devices.h>
#include <renaissance/runtime/trainer.h>

#ifdef RN_GOLDEN_CUDA
#include <kernels/cuda/device_info.h>
#endif

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace renaissance;
using golden::close;
using golden::GoldenFile;
using golden::Measured;
using golden::to_double;
using golden::Tolerance;
namespace fs = std::filesystem;

#ifdef RN_GOLDEN_CUDA
constexpr runtime::Backend kBackend = runtime::Backend::CUDA;
constexpr const char* kBackendName = "cuda";
#else
constexpr runtime::Backend kBackend = runtime::Backend::CPU;
constexpr const char* kBackendName = "cpu";
#endif

struct GoldenCase {
  const char* dir;         ///< tests/golden/data/<dir>
  const char* zoo;         ///< zoo model, or nullptr
  const char* model_file;  ///< model YAML under the source tree, or nullptr
  bool amp;
  /// The GPU paths a user can pick, each replayed against the same goldens (the CPU ignores them): TrainOptions'
  /// conv_api (0 auto, 2 the legacy cuDNN API), fuse_kernels and concurrent_streams.
  int conv_api = 0;
  bool fuse_kernels = true;
  bool concurrent_streams = true;
  const char* name = nullptr;  ///< the test's name when it is not `dir`
  /// The CPU's Winograd convolutions (`--cpu-winograd`, on by default): off for the comparisons with PyTorch's FP32,
  /// which runs oneDNN's direct kernels. The step-1 gradients of tiny_resnet_fp32 are too ill-conditioned for any
  /// other rounding: a few pre-ReLU values lie within ~1e-7 of zero (relative to the largest; their sign is all the
  /// gradient sees) and the batch sums of the gradients cancel to ~1e-3, so one sign that flips moves a gradient by a
  /// few % of the largest. Measured (2026-12-05, a temporary hook adding uniform noise to every convolution output):
  /// noise of 1e-9 of the largest output moved them by 6.6e-2, as Winograd does (its forward error is ~5-9e-6 of a
  /// channel's spread, ~3x the direct kernels', tests/kernels_cpu Conv2dOnednn.*Winograd*). fmnist_cnn's goldens
  /// are not that sensitive and are replayed with Winograd on too (two of its three convolutions take it).
  bool cpu_winograd = false;
};

void PrintTo(const GoldenCase& c, std::ostream* os) {
  *os << (c.name ? c.name : c.dir);
}  // gtest: the case, not its bytes

const GoldenCase kCases[] = {
    {"fmnist_cnn_fp32", "fmnist_cnn", nullptr, false},
    {"tiny_resnet_fp32", nullptr, "models/tiny_resnet.yaml", false},
    {"fmnist_cnn_amp", "fmnist_cnn", nullptr, true},
    {"tiny_resnet_amp", nullptr, "models/tiny_resnet.yaml", true},
#ifndef RN_GOLDEN_CUDA
    {"fmnist_cnn_fp32", "fmnist_cnn", nullptr, false, 0, true, true, "fmnist_cnn_fp32_winograd", true},
    {"fmnist_cnn_amp", "fmnist_cnn", nullptr, true, 0, true, true, "fmnist_cnn_amp_winograd", true},
#else
    {"tiny_resnet_fp32", nullptr, "models/tiny_resnet.yaml", false, 2, true, true, "tiny_resnet_fp32_legacy_api"},
    {"tiny_resnet_fp32", nullptr, "models/tiny_resnet.yaml", false, 0, false, true, "tiny_resnet_fp32_unfused"},
    {"tiny_resnet_fp32", nullptr, "models/tiny_resnet.yaml", false, 0, true, false, "tiny_resnet_fp32_one_stream"},
    {"tiny_resnet_amp", nullptr, "models/tiny_resnet.yaml", true, 2, true, true, "tiny_resnet_amp_legacy_api"},
    {"tiny_resnet_amp", nullptr, "models/tiny_resnet.yaml", true, 0, false, true, "tiny_resnet_amp_unfused"},
#endif
};

/// Tolerances per dtype and backend (STYLE habit 6). FP32: both sides compute in FP32 and differ only in the order
/// of their sums (BN statistics, convolution and FC reductions). AMP: FP16 storage and compute, with other rounding
/// points than PyTorch's autocast. These are floors: what ten steps of training amplify (losses, updates, BN
/// statistics, the final logits) is compared with at least 3× the golden's spread, the distance between PyTorch's
/// run and its more precise twin (float64 for FP32, FP32 for AMP; scripts/golden_pytorch.py), since two
/// implementations of the same arithmetic drift apart about that far; AMP uses the spread for every quantity.
struct Tolerances {
  Tolerance logits, grad, loss, update, bn, logits_final;
};

Tolerances floors(bool amp) {
  // AMP: Renaissance's AMP plan on the CPU against PyTorch FP32 measured logits 1.3e-3, gradients 9.3e-2 (FP16
  // activations and gradients under the cancellations of BN's backward), losses 5e-4, updates 5.1e-2, BN statistics
  // 3.9e-2, final logits 2.4e-3 (tests/golden/README.md); against PyTorch AMP both sides carry such errors.
  if (amp) return {{1e-2, 0}, {2e-1, 0}, {0, 1e-2}, {1.5e-1, 0}, {1e-1, 0}, {3e-2, 0}};
#ifdef RN_GOLDEN_CUDA
  // cuDNN/cuBLASLt FP32 (no TF32: the CUDA build's default) against PyTorch on the CPU: other algorithms and orders
  // (not yet measured on the H200: tests/golden/README.md).
  return {{3e-5, 0}, {1e-4, 1e-3}, {0, 3e-5}, {1e-3, 0}, {3e-4, 0}, {3e-5, 0}};
#else
  return {{1e-5, 0}, {3e-5, 1e-4}, {0, 1e-5}, {3e-4, 0}, {1e-4, 0}, {1e-5, 0}};
#endif
}

constexpr double kSpreadFactor = 3.0;

/// The floors widened to kSpreadFactor × the golden's spreads where they apply.
Tolerances tolerances(const GoldenFile& g, bool amp) {
  Tolerances t = floors(amp);
  auto widen = [&](Tolerance& tol, const char* attr, bool relative) {
    double& v = relative ? tol.rel : tol.abs;
    v = std::max(v, kSpreadFactor * g.number(attr));
  };
  if (amp) {
    widen(t.logits, "spread_logits_init", false);
    widen(t.grad, "spread_grad", false);
  }
#ifdef RN_GOLDEN_CUDA
  // FP32 on the GPU: step 1's gradients to at least their measured sensitivity (golden_pytorch.py: noise of 1e-7 of
  // each convolution output's largest |value| moved tiny_resnet's by 6.3e-3 of the largest, fmnist_cnn's by 1.2e-2,
  // a max-pool tie going the other way). cuDNN's engines sum in other orders and tilings than the CPU's: measured on
  // an H100 (2026-12-05), the engines one timing chose put tiny_resnet_fp32's at 4.5e-3 with its logits within 1.6e-7.
  // Training then amplifies nothing the comparisons after ten steps would not see.
  if (!amp && g.has_attribute("sensitivity_grad")) t.grad.abs = std::max(t.grad.abs, g.number("sensitivity_grad"));
#endif
  widen(t.loss, "spread_losses", true);
  widen(t.update, "spread_update", false);
  widen(t.bn, "spread_bn", false);
  widen(t.logits_final, "spread_logits_final", false);
  return t;
}

fs::path data_dir() { return fs::path(RENAISSANCE_SOURCE_DIR) / "tests" / "golden" / "data"; }

blueprint::BluePrint model_of(const GoldenCase& c) {
  if (c.zoo) return blueprint::zoo_model(c.zoo);
  return blueprint::load_blueprint_file((fs::path(RENAISSANCE_SOURCE_DIR) / c.model_file).string());
}

/// Worst measured error of one kind of quantity over a case, for the summary line.
struct Worst {
  double rel_to_max = 0;
  std::string tensor;
  void add(const std::string& name, const Measured& m) {
    if (m.max_rel_to_max >= rel_to_max) {
      rel_to_max = m.max_rel_to_max;
      tensor = name;
    }
  }
};

/// What a replay found: every comparison that failed (its message names the tensor) and one summary line.
struct Replay {
  std::vector<std::string> failures;
  std::string summary;
};

/// Trains like the PyTorch run that wrote `dir` (lr × lr_factor: the negative control) and compares.
Replay replay(const GoldenCase& c, const fs::path& dir, double lr_factor = 1.0) {
  Replay out;
  auto check = [&](const ::testing::AssertionResult& r) {
    if (!r) out.failures.push_back(r.message());
  };
  const GoldenFile g((dir / "golden.h5").string());
  const Tolerances tol = tolerances(g, c.amp);
  RN_CHECK_CTX(g.text("dtype") == (c.amp ? "amp" : "fp32"), g.path(), "dtype '{}'", g.text("dtype"));
  const auto steps = static_cast<std::int64_t>(g.number("steps"));
  const auto batch = static_cast<std::int64_t>(g.number("batch"));

  // The PyTorch run's settings (scripts/golden_pytorch.py), every one that matters set explicitly.
  runtime::TrainOptions o;
  o.data_path = (dir / "data.h5").string();
  o.backend = kBackend;
  o.epochs = steps;  // one batch per epoch: `steps` optimizer steps on the same batch
  o.batch = batch;
  o.optimizer = plan::OptimizerKind::MOMENTUM;  // PyTorch SGD(momentum): v = mu·v + g; w -= lr·v
  o.lr = g.number("lr") * lr_factor;
  o.momentum = g.number("momentum");
  o.weight_decay = 0;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.warmup_epochs = 0;
  o.label_smoothing = 0;
  o.augmentation = {};
  o.shuffle = false;
  o.bn_momentum = g.number("bn_momentum");
  o.bn_eps = g.number("bn_eps");
  o.amp = c.amp;
  o.loss_scale = c.amp ? g.number("loss_scale") : o.loss_scale;
  o.ema = false;
  o.validate = false;  // logits() runs the inference graph itself
  o.conv_api = c.conv_api;
  o.fuse_kernels = c.fuse_kernels;
  o.concurrent_streams = c.concurrent_streams;
#ifdef RN_GOLDEN_CUDA
  // The convolution engines are chosen by timing: a failure lists the ones this run chose (the engine cache's text).
  static int replays = 0;
  const fs::path engines = fs::temp_directory_path() / fmt::format("golden-engines-{}-{}.txt", ::getpid(), replays++);
  fs::remove(engines);
  o.engine_cache = engines.string();
#endif
  runtime::Trainer t(model_of(c), o);
  // The goldens name tensors after an ArchPlan: a plan that changed since they were made would compare other
  // tensors, or none.
  if (t.plan().arch.to_yaml() != g.text("arch_plan")) {
    out.failures.push_back(
        "the ArchPlan differs from the one the goldens were made for: regenerate them "
        "(tests/golden/README.md)");
    return out;
  }
  t.load_weights((dir / "init.h5").string());
  const io::WeightsFile init = io::read_weights((dir / "init.h5").string());

  // 1. Eval-mode logits of the initial weights (the inference graph, running statistics 0 and 1).
  Measured m_logits0, m_logits1, m_loss;
  check(close("logits of the initial weights", to_double(t.logits(io::Split::val, 0, batch)), g.values("logits/init"),
              tol.logits, &m_logits0));

  // 2. Train `steps` steps; after step 1 every parameter gradient, after each step its loss.
  const std::vector<std::string> grad_names = g.names("grad");
  std::map<std::string, std::vector<float>> grads;
  std::vector<double> losses;
  runtime::TrainObserver obs;
  obs.on_step_loss = [&](std::int64_t step, std::int64_t, double loss) {
    losses.push_back(loss);
    if (step == 1)
      for (const std::string& n : grad_names) grads[n] = t.tensor_values(n + ".grad");
  };
  t.run(obs);
  RN_CHECK(t.steps() == steps && !grad_names.empty(), "{} steps trained, {} gradients", t.steps(), grad_names.size());

  Worst w_grad, w_update, w_bn;
  for (const std::string& n : grad_names) {
    Measured m;
    check(close(fmt::format("gradient of {} after step 1", n), to_double(grads.at(n)), g.values("grad/" + n), tol.grad,
                &m));
    w_grad.add(n, m);
  }
  const std::vector<double> ref_losses = g.values("losses");
  check(close("per-step losses", losses, ref_losses, tol.loss, &m_loss));
  double loss_rel = 0;
  for (std::size_t i = 0; i < losses.size() && i < ref_losses.size(); ++i)
    loss_rel = std::max(loss_rel, std::abs(losses[i] - ref_losses[i]) / std::abs(ref_losses[i]));

  // 3. After the last step: the update of every weight (final − initial, where training differences show; the
  //    weights themselves would hide them under their initial values) and the BN running statistics.
  for (const std::string& n : g.names("update")) {
    const io::NamedTensor* w0 = init.find("params", n);
    RN_CHECK_CTX(w0 != nullptr, (dir / "init.h5").string(), "no /params/{}", n);
    const std::vector<float> got = t.tensor_values(n);
    RN_CHECK(got.size() == w0->values.size(), "{}: {} values, init.h5 has {}", n, got.size(), w0->values.size());
    std::vector<double> update(got.size());
    for (std::size_t i = 0; i < got.size(); ++i) update[i] = static_cast<double>(got[i]) - w0->values[i];
    Measured m;
    check(close(fmt::format("update of {} after {} steps", n, steps), update, g.values("update/" + n), tol.update, &m));
    w_update.add(n, m);
  }
  for (const std::string& n : g.names("final/bn")) {
    Measured m;
    check(close(fmt::format("{} after {} steps", n, steps), to_double(t.tensor_values(n)), g.values("final/bn/" + n),
                tol.bn, &m));
    w_bn.add(n, m);
  }

  // 4. Eval-mode logits after training: the weights and the running statistics together.
  check(close(fmt::format("logits after {} steps", steps), to_double(t.logits(io::Split::val, 0, batch)),
              g.values("logits/final"), tol.logits_final, &m_logits1));

  out.summary = fmt::format(
      "golden {} on {} (PyTorch {}, {}): max |diff|/max|ref| (tolerance): logits {:.2g} ({:.2g}), after training "
      "{:.2g} ({:.2g}); gradients {:.2g} ({}; {:.2g} + {:.2g}·|ref|); losses {:.2g} relative ({:.2g}); updates {:.2g} "
      "({}; {:.2g}); BN statistics {:.2g} ({}; {:.2g})",
      c.name ? c.name : c.dir, kBackendName, g.text("torch_version"), g.text("device"), m_logits0.max_rel_to_max,
      tol.logits.abs, m_logits1.max_rel_to_max, tol.logits_final.abs, w_grad.rel_to_max, w_grad.tensor, tol.grad.abs,
      tol.grad.rel, loss_rel, tol.loss.rel, w_update.rel_to_max, w_update.tensor, tol.update.abs, w_bn.rel_to_max,
      w_bn.tensor, tol.bn.abs);
#ifdef RN_GOLDEN_CUDA
  if (!out.failures.empty()) {
    std::ifstream in(engines);
    std::ostringstream text;
    text << in.rdbuf();
    out.failures.push_back("the convolution engines of this run (" + engines.string() + "):\n" + text.str());
  } else {
    fs::remove(engines);
  }
#endif
  return out;
}

bool skip_reason(const GoldenCase& c, std::string* why) {
#ifdef RN_GOLDEN_CUDA
  if (cuda::device_count() == 0) {
    *why = "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-test)";
    return true;
  }
#endif
  if (!c.amp || fs::exists(data_dir() / c.dir / "golden.h5")) return false;
  *why =
      "no AMP goldens yet: PyTorch writes them on a GPU, see tests/golden/README.md (python3 "
      "scripts/golden_pytorch.py --out tests/golden/data --device cuda --amp)";
  return true;
}

/// The case's --cpu-winograd for the scope (CPU plans are made with the setting of their time), then the old one.
struct WinogradFor {
  bool before = runtime::cpu_winograd();
  explicit WinogradFor(const GoldenCase& c) { runtime::set_cpu_winograd(c.cpu_winograd); }
  ~WinogradFor() { runtime::set_cpu_winograd(before); }
  WinogradFor(const WinogradFor&) = delete;
  WinogradFor& operator=(const WinogradFor&) = delete;
};

class Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Golden, LogitsGradientsLossesAndWeightsMatchPyTorch) {
  std::string why;
  if (skip_reason(GetParam(), &why)) GTEST_SKIP() << why;
  const WinogradFor winograd(GetParam());
  if (GetParam().cpu_winograd && !runtime::cpu_winograd())
    GTEST_SKIP() << "no Winograd kernels here (oneDNN on an AVX-512 CPU)";
  const Replay r = replay(GetParam(), data_dir() / GetParam().dir);
  for (const std::string& f : r.failures) ADD_FAILURE() << f;
  std::printf("%s\n", r.summary.c_str());
}

// The negative control: the same replay with the learning rate off by 0.1 % must not pass (the per-step losses and
// the final logits tell; measured with the FP32 goldens: also momentum 0.89 for 0.9, BN momentum 0.11, BN eps 2e-5
// and label smoothing 0.001 each fail). Guards against comparisons that became vacuous (a widened tolerance, an
// empty golden group).
TEST(GoldenControl, ALearningRateOffByAThousandthIsDetected) {
  const GoldenCase& c = kCases[0];
  std::string why;
  if (skip_reason(c, &why)) GTEST_SKIP() << why;
  const WinogradFor winograd(c);
  const Replay r = replay(c, data_dir() / c.dir, 1.001);
  ASSERT_FALSE(r.failures.empty()) << "lr x 1.001 passed: " << r.summary;
  bool losses = false;
  for (const std::string& f : r.failures) losses = losses || f.rfind("per-step losses", 0) == 0;
  EXPECT_TRUE(losses) << r.failures.front();
  std::printf("negative control: lr x 1.001 fails %zu comparisons, e.g. %s\n", r.failures.size(),
              r.failures.front().substr(0, 200).c_str());
}

// The comparison itself: the bound is abs·max|ref| + rel·|ref| per element, NaN or inf on either side fails.
TEST(GoldenCompare, BoundIsPerElementAndNaNNeverPasses) {
  const std::vector<double> ref = {1.0, -2.0, 0.5};
  EXPECT_TRUE(close("t", {1.0, -2.0 + 1.9e-3, 0.5}, ref, {1e-3, 0}));  // 1.9e-3 ≤ 1e-3 · 2
  EXPECT_FALSE(close("t", {1.0, -2.0 + 2.1e-3, 0.5}, ref, {1e-3, 0}));
  EXPECT_TRUE(close("t", {1.0, -2.0, 0.5 + 4e-4}, ref, {0, 1e-3}));  // 4e-4 ≤ 1e-3 · 0.5
  EXPECT_FALSE(close("t", {1.0, -2.0, 0.5 + 6e-4}, ref, {0, 1e-3}));
  EXPECT_FALSE(close("t", {1.0, std::nan(""), 0.5}, ref, {1, 1}));
  EXPECT_FALSE(close("t", {1.0, -2.0, 0.5}, {1.0, std::nan(""), 0.5}, {1, 1}));
  EXPECT_FALSE(close("t", {1.0, HUGE_VAL, 0.5}, ref, {1, 1}));
  EXPECT_FALSE(close("t", {1.0, -2.0}, ref, {1, 1}));  // sizes differ
  const ::testing::AssertionResult r = close("conv1.w", {1.0, -2.0 + 2.1e-3, 0.5}, ref, {1e-3, 0});
  EXPECT_NE(std::string(r.message()).find("conv1.w: element 1"), std::string::npos) << r.message();
}

INSTANTIATE_TEST_SUITE_P(Cases, Golden, ::testing::ValuesIn(kCases), [](const ::testing::TestParamInfo<GoldenCase>& i) {
  return std::string(i.param.name ? i.param.name : i.param.dir);
});

}  // namespace
