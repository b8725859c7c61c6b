// The fused element-wise kernels of fused AMP layers (DESIGN §11, runtime/cuda_fused.cpp) on a whole network with every
// fused kind: training and evaluation with the fused kernels equal running every part as its own kernel, bit for bit,
// and the fused kernels really ran (the profile of a step lists them).
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;

class GpuFused : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-test)";
  }
};

std::string synthetic(std::int64_t n, std::int64_t hw, std::int64_t c) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_gpu_fused_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / fmt::format("syn_{}_{}_{}.h5", n, hw, c)).string();
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n, 64, hw, hw, c, 10, 5);
  return p;
}

/// Every fused kind: CBR, BasicBlock identity/projection, Bottleneck identity/projection, InvResidual
/// identity/no-shortcut, GapFC.
bp::BluePrint every_fused_kind() {
  bp::BluePrint m;
  m.name = "every_fused_kind";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2), bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 1),
                   bp::block(16, 64, bp::BlockKind::RESNET_1_3_1, 2),
                   bp::block(128, 64, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(128, 48, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

runtime::TrainOptions options(const std::string& data, bool fuse_kernels) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.backend = runtime::Backend::CUDA;
  o.amp = true;
  o.fuse = true;
  o.fuse_kernels = fuse_kernels;
  o.batch = 32;
  o.epochs = 1;
  o.max_steps = 3;
  o.lr = 0.05;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.seed = 5;
  o.validate = false;
  return o;
}

TEST_F(GpuFused, FusedKernelsEqualThePlainPartsBitForBit) {
  const std::string data = synthetic(160, 16, 3);
  runtime::Trainer fused(every_fused_kind(), options(data, true));
  runtime::Trainer parts(every_fused_kind(), options(data, false));
  std::set<plan::LayerKind> kinds;
  for (const auto& l : fused.plan().arch.layers) kinds.insert(l.kind);
  for (auto k : {plan::LayerKind::CBR, plan::LayerKind::BasicBlockIdentity, plan::LayerKind::BasicBlockProjection,
                 plan::LayerKind::BottleneckIdentity, plan::LayerKind::BottleneckProjection,
                 plan::LayerKind::InvResidualIdentity, plan::LayerKind::InvResidualNoShortcut, plan::LayerKind::GapFC})
    ASSERT_TRUE(kinds.count(k)) << plan::layer_kind_name(k);
  const auto hf = fused.run();
  const auto hp = parts.run();
  ASSERT_EQ(hf.size(), hp.size());
  EXPECT_EQ(hf.back().train_loss, hp.back().train_loss);
  const auto wf = fused.state_values(), wp = parts.state_values();
  ASSERT_EQ(wf.size(), wp.size());
  EXPECT_EQ(std::memcmp(wf.data(), wp.data(), wf.size() * sizeof(float)), 0)
      << "weights, BN statistics and optimizer state";
  // Inference (FUSED_INFER: BN with running statistics + add + ReLU in one pass).
  const auto ef = fused.evaluate(), ep = parts.evaluate();
  EXPECT_EQ(ef.val_loss, ep.val_loss);
  EXPECT_EQ(ef.val_top1, ep.val_top1);
}

TEST_F(GpuFused, ReluMasksTrainToTheSameBitsAsReadingTheOutput) {
  // plan_relu_masks: the 4 block ends whose ReLU backward is a sum+relu+bn backward keep 1-bit masks, which that pass
  // reads instead of the FP16 output (batchnorm.cu, kSumBits): the same training bit for bit as relu_masks off.
  const std::string data = synthetic(160, 16, 3);
  auto o = options(data, true);
  runtime::Trainer with(every_fused_kind(), o);
  o.relu_masks = false;
  runtime::Trainer without(every_fused_kind(), o);
  int masks = 0;
  for (const DTensor& t : with.plan().memory[0].tensors()) masks += t.region == Region::S_MASK;
  EXPECT_EQ(masks, 4);
  for (const DTensor& t : without.plan().memory[0].tensors()) EXPECT_NE(t.region, Region::S_MASK);
  const auto hw = with.run(), ho = without.run();
  ASSERT_EQ(hw.size(), ho.size());
  EXPECT_EQ(hw.back().train_loss, ho.back().train_loss);
  const auto ww = with.state_values(), wo = without.state_values();
  ASSERT_EQ(ww.size(), wo.size());
  EXPECT_EQ(std::memcmp(ww.data(), wo.data(), ww.size() * sizeof(float)), 0) << "weights, BN statistics, optimizer";
}

TEST_F(GpuFused, ShortcutBnBackwardJoinedTrainsToTheSameBitsAsApart) {
  // plan ADD_RELU_BN_BN_BWD: the projection blocks' shortcut BN backward inside the block end's pass (its sums in the
  // statistics pass, both data gradients from one apply pass, batchnorm.cu kSecond): the same training bit for bit
  // as with fuse_shortcut_bn_backward off.
  const std::string data = synthetic(160, 16, 3);
  auto o = options(data, true);
  runtime::Trainer joined(every_fused_kind(), o);
  o.fuse_shortcut_bn_backward = false;
  runtime::Trainer apart(every_fused_kind(), o);
  const auto hj = joined.run(), ha = apart.run();
  ASSERT_EQ(hj.size(), ha.size());
  EXPECT_EQ(hj.back().train_loss, ha.back().train_loss);
  const auto wj = joined.state_values(), wa = apart.state_values();
  ASSERT_EQ(wj.size(), wa.size());
  EXPECT_EQ(std::memcmp(wj.data(), wa.data(), wj.size() * sizeof(float)), 0) << "weights, BN statistics, optimizer";
}

TEST_F(GpuFused, ConvStatsEpilogueTrainsCloseToTheOwnStatisticsAndIsRefusedInDeterministicMode) {
  // --conv-stats on (ConvOp::choose_stats, cuda_fused.cpp plan_conv_stats): a BN's statistics from its convolution's
  // GEN_STATS epilogue, here forced wherever cuDNN has a plan (RN_DEBUG_CONV_STATS=always) instead of where timed
  // faster. Non-deterministic mode: the profile shows the fused forwards (cuDNN offers GEN_STATS plans for these
  // FP16 shapes) and the first step's loss is within 0.1 % of the own statistics kernel's. Deterministic mode: no
  // GEN_STATS plan repeats its bits (GpuConvEngines.Genstats*), so the trainer refuses the option before any work.
  struct Force {
    Force() { ::setenv("RN_DEBUG_CONV_STATS", "always", 1); }
    ~Force() { ::unsetenv("RN_DEBUG_CONV_STATS"); }
  } force;
  const std::string data = synthetic(160, 16, 3);
  auto o = options(data, true);
  o.deterministic = false;
  o.conv_stats = true;
  runtime::Trainer fused(every_fused_kind(), o);
  double calls = 0;
  for (const auto& r : fused.profile(1, 2).kernels)
    if (r.label == "CONV_FWD+stats") calls = r.calls_per_step;
  std::printf("[ conv-stats ] %g forward convolutions a step with GEN_STATS (non-deterministic mode)\n", calls);
  EXPECT_GT(calls, 0);
  // One step: its loss comes from this batch's statistics (the sums' plumbing), before any update could amplify
  // the non-deterministic sums' rounding (three steps spread by 0.5 % run to run on an H100).
  o.max_steps = 1;
  runtime::Trainer fused2(every_fused_kind(), o);
  o.conv_stats = false;
  runtime::Trainer plain1(every_fused_kind(), o);
  o.conv_stats = true;
  const auto hp = plain1.run(), hf = fused2.run();
  ASSERT_EQ(hp.size(), hf.size());
  const double lp = hp.back().train_loss, lf = hf.back().train_loss;
  std::printf("[ conv-stats ] first step's loss: own statistics %.6f, GEN_STATS %.6f\n", lp, lf);
  EXPECT_TRUE(std::isfinite(lf));
  EXPECT_NEAR(lf, lp, 1e-3 * std::abs(lp) + 1e-4);
  o.deterministic = true;
  try {
    runtime::Trainer refused(every_fused_kind(), o);
    ADD_FAILURE() << "--conv-stats on with --deterministic on was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--conv-stats"), std::string::npos) << e.what();
  }
}

TEST_F(GpuFused, TheProfileShowsEveryFusedKernelGroup) {
  // The equality above would hold trivially if nothing were fused: the profile of a step lists the fused groups
  // (and with --fused-kernels off, none of them), with the calls per step the network implies.
  const std::string data = synthetic(160, 16, 3);
  auto calls = [](const runtime::ProfileResult& p, const std::string& label) {
    for (const auto& r : p.kernels)
      if (r.label == label) return r.calls_per_step;
    return 0.0;
  };
  runtime::Trainer fused(every_fused_kind(), options(data, true));
  const auto p = fused.profile(1, 2);
  // CBR, 2 inner ReLUs per bottleneck and 1 per basic block, 2 per inverted residual: BN → ReLU in forward;
  // identity blocks: BN + add + ReLU; projection blocks: BN + BN + add + ReLU; the same inner ReLUs in backward.
  EXPECT_EQ(calls(p, "FUSED:bn+relu"), 1 + 2 * 1 + 2 * 2 + 2 * 2);
  EXPECT_EQ(calls(p, "FUSED:bn+add+relu"), 2);     // BasicBlockIdentity, BottleneckIdentity
  EXPECT_EQ(calls(p, "FUSED:bn+add"), 1);          // InvResidualIdentity (no ReLU after its add)
  EXPECT_EQ(calls(p, "FUSED:bn+bn+add+relu"), 2);  // BasicBlockProjection, BottleneckProjection
  EXPECT_EQ(calls(p, "FUSED:relu+bn backward"), 1 + 2 * 1 + 2 * 2 + 2 * 2);
  // Blocks 2-5 start at a block's end ReLU: their second data gradient writes its own buffer (beta = 0) and that
  // ReLU's backward sums both addends, inside the backward of the BN before the sum (plan ADD_RELU_BN_BWD); at the
  // ends of the two projection blocks followed by another block (3 and 5) the shortcut BN's backward joins it.
  EXPECT_EQ(calls(p, "FUSED:sum+relu+bn backward"), 2);
  EXPECT_EQ(calls(p, "FUSED:sum+relu+bn+bn backward"), 2);
  EXPECT_EQ(calls(p, "FUSED:sum+relu backward"), 0);
  EXPECT_EQ(calls(p, "RELU_FWD"), 0);
  auto o = options(data, false);
  runtime::Trainer parts(every_fused_kind(), o);
  const auto q = parts.profile(1, 2);
  EXPECT_EQ(calls(q, "FUSED:bn+relu"), 0);
  EXPECT_EQ(calls(q, "FUSED:relu+bn backward"), 0);
  EXPECT_EQ(calls(q, "FUSED:sum+relu backward"), 0);
  EXPECT_EQ(calls(q, "FUSED:sum+relu+bn backward"), 0);
  EXPECT_EQ(calls(q, "FUSED:sum+relu+bn+bn backward"), 0);
  EXPECT_GT(calls(q, "ACCUMULATE"), 0);  // its plain parts
  EXPECT_GT(calls(q, "RELU_FWD"), 0);
}

TEST_F(GpuFused, RecomputedBnReluTrainsToTheSameBitsAsKept) {
  // --recompute bn-relu (plan/recompute.h): the backward forms the BN -> ReLU outputs it reads again with the forward's
  // own apply kernel (batchnorm_apply_fused), so training and evaluation give the same bits as keeping them; the
  // profile shows the recompute passes (AMP: one per inner ReLU of the deep layers) and the plan holds fewer bytes.
  // AMP with the fused passes and with the plain parts (BN_APPLY, then RELU_FWD), FP32 plain layers; graphs on and off.
  const std::string data = synthetic(160, 16, 3);
  struct Case {
    const char* name;
    bool amp, fuse_kernels, graphs;
  };
  for (const Case c : {Case{"amp, fused", true, true, true}, Case{"amp, parts", true, false, true},
                       Case{"amp, fused, node by node", true, true, false}, Case{"fp32", false, true, true}}) {
    SCOPED_TRACE(c.name);
    auto o = options(data, c.fuse_kernels);
    o.amp = o.fuse = c.amp;
    runtime::Trainer kept(every_fused_kind(), o);
    o.recompute_bn_relu = true;
    runtime::Trainer again(every_fused_kind(), o);
    EXPECT_LT(again.plan().memory[0].pool_peak_live_bytes(), kept.plan().memory[0].pool_peak_live_bytes());
    kept.benchmark(0, 3, c.graphs);
    again.benchmark(0, 3, c.graphs);
    const auto a = again.state_values(), b = kept.state_values();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << "weights, BN statistics, optimizer state";
    const auto ea = again.evaluate(), eb = kept.evaluate();
    EXPECT_EQ(ea.val_loss, eb.val_loss);
  }
  auto o = options(data, true);
  o.recompute_bn_relu = true;
  runtime::Trainer again(every_fused_kind(), o);
  const auto p = again.profile(1, 2);
  double recompute = 0;
  for (const auto& r : p.kernels)
    if (r.label == "FUSED:bn+relu recompute") recompute = r.calls_per_step;
  EXPECT_EQ(recompute, 2 * 1 + 2 * 2 + 2 * 2);  // basic blocks 1, bottlenecks 2, inverted residuals 2 each
}

TEST_F(GpuFused, ConcurrentStreamsEqualOneStreamBitForBit) {
  // Weight gradients on the second compute stream beside the data gradients change the schedule, not the numbers:
  // AMP with fused layers (the pairs inside FUSED_BWD nodes) and FP32 without (top-level pairs), graphs on and off.
  const std::string data = synthetic(160, 16, 3);
  for (bool amp : {true, false}) {
    for (bool graphs : {true, false}) {
      auto o = options(data, true);
      o.amp = amp;
      o.fuse = amp;
      o.concurrent_streams = true;
      runtime::Trainer two(every_fused_kind(), o);
      o.concurrent_streams = false;
      runtime::Trainer one(every_fused_kind(), o);
      two.benchmark(0, 3, graphs);
      one.benchmark(0, 3, graphs);
      const auto a = two.state_values(), b = one.state_values();
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << (amp ? "AMP" : "FP32") << (graphs ? ", graphs" : ", node by node");
    }
  }
}

TEST_F(GpuFused, FoldedResidualSumsMatchTheCpuAndAddingDgrads) {
  // fold_residual_sums (plan ADD_RELU_BWD): the GPU against the CPU reference on the same plan (FP16 storage, so
  // within FP16 rounding of a few steps), and against the plan that adds the dgrads into the gradient (beta = 1):
  // the same training within FP16 rounding, not the same bits (the sum is rounded after the dgrad is).
  const std::string data = synthetic(160, 16, 3);
  auto o = options(data, true);
  runtime::Trainer gpu(every_fused_kind(), o);
  o.backend = runtime::Backend::CPU;
  runtime::Trainer cpu(every_fused_kind(), o);
  o.backend = runtime::Backend::CUDA;
  o.fold_residual_sums = false;
  runtime::Trainer adding(every_fused_kind(), o);
  o.backend = runtime::Backend::CPU;
  runtime::Trainer cpu_adding(every_fused_kind(), o);
  o.backend = runtime::Backend::CUDA;
  const auto hg = gpu.run(), hc = cpu.run(), ha = adding.run(), hca = cpu_adding.run();
  EXPECT_NEAR(hg.back().train_loss, hc.back().train_loss, 1e-2 * std::max(1.0, std::abs(hc.back().train_loss)));
  EXPECT_NEAR(hg.back().train_loss, ha.back().train_loss, 1e-2 * std::max(1.0, std::abs(ha.back().train_loss)));
  auto worst = [](const std::vector<float>& a,
                  const std::vector<float>& b) -> double {  // as test_gpu_trainer's max_rel_diff
    double max_ref = 1e-12, max_diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
      max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    }
    return max_diff / max_ref;
  };
  const auto g = gpu.state_values(), c = cpu.state_values(), a = adding.state_values(), ca = cpu_adding.state_values();
  ASSERT_EQ(g.size(), c.size());
  ASSERT_EQ(g.size(), a.size());
  ASSERT_EQ(g.size(), ca.size());
  auto where = [](const std::vector<float>& x, const std::vector<float>& y) {
    std::size_t at = 0;
    double d = -1;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::abs(static_cast<double>(x[i]) - y[i]) > d) {
        d = std::abs(static_cast<double>(x[i]) - y[i]);
        at = i;
      }
    return fmt::format("worst at state value {} of {}: {} vs {}", at, x.size(), x[at], y[at]);
  };
  std::printf("[ fold ] train loss: gpu fold %.6f, cpu fold %.6f, gpu adding %.6f, cpu adding %.6f\n",
              hg.back().train_loss, hc.back().train_loss, ha.back().train_loss, hca.back().train_loss);
  std::printf(
      "[ fold ] state rel diff: gpu fold vs cpu fold %.3e (%s); gpu adding vs cpu adding %.3e (%s); cpu fold vs "
      "cpu adding %.3e; gpu fold vs gpu adding %.3e\n",
      worst(g, c), where(g, c).c_str(), worst(a, ca), where(a, ca).c_str(), worst(c, ca), worst(g, a));
  // Bounds from the same comparison without the folding: on the H200 (2026-12-02) the adding plans' GPU and CPU
  // runs of this net were already 5.4e-2 apart after 3 steps (FP16 storage, lr 0.05), and the folded GPU run 4.7e-2
  // from the folded CPU run; folded vs adding 1.6e-2 on the GPU, 1.9e-2 on the CPU.
  EXPECT_LE(worst(g, c), std::max(1e-2, 1.5 * worst(a, ca))) << "folded GPU vs CPU, against adding GPU vs CPU";
  EXPECT_LE(worst(g, a), std::max(1e-2, 1.5 * worst(c, ca))) << "folded vs adding dgrads, GPU against CPU";
  // Deterministic: the same run again, bit for bit.
  o.fold_residual_sums = true;
  runtime::Trainer again(every_fused_kind(), o);
  again.run();
  const auto g2 = again.state_values();
  EXPECT_EQ(std::memcmp(g.data(), g2.data(), g.size() * sizeof(float)), 0);
}

}  // namespace
