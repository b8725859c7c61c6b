// `renaissance bench --profile` on the CUDA backend: the profiled (un-captured, event-timed) steps train exactly like
// captured ones, every plain node of the step is timed, and the timer is off again afterwards.
#include <renaissance/blueprint/zoo.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/profiler.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;
using plan::GraphId;

class GpuProfile : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-test)";
  }
};

std::string synthetic(std::int64_t n, std::int64_t hw, std::int64_t c) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_gpu_profile_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / fmt::format("syn_{}_{}_{}.h5", n, hw, c)).string();
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n, 16, hw, hw, c, 10, 3);
  return p;
}

runtime::TrainOptions options(const std::string& data, bool amp) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.backend = runtime::Backend::CUDA;
  o.batch = 32;
  o.lr = 0.01;
  o.seed = 11;
  o.amp = amp;
  o.validate = false;
  return o;
}

bp::BluePrint residual_model() {
  bp::BluePrint m;
  m.name = "gpu_res";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::maxpool(3, 2, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

bool is_fused(const plan::Node& n) {
  return n.type == plan::NodeType::COMPUTE &&
         (n.op == plan::OpKind::FUSED_FWD || n.op == plan::OpKind::FUSED_BWD || n.op == plan::OpKind::FUSED_INFER);
}

TEST_P(GpuProfile, ProfiledStepsTrainLikeCapturedOnes) {
  const std::string data = synthetic(64, 16, 3);
  runtime::Trainer profiled(residual_model(), options(data, GetParam()));
  runtime::Trainer captured(residual_model(), options(data, GetParam()));
  const runtime::ProfileResult r = profiled.profile(1, 3);
  captured.benchmark(1, 3, true);
  auto wa = profiled.state_values(), wb = captured.state_values();
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0);
  // Afterwards both replay their captures the same way (the timer is off again).
  profiled.benchmark(0, 2, true);
  captured.benchmark(0, 2, true);
  wa = profiled.state_values();
  wb = captured.state_values();
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0);

  // Every plain node of the step is timed (FUSED_* nodes are timed by their runner, under their own labels,
  // which may repeat plain names: the counts below are lower bounds), and the tables add up.
  const plan::ComputationGraph& g = profiled.plan().train;
  std::map<std::string, double> plain;
  double fused_nodes = 0, plain_nodes = 0;
  for (int s = 0; s < 2; ++s)
    for (GraphId id : {GraphId::ZERO_GRAD, s == 0 ? GraphId::FIRST_LAYER_FWD_A : GraphId::FIRST_LAYER_FWD_B,
                       GraphId::DEEP_FWD_BWD, s == 0 ? GraphId::FIRST_LAYER_BWD_A : GraphId::FIRST_LAYER_BWD_B,
                       GraphId::OPTIMIZER}) {
      const double w = s == 0 ? 2.0 / 3.0 : 1.0 / 3.0;  // 3 steps: slots A, B, A
      for (const plan::Node& n : g.bucket(id)) {
        if (is_fused(n)) {
          fused_nodes += w;
          continue;
        }
        plain_nodes += w;
        plain[n.type == plan::NodeType::RANGE ? plan::range_op_name(n.range_op) : plan::op_kind_name(n.op)] += w;
      }
    }
  if (GetParam()) {
    EXPECT_GT(fused_nodes, 0.0);
  }
  std::map<std::string, double> calls;
  double all_calls = 0, ms = 0;
  for (const auto& x : r.kernels) {
    calls[x.label] = x.calls_per_step;
    all_calls += x.calls_per_step;
    ms += x.ms_per_step;
    EXPECT_GE(x.ms_per_step, 0.0) << x.label;
  }
  for (const auto& [label, n] : plain) EXPECT_GE(calls[label] + 1e-9, n) << label;
  EXPECT_GE(all_calls + 1e-9, plain_nodes + fused_nodes);
  EXPECT_GT(r.total_ms_per_step, 0.0);
  EXPECT_NEAR(ms, r.total_ms_per_step, 1e-6 * r.total_ms_per_step);
}

INSTANTIATE_TEST_SUITE_P(Fp32AndAmp, GpuProfile, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "amp" : "fp32"; });

}  // namespace
