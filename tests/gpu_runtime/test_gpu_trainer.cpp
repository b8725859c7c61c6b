// The CUDA backend end to end, against the CPU backend (the reference): a training step on the GPU equals the
// CPU step within tolerance (also with the own depthwise kernels forced on and off), graph replay equals node-by-node
// execution bit for bit, an overflow is skipped and halves the loss scale, and nothing is allocated on the device after
// start-up.
#include <renaissance/blueprint/zoo.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>
#include <kernels/cuda/runtime_api.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <utility>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-test)";
  }
};

std::string synthetic(std::int64_t n, std::int64_t hw, std::int64_t c) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_gpu_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / fmt::format("syn_{}_{}_{}.h5", n, hw, c)).string();
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n, 64, hw, hw, c, 10, 3);
  return p;
}

runtime::TrainOptions options(const std::string& data, runtime::Backend b) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.backend = b;
  o.batch = 32;
  o.epochs = 1;
  o.lr = 0.01;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.seed = 11;
  o.augmentation.horizontal_flip = false;
  o.shuffle = false;
  o.validate = false;
  return o;
}

bp::BluePrint residual_model() {
  bp::BluePrint m;
  m.name = "gpu_res";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::maxpool(3, 2, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 2), bp::block(64, 32, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double max_ref = 1e-12, max_diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return max_diff / max_ref;
}

TEST_F(Gpu, TrainingStepsMatchTheCpuFp32) {
  const std::string data = synthetic(96, 16, 3);
  auto o = options(data, runtime::Backend::CPU);
  o.max_steps = 2;
  runtime::Trainer cpu(residual_model(), o);
  o.backend = runtime::Backend::CUDA;
  runtime::Trainer gpu(residual_model(), o);
  ASSERT_EQ(cpu.state_values(), gpu.state_values());  // same initialisation on both backends
  cpu.run();
  gpu.run();
  const auto a = gpu.state_values(), b = cpu.state_values();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LE(max_rel_diff(a, b), 1e-4);
}

TEST_F(Gpu, TrainingStepsMatchTheCpuAmp) {
  const std::string data = synthetic(96, 16, 3);
  auto o = options(data, runtime::Backend::CPU);
  o.amp = true;
  o.max_steps = 2;
  runtime::Trainer cpu(residual_model(), o);
  o.backend = runtime::Backend::CUDA;
  runtime::Trainer gpu(residual_model(), o);
  cpu.run();
  gpu.run();
  EXPECT_LE(max_rel_diff(gpu.state_values(), cpu.state_values()), 1e-2);
}

/// MobileNetV2's pattern with strided depthwise convolutions (stride 2, FP16-vector and scalar channel counts).
bp::BluePrint depthwise_model() {
  bp::BluePrint m;
  m.name = "gpu_dw";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 24, bp::BlockKind::MBV2_INV_RESIDUAL, 2),
                   bp::block(60, 24, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(48, 32, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

/// The depthwise forward and data-gradient passes (profile labels such as "... dgrad 16x16x16>16 k3s2g16 [...]"):
/// how many there are, and how many run on the own kernels.
std::pair<int, int> depthwise_passes(const runtime::Trainer& t) {
  const std::regex depthwise(R"( (fwd|dgrad)(\+acc)? \d+x\d+x\d+>\d+ k\d+s\d+g\d+ )");
  int all = 0, own = 0;
  for (const std::string& d : t.conv_engines()) {
    if (!std::regex_search(d, depthwise)) continue;
    ++all;
    own += d.find("[own depthwise]") != std::string::npos;
  }
  return {all, own};
}

// The own depthwise kernels (kernels/cuda/depthwise.h) in training: forced onto every depthwise forward and data
// gradient, and off (cuDNN only), both against the CPU; deterministic, so two forced runs are bit-identical.
TEST_F(Gpu, OwnDepthwiseKernelsTrainLikeTheCpu) {
  const std::string data = synthetic(96, 16, 3);
  for (const bool amp : {false, true}) {
    SCOPED_TRACE(amp ? "amp" : "fp32");
    auto o = options(data, runtime::Backend::CPU);
    o.amp = amp;
    o.max_steps = 3;
    runtime::Trainer cpu(depthwise_model(), o);
    cpu.run();
    o.backend = runtime::Backend::CUDA;
    o.own_kernels = 2;
    runtime::Trainer own(depthwise_model(), o);
    runtime::Trainer own2(depthwise_model(), o);
    o.own_kernels = 0;
    runtime::Trainer cudnn(depthwise_model(), o);
    const auto [all, on_own] = depthwise_passes(own);
    EXPECT_GE(all, 6) << "3 depthwise layers × (forward, data gradient)";
    EXPECT_EQ(on_own, all);
    EXPECT_EQ(depthwise_passes(cudnn).second, 0);
    own.run();
    own2.run();
    cudnn.run();
    const double tol = amp ? 1e-2 : 1e-4;
    EXPECT_LE(max_rel_diff(own.state_values(), cpu.state_values()), tol);
    EXPECT_LE(max_rel_diff(cudnn.state_values(), cpu.state_values()), tol);
    const auto a = own.state_values(), b = own2.state_values();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "own kernels: not bit-identical";
  }
}

TEST_F(Gpu, EvaluationCountsEverySampleAndMatchesTheCpu) {
  const std::string data = synthetic(96, 16, 3);  // 64 validation samples
  auto o = options(data, runtime::Backend::CPU);
  o.val_batch = 24;  // 64 = 2·24 + 16: the last partial validation batch counts too
  o.max_steps = 2;
  runtime::Trainer cpu(residual_model(), o);
  o.backend = runtime::Backend::CUDA;
  runtime::Trainer gpu(residual_model(), o);
  cpu.run();
  gpu.run();
  const auto c = cpu.evaluate(), g = gpu.evaluate();
  EXPECT_NEAR(g.val_top1 * 64.0, std::round(g.val_top1 * 64.0), 1e-9);  // a whole number of samples out of 64
  EXPECT_NEAR(g.val_top1, c.val_top1, 1.0 / 64 + 1e-9);
  EXPECT_NEAR(g.val_loss, c.val_loss, 1e-3 * std::max(1.0, c.val_loss));
}

TEST_F(Gpu, GraphReplayEqualsUncapturedExecutionBitForBit) {
  const std::string data = synthetic(96, 16, 3);
  auto o = options(data, runtime::Backend::CUDA);
  o.amp = true;
  runtime::Trainer a(residual_model(), o);
  runtime::Trainer b(residual_model(), o);
  a.benchmark(0, 3, true);
  b.benchmark(0, 3, false);
  const auto wa = a.state_values(), wb = b.state_values();
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0);
}

TEST_F(Gpu, OverflowSkipsTheStepAndHalvesTheScale) {
  const std::string data = synthetic(96, 16, 3);
  auto o = options(data, runtime::Backend::CUDA);
  o.amp = true;
  o.loss_scale = 1e30;  // FP16 gradients overflow at once
  o.max_steps = 1;
  runtime::Trainer t(residual_model(), o);
  const auto before = t.tensor_values("cbr1.conv.w");
  const auto h = t.run();
  EXPECT_EQ(t.tensor_values("cbr1.conv.w"), before);  // the update was skipped
  ASSERT_EQ(h.size(), 1u);
  EXPECT_FLOAT_EQ(static_cast<float>(h[0].loss_scale), 5e29f);
}

TEST_F(Gpu, NoDeviceAllocationAfterStartUp) {
  const std::string data = synthetic(96, 16, 3);
  auto o = options(data, runtime::Backend::CUDA);
  o.amp = true;
  o.epochs = 2;
  o.validate = true;
  runtime::Trainer t(residual_model(), o);
  const std::int64_t before = cuda::device_alloc_count();
  t.run();
  EXPECT_EQ(cuda::device_alloc_count(), before);
}

}  // namespace
