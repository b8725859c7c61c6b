// The CPU runtime end to end: determinism, the last partial batch, AMP and fused plans, variant switching,
// bad input. Uses small synthetic datasets made by the io module.
#include "../io/io_test_util.h"

#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/io/importers.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/arena_keeper.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/thread_pool.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_trainer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string synthetic(std::int64_t n_train, std::int64_t n_val, std::int64_t hw = 28, std::int64_t c = 1,
                      int classes = 10) {
  const std::string p = temp_path(fmt::format("syn_{}_{}_{}_{}_{}.h5", n_train, n_val, hw, c, classes));
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n_train, n_val, hw, hw, c, classes, 123);
  return p;
}

runtime::TrainOptions small_options(const std::string& data) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.epochs = 1;
  o.batch = 64;
  o.lr = 0.01;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.seed = 7;
  o.augmentation.crop_padding = 2;
  o.augmentation.horizontal_flip = true;
  return o;
}

/// A 16x16 residual model with every fused kind (basic and bottleneck blocks, identity and projection, MobileNetV2).
bp::BluePrint tiny_residual_model() {
  bp::BluePrint m;
  m.name = "tiny_res";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2), bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 1),
                   bp::block(16, 64, bp::BlockKind::RESNET_1_3_1, 2),
                   bp::block(128, 64, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(128, 48, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Trainer, SameSeedGivesBitIdenticalWeightsAfterAnEpoch) {
  const std::string data = synthetic(300, 100);
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), small_options(data));
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), small_options(data));
  a.run();
  b.run();
  const auto wa = a.state_values(), wb = b.state_values();
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(bit_equal(wa, wb));
  // and the run did change the weights, so the comparison means something
  runtime::Trainer fresh(bp::zoo_model("fmnist_cnn"), small_options(data));
  EXPECT_FALSE(bit_equal(wa, fresh.state_values()));
}

// Start-up runs every subgraph once (the warm-up before each capture, on whatever the arena holds then); none of
// that may leak into the run: optimizer moments, EMA and gradients start at zero, like a fresh PyTorch optimizer.
TEST(Trainer, OptimizerStateStartsAtZeroAfterStartUp) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  o.optimizer = plan::OptimizerKind::ADAMW;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  std::size_t checked = 0;
  for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors()) {
    const RegionFamily f = region_family(d.region);
    if (f != RegionFamily::M && f != RegionFamily::V && f != RegionFamily::G) continue;
    for (float v : t.tensor_values(d.name)) ASSERT_EQ(v, 0.0f) << d.name;
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

TEST(Trainer, OneAndTwoCpuThreadsTrainToTheSameBits) {
  // The CPU kernels cut their work by shape, never by thread count (oneDNN's convolutions included: single-threaded
  // on fixed batch pieces), so the thread pool's size changes no result of a whole training run.
  const std::string data = synthetic(300, 100);
  const int before = cpu::num_threads();
  cpu::set_num_threads(1);
  runtime::Trainer one(bp::zoo_model("fmnist_cnn"), small_options(data));
  const auto h1 = one.run();
  cpu::set_num_threads(2);
  runtime::Trainer two(bp::zoo_model("fmnist_cnn"), small_options(data));
  const auto h2 = two.run();
  cpu::set_num_threads(before);
  EXPECT_TRUE(bit_equal(one.state_values(), two.state_values()));
  ASSERT_EQ(h1.size(), h2.size());
  EXPECT_EQ(h1.back().val_loss, h2.back().val_loss);
}

// --cpu-winograd on: fmnist_cnn's 14x14x32->64 and 7x7x64->64 layers run oneDNN's Winograd kernels where the CPU has
// them (AVX-512). Their forward and dx pieces follow the thread count (1 vs 4 threads: 2 vs 4 pieces of 64 samples),
// their weight-gradient pieces the batch alone, so the run's bits still do not depend on the thread count; and they
// train like the direct kernels (other bits, a close loss).
TEST(Trainer, WinogradTrainsToTheSameBitsWithAnyThreadCount) {
  const std::string data = synthetic(300, 100);
  const int before = cpu::num_threads();
  const bool was = cpu::conv2d_winograd();
  cpu::set_conv2d_winograd(false);
  runtime::Trainer direct(bp::zoo_model("fmnist_cnn"), small_options(data));
  const auto hd = direct.run();
  cpu::set_conv2d_winograd(true);
  cpu::set_num_threads(1);
  runtime::Trainer one(bp::zoo_model("fmnist_cnn"), small_options(data));
  const auto h1 = one.run();
  cpu::set_num_threads(4);
  runtime::Trainer four(bp::zoo_model("fmnist_cnn"), small_options(data));
  const auto h4 = four.run();
  cpu::set_num_threads(before);
  cpu::set_conv2d_winograd(was);
  EXPECT_TRUE(bit_equal(one.state_values(), four.state_values()));
  ASSERT_EQ(h1.size(), h4.size());
  EXPECT_EQ(h1.back().val_loss, h4.back().val_loss);
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512: oneDNN has no Winograd kernel here";
  EXPECT_FALSE(bit_equal(one.state_values(), direct.state_values())) << "the Winograd kernels did not run";
  EXPECT_NEAR(h1.back().val_loss, hd.back().val_loss, 1e-3 * std::abs(hd.back().val_loss));
}

TEST(Trainer, DifferentSeedGivesDifferentWeights) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), o);
  o.seed = 8;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o);
  EXPECT_FALSE(bit_equal(a.state_values(), b.state_values()));
}

TEST(Trainer, LastPartialBatchIsTrainedNotDropped) {
  const std::string data = synthetic(300, 100);  // 300 = 4·64 + 44
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), small_options(data));
  const auto h = t.run();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(t.steps(), 5);
  EXPECT_EQ(h[0].step, 5);
  EXPECT_EQ(h[0].train_samples, 300);
  EXPECT_EQ(t.plan().specs[static_cast<int>(plan::Variant::TRAIN_LAST)].batch_size, 44);
}

TEST(Trainer, LossGoesDownAndMetricsAreFractions) {
  const std::string data = synthetic(1024, 256);
  auto o = small_options(data);
  o.epochs = 3;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  const auto h = t.run();
  ASSERT_EQ(h.size(), 3u);
  EXPECT_LT(h[2].train_loss, h[0].train_loss);
  for (const auto& m : h) {
    EXPECT_GE(m.val_top1, 0.0);
    EXPECT_LE(m.val_top1, 1.0);
    EXPECT_LE(m.val_top1, m.val_top5);
    EXPECT_TRUE(std::isfinite(m.val_loss));
  }
  EXPECT_GT(h[2].val_top1, 0.5);  // the classes are separable patterns; chance is 0.1
}

TEST(Trainer, MaxStepsStopsEarly) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  o.max_steps = 3;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  t.run();
  EXPECT_EQ(t.steps(), 3);
}

TEST(Trainer, OneArenaAllocationPerTrainer) {
  const std::string data = synthetic(300, 100);
  const std::int64_t before = runtime::ArenaKeeper::allocation_count();
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), small_options(data));
  t.run();
  EXPECT_EQ(runtime::ArenaKeeper::allocation_count() - before, 1);
}

TEST(Trainer, AmpPlanTrainsOnTheCpuWithFp16Copies) {
  const std::string data = synthetic(1024, 256);
  auto o = small_options(data);
  o.amp = true;
  o.epochs = 2;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  const auto h = t.run();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(std::isfinite(h[1].train_loss));
  EXPECT_LT(h[1].train_loss, h[0].train_loss);
  // The FP16 compute copy (A) is the cast of the FP32 master (W) after the last step.
  const auto w = t.tensor_values("cbr2.conv.w");
  const auto a = t.tensor_values("cbr2.conv.w.fp16");
  ASSERT_EQ(w.size(), a.size());
  for (std::size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(a[i], w[i], std::abs(w[i]) * 1e-3f + 1e-7f) << i;
  EXPECT_GT(h[1].loss_scale, 0.0);
}

TEST(Trainer, FusedPlanEqualsThePlainPlan) {
  // A residual model: with fuse, blocks become fused layers that the CPU runs as their plain parts. The two
  // plans must train to the same weights (same tensors, same order of operations) when the fused plan keeps the
  // plain plan's order of sums (fold_residual_sums off: a block's second data gradient adds into the gradient).
  // With the sums folded into the previous block's end ReLU backward (the default), the data gradient is rounded to
  // binary16 before it is added: the same training within FP16 rounding.
  const std::string data = synthetic(256, 64, 16, 3, 10);
  const bp::BluePrint m = tiny_residual_model();
  auto o = small_options(data);
  o.amp = true;
  o.max_steps = 3;
  o.validate = false;
  o.fuse = true;
  o.fold_residual_sums = false;
  runtime::Trainer fused(m, o);
  o.fold_residual_sums = true;
  runtime::Trainer folded(m, o);
  o.fuse = false;
  runtime::Trainer plain(m, o);
  // every fused kind is present in the fused plan
  std::set<plan::LayerKind> kinds;
  for (const auto& l : fused.plan().arch.layers) kinds.insert(l.kind);
  for (auto k : {plan::LayerKind::CBR, plan::LayerKind::BasicBlockIdentity, plan::LayerKind::BasicBlockProjection,
                 plan::LayerKind::BottleneckIdentity, plan::LayerKind::BottleneckProjection,
                 plan::LayerKind::InvResidualIdentity, plan::LayerKind::InvResidualNoShortcut, plan::LayerKind::GapFC})
    EXPECT_TRUE(kinds.count(k)) << plan::layer_kind_name(k);
  EXPECT_NE(fused.plan().arch.layers.size(), plain.plan().arch.layers.size());
  fused.run();
  const auto hp = plain.run();
  EXPECT_TRUE(bit_equal(fused.state_values(), plain.state_values()));
  const auto hf = folded.run();
  const auto a = folded.state_values(), b = plain.state_values();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_FALSE(bit_equal(a, b)) << "the folded sums round elsewhere: if this holds, nothing was folded";
  // max |a - b| over max |b| (the AMP bound of tests/gpu_runtime's GPU-vs-CPU checks, which differ by rounding too)
  double max_ref = 1e-12, max_diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << i;
    max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  std::printf(
      "fold_residual_sums on vs the plain plan after 3 steps: max |diff| %.3g, max |value| %.3g; loss %.6f vs "
      "%.6f\n",
      max_diff, max_ref, hf.back().train_loss, hp.back().train_loss);
  EXPECT_LE(max_diff / max_ref, 1e-2);
  EXPECT_NEAR(hf.back().train_loss, hp.back().train_loss, 1e-2 * std::max(1.0, std::abs(hp.back().train_loss)));
}

// --recompute bn-relu (plan/recompute.h): the BN -> ReLU outputs the backward reads are formed again there from the
// BN's input and the forward's statistics, with the forward's own formula, so training gives the same bits as keeping
// them; only the memory plan differs (the value dies with its last forward reader, its copy lives in the backward).
// AMP with every fused kind (the BN_RELU_RECOMPUTE pass), AMP with the plain parts, and the FP32 plain-layer plan
// (where the CPU fuses groups of plain nodes by address: a recompute plan moves the gradient buffers, and once made
// that fusion read a ReLU gradient that a BN's data gradient overwrote, shifted, from another thread).
TEST(Trainer, RecomputedBnReluTrainsToTheSameBitsAsKept) {
  bp::ZooOptions z;
  z.num_classes = 10;
  z.resolution = 32;
  const bp::BluePrint tiny = tiny_residual_model(), mobilenet = bp::zoo_model("mobilenet_v2", z),
                      resnet50 = bp::zoo_model("resnet50", z);
  struct Case {
    const char* name;
    const bp::BluePrint* model;
    bool amp, fuse, fuse_kernels;
  };
  // MobileNetV2 at 32x32 in FP32 is the plan whose gradient buffers once overlapped, shifted, in a fused group.
  for (const Case c : {Case{"amp, fused passes", &tiny, true, true, true}, Case{"amp, plain parts", &tiny, true, true, false},
                       Case{"fp32 plain layers", &tiny, false, false, true},
                       Case{"mobilenet_v2 fp32 plain layers", &mobilenet, false, false, true},
                       Case{"mobilenet_v2 amp (its last CBR's copy is for the plain parts only)", &mobilenet, true, true,
                            true},
                       // the stem's ReLU output, read backward only by its own ReLU backward (the max pool's reads
                       // its argmax): copied in the first layer's buckets, for the plain parts alone
                       Case{"resnet50 amp, fused passes", &resnet50, true, true, true},
                       Case{"resnet50 amp, plain parts (they read the stem's copy)", &resnet50, true, true, false}}) {
    SCOPED_TRACE(c.name);
    const bp::BluePrint& m = *c.model;
    const std::string data = synthetic(256, 64, m.in_h, 3, 10);
    auto o = small_options(data);
    o.amp = c.amp;
    o.fuse = c.fuse;
    o.fuse_kernels = c.fuse_kernels;
    o.max_steps = 4;
    o.validate = false;
    runtime::Trainer kept(m, o);
    o.recompute_bn_relu = true;
    runtime::Trainer again(m, o);
    // The plan recomputes something, and it costs fewer pool bytes at the peak.
    int applies = 0;
    for (const plan::Node& n : again.plan().train.bucket(plan::GraphId::DEEP_FWD_BWD)) {
      applies += n.op == plan::OpKind::BN_APPLY;
      for (const plan::Node& s : n.sub) applies += s.op == plan::OpKind::BN_APPLY;
    }
    EXPECT_GT(applies, 0);
    EXPECT_LT(again.plan().memory[0].pool_peak_live_bytes(), kept.plan().memory[0].pool_peak_live_bytes());
    const auto hk = kept.run();
    const auto ha = again.run();
    ASSERT_EQ(hk.size(), ha.size());
    EXPECT_EQ(hk.back().train_loss, ha.back().train_loss);
    EXPECT_TRUE(bit_equal(kept.state_values(), again.state_values()));
    // Some recomputed, the rest kept (--recompute-budget halfway between the two arenas): the same bits too.
    const std::int64_t k_arena = kept.plan().arena_bytes(), a_arena = again.plan().arena_bytes();
    o.recompute_budget_bytes = a_arena + (k_arena - a_arena) / 2;
    runtime::Trainer part(m, o);
    EXPECT_LE(part.plan().arena_bytes(), o.recompute_budget_bytes);
    EXPECT_LE(part.plan().config.recompute_limit, again.plan().config.recompute_limit);
    const auto hp = part.run();
    EXPECT_EQ(hk.back().train_loss, hp.back().train_loss);
    EXPECT_TRUE(bit_equal(kept.state_values(), part.state_values()));
    o.recompute_budget_bytes = 0;
  }
}

// A step reads no byte of the input buffers, features and gradient slots or temporaries before writing it, and
// what start-up leaves in the arena does not reach the run (initialisation zeroes it): NaN bytes over those families
// after initialisation, or another byte over the whole arena before it, change no loss and no weight. Every fused
// kind, FP32 and AMP (the GPU twin is GpuDeterminism.NoStepReads...).
// The same seed gives the same initial weights whatever else the plan holds: --ema and another optimizer (moments)
// add tensors beside the weights, and they must not change the model that is trained. (AMP is another model here:
// it pads the first convolution's input channels to 8, so its first weight has another shape.)
TEST(Trainer, InitialWeightsDoNotDependOnEmaOrOptimizer) {
  const std::string data = synthetic(300, 100);
  const auto reference = runtime::Trainer(bp::zoo_model("fmnist_cnn"), small_options(data)).state_values();
  ASSERT_FALSE(reference.empty());
  auto o = small_options(data);
  o.ema = true;
  EXPECT_TRUE(bit_equal(runtime::Trainer(bp::zoo_model("fmnist_cnn"), o).state_values(), reference)) << "--ema";
  o = small_options(data);
  o.optimizer = plan::OptimizerKind::ADAMW;
  EXPECT_TRUE(bit_equal(runtime::Trainer(bp::zoo_model("fmnist_cnn"), o).state_values(), reference)) << "adamw";
  // and training with --ema trains the same live model (the EMA is a shadow)
  o = small_options(data);
  o.max_steps = 3;
  runtime::Trainer plain(bp::zoo_model("fmnist_cnn"), o);
  o.ema = true;
  runtime::Trainer with_ema(bp::zoo_model("fmnist_cnn"), o);
  plain.run();
  with_ema.run();
  EXPECT_TRUE(bit_equal(plain.state_values(), with_ema.state_values()));
  o.seed = 8;
  EXPECT_FALSE(bit_equal(runtime::Trainer(bp::zoo_model("fmnist_cnn"), o).state_values(), reference)) << "seed";
}

// --zero-init-residual: exactly the last BN of each residual branch starts at γ = 0 (torchvision's bn2 of a basic
// block, bn3 of a bottleneck; here also the inverted residual's last BN where it has a shortcut), every other γ at 1,
// and nothing else changes: the other weights are the plain run's, bit for bit. Without residual sums it is an error.
TEST(Trainer, ZeroInitResidualZeroesTheLastBnOfEachResidualBranch) {
  const std::string data = synthetic(64, 32, 16, 3);
  auto o = small_options(data);
  const std::string plain_path = temp_path("zir_plain.h5"), zero_path = temp_path("zir_zero.h5");
  runtime::Trainer(tiny_residual_model(), o).save_weights(plain_path);
  o.zero_init_residual = true;
  runtime::Trainer(tiny_residual_model(), o).save_weights(zero_path);
  const io::WeightsFile plain = io::read_weights(plain_path), zero = io::read_weights(zero_path);
  ASSERT_EQ(plain.tensors.size(), zero.tensors.size());
  // The blocks of tiny_residual_model with a residual sum, and the BN that ends each one's branch.
  const std::set<std::string> want = {"basicblockidentity1.c2_bn.gamma", "basicblockprojection1.c2_bn.gamma",
                                      "bottleneckidentity1.c3_bn.gamma", "bottleneckprojection1.c3_bn.gamma",
                                      "invresidualidentity1.project_bn.gamma"};
  std::set<std::string> zeroed;
  for (std::size_t i = 0; i < zero.tensors.size(); ++i) {
    const io::NamedTensor &a = plain.tensors[i], &b = zero.tensors[i];
    ASSERT_EQ(a.name, b.name);
    const bool is_gamma = b.name.size() > 6 && b.name.compare(b.name.size() - 6, 6, ".gamma") == 0;
    if (is_gamma && b.group == "params" &&
        std::all_of(b.values.begin(), b.values.end(), [](float v) { return v == 0.0f; })) {
      zeroed.insert(b.name);
      EXPECT_TRUE(std::all_of(a.values.begin(), a.values.end(), [](float v) { return v == 1.0f; })) << a.name;
    } else {
      EXPECT_TRUE(bit_equal(a.values, b.values)) << b.group << "/" << b.name;
    }
  }
  EXPECT_EQ(zeroed, want);
  // Residual blocks as plain layers (--no-fuse's plan): the same BNs, by their names there: the BN layers are
  // bn2d1..7 in order, the projection shortcuts' bn2d2 and bn2d5 keep γ = 1.
  o.fuse = false;
  runtime::Trainer(tiny_residual_model(), o).save_weights(zero_path);
  std::set<std::string> unfused;
  for (const io::NamedTensor& t : io::read_weights(zero_path).tensors)
    if (t.group == "params" && t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".gamma") == 0 &&
        std::all_of(t.values.begin(), t.values.end(), [](float v) { return v == 0.0f; }))
      unfused.insert(t.name);
  EXPECT_EQ(unfused, (std::set<std::string>{"bn2d1.gamma", "bn2d3.gamma", "bn2d4.gamma", "bn2d6.gamma", "bn2d7.gamma"}));
  // A model without residual sums: a clear error naming the option, before any training.
  EXPECT_THROW(
      {
        try {
          auto f = small_options(synthetic(300, 100));
          f.zero_init_residual = true;
          runtime::Trainer t(bp::zoo_model("fmnist_cnn"), f);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--zero-init-residual"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

// The BN that ends a residual sum's shortcut is never the one zeroed, even where it is the last BN before the
// sum: an add2 whose shortcut projects (conv + BN) and whose main branch ends in a BN zeroes the main one only; one
// whose main branch is empty has no branch BN to zero, which is the same clear error as a model without sums.
TEST(Trainer, ZeroInitResidualNeverZeroesAShortcutBn) {
  const std::string data = synthetic(64, 32, 16, 3);
  auto model = [](bp::Layer main) {
    bp::BluePrint m;
    m.name = "shortcut_bn";
    m.in_h = m.in_w = 16;
    m.in_c = 3;
    m.root = bp::seq(bp::cbr(8, 3, 1, 1), bp::add2(std::move(main), bp::seq(bp::conv(8, 1), bp::bn())), bp::relu(),
                     bp::gap_fc(10), bp::softmax_ce(10));
    return m;
  };
  for (const bool fuse : {true, false}) {
    auto o = small_options(data);
    o.fuse = fuse;
    o.zero_init_residual = true;
    const std::string path = temp_path("zir_shortcut.h5");
    runtime::Trainer(model(bp::seq(bp::conv(8, 3, 1, 1), bp::bn())), o).save_weights(path);
    std::set<std::string> zeroed, ones;
    for (const io::NamedTensor& t : io::read_weights(path).tensors) {
      if (t.group != "params" || t.name.size() <= 6 || t.name.compare(t.name.size() - 6, 6, ".gamma") != 0) continue;
      if (std::all_of(t.values.begin(), t.values.end(), [](float v) { return v == 0.0f; })) zeroed.insert(t.name);
      if (std::all_of(t.values.begin(), t.values.end(), [](float v) { return v == 1.0f; })) ones.insert(t.name);
    }
    // The stem's BN, then the shortcut's (walked first: bn2d1), then the main branch's (bn2d2), alone at 0.
    EXPECT_EQ(zeroed, (std::set<std::string>{"bn2d2.gamma"})) << "fuse " << fuse;
    EXPECT_EQ(ones, (std::set<std::string>{"cbr1.bn.gamma", "bn2d1.gamma"})) << "fuse " << fuse;
    try {
      runtime::Trainer t(model(bp::seq()), o);
      ADD_FAILURE() << "fuse " << fuse << ": an empty main branch has no BN to zero, yet the run was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--zero-init-residual"), std::string::npos) << e.what();
    }
  }
}

TEST(Trainer, NoStepReadsInputsFeaturesOrTemporariesBeforeWritingThem) {
  const std::string data = synthetic(256, 64, 16, 3, 10);
  const bp::BluePrint m = tiny_residual_model();
  for (const bool amp : {false, true}) {
    auto o = small_options(data);
    o.amp = amp;
    o.max_steps = 3;
    o.fuse = true;
    auto run = [&](int fill, const std::string& poison, std::vector<double>* losses) {
      auto oo = o;
      oo.debug_arena_fill = fill;
      oo.debug_poison_families = poison;
      runtime::Trainer t(m, oo);
      runtime::TrainObserver obs;
      obs.on_step_loss = [losses](std::int64_t, std::int64_t, double l) { losses->push_back(l); };
      t.run(obs);
      return t.state_values();
    };
    std::vector<double> clean_losses;
    const auto clean = run(-1, "", &clean_losses);
    ASSERT_EQ(clean_losses.size(), 3u);
    for (const char* family : {"I", "F", "T"}) {
      std::vector<double> losses;
      std::vector<float> w;
      try {
        w = run(-1, family, &losses);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "amp " << amp << ", family " << family << " poisoned: " << e.what();
        continue;
      }
      EXPECT_EQ(losses, clean_losses) << "amp " << amp << ", family " << family << " poisoned";
      EXPECT_TRUE(bit_equal(w, clean)) << "amp " << amp << ", family " << family << " poisoned";
    }
    std::vector<double> losses;
    const auto w = run(0x7F, "", &losses);
    EXPECT_EQ(losses, clean_losses) << "amp " << amp << ", arena filled before initialisation";
    EXPECT_TRUE(bit_equal(w, clean)) << "amp " << amp << ", arena filled before initialisation";
    // and the poison is real: over the weights it does change the run
    std::vector<double> bad;
    bool threw = false;  // NaN weights: FP32 stops at the NaN check; AMP skips steps with NaN losses
    try {
      run(-1, "W,A", &bad);
    } catch (const std::exception&) {
      threw = true;
    }
    EXPECT_TRUE(threw || bad != clean_losses) << "amp " << amp;
  }
}

TEST(Trainer, CpuFusedPassesEqualThePlainParts) {
  // The CPU's fused element-wise passes against every part run on its own (fuse_kernels off), in FP32 and AMP plans
  // alike: the compiler's passes inside the fused layers (BN → ReLU, BN → ADD2 → ReLU with a projection shortcut's
  // BN apply deferred into it, ReLU backward folded into the BN backward, the residual sum folded into the end ReLU's
  // backward). Same weights, statistics, optimizer state and validation loss bit for bit, and every fused pass must
  // have run.
  const std::string data = synthetic(256, 64, 16, 3, 10);
  bp::BluePrint m;
  m.name = "tiny_res_cpu_fused";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::maxpool(2, 2), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2), bp::gap_fc(10), bp::softmax_ce(10));
  for (bool amp : {false, true}) {
    auto o = small_options(data);
    o.amp = amp;
    o.max_steps = 3;
    o.fuse_kernels = true;
    runtime::Trainer fused(m, o);
    o.fuse_kernels = false;
    runtime::Trainer plain(m, o);
    const auto hf = fused.run(), hp = plain.run();
    const std::string tag = amp ? "amp" : "fp32";
    EXPECT_TRUE(bit_equal(fused.state_values(), plain.state_values())) << tag;
    ASSERT_EQ(hf.size(), 1u);
    ASSERT_EQ(hp.size(), 1u);
    EXPECT_EQ(hf[0].val_loss, hp[0].val_loss) << tag;
    EXPECT_EQ(hf[0].train_loss, hp[0].train_loss) << tag;
    std::set<std::string> on, off;
    for (const auto& row : fused.profile(0, 1).kernels) on.insert(row.label);
    for (const auto& row : plain.profile(0, 1).kernels) off.insert(row.label);
    for (const char* k :
         {"FUSED:bn+relu", "FUSED:relu+bn backward", "FUSED:bn+add+relu", "FUSED:bn+bn+add+relu", "FUSED:bn-stats"})
      EXPECT_TRUE(on.count(k)) << tag << ": " << k << " did not run";
    // AMP: the projection block's shortcut dgrad writes its own buffer, summed in the identity block's end ReLU
    // backward (plan ADD_RELU_BWD), inside the backward of the BN before the sum (ADD_RELU_BN_BWD); FP32 plans keep
    // the sum in the dgrad (TrainConfig::fold_residual_sums).
    EXPECT_EQ(on.count("FUSED:sum+relu+bn backward"), amp ? 1u : 0u) << tag;
    for (const std::string& k : off) EXPECT_EQ(k.rfind("FUSED:", 0), std::string::npos) << tag << ": " << k;
  }
  // Near misses outside any fused layer, which nothing may fuse (the runtime matches no addresses): a BN output read by
  // a ReLU and by an identity shortcut (the ReLU is not in place, its gradient is not the BN output's whole gradient),
  // and a ReLU after a residual sum whose main branch ends in a BN (the ReLU's input is not that BN's output).
  bp::BluePrint tricky;
  tricky.name = "tricky_cpu_fused";
  tricky.in_h = tricky.in_w = 16;
  tricky.in_c = 3;
  tricky.root = bp::seq(
      bp::conv(16, 3, 1, 1), bp::bn(), bp::add2(bp::seq(bp::relu(), bp::conv(16, 3, 1, 1)), bp::seq()),
      bp::add2(bp::seq(bp::conv(16, 3, 1, 1), bp::bn()), bp::seq()), bp::relu(), bp::gap_fc(10), bp::softmax_ce(10));
  auto o = small_options(data);
  o.max_steps = 3;
  runtime::Trainer fused(tricky, o);
  o.fuse_kernels = false;
  runtime::Trainer plain(tricky, o);
  const auto hf = fused.run(), hp = plain.run();
  EXPECT_TRUE(bit_equal(fused.state_values(), plain.state_values())) << "tricky";
  EXPECT_EQ(hf[0].val_loss, hp[0].val_loss) << "tricky";
  std::set<std::string> on;
  for (const auto& row : fused.profile(0, 1).kernels) on.insert(row.label);
  EXPECT_FALSE(on.count("FUSED:relu+bn backward")) << "tricky: no ReLU backward may be folded here";
  EXPECT_FALSE(on.count("FUSED:bn+relu")) << "tricky: the first ReLU is not in place";
}

TEST(Trainer, ReluMasksTrainToTheSameBitsAndHoldTheReluSign) {
  // plan_relu_masks (AMP): the block ends write their ReLU's sign as 1-bit masks, which the sum+relu+bn backward reads
  // instead of the FP16 output. The CPU runs both sides of it (the GPU's layout): the same training bit for bit as
  // with the masks off, and after one step every mask equals the sign of the output it stands for, read from a run
  // with no reuse of the activation pool (whose outputs keep their bytes to the end of the step; the first step's
  // forward pass computes the same values in both plans).
  const std::string data = synthetic(256, 64, 16, 3, 10);
  bp::BluePrint m;
  m.name = "tiny_res_masks";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1), bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2),
                   bp::block(32, 32, bp::BlockKind::RESNET_3_3, 1), bp::gap_fc(10), bp::softmax_ce(10));
  auto o = small_options(data);
  o.amp = true;
  o.max_steps = 3;
  o.validate = false;
  {
    runtime::Trainer with(m, o);
    o.relu_masks = false;
    runtime::Trainer without(m, o);
    const auto hw = with.run(), ho = without.run();
    EXPECT_TRUE(bit_equal(with.state_values(), without.state_values()));
    ASSERT_EQ(hw.size(), 1u);
    ASSERT_EQ(ho.size(), 1u);
    EXPECT_EQ(hw[0].train_loss, ho[0].train_loss);
    for (const DTensor& t : without.plan().memory[0].tensors()) EXPECT_NE(t.region, Region::S_MASK);
  }
  o.max_steps = 1;
  o.relu_masks = true;
  runtime::Trainer one(m, o);
  one.run();
  o.relu_masks = false;
  o.reuse_memory = false;
  runtime::Trainer kept(m, o);
  kept.run();
  int masks = 0;
  for (const DTensor& t : one.plan().memory[0].tensors()) {
    if (t.region != Region::S_MASK) continue;
    ++masks;
    const std::string y = t.name.substr(0, t.name.size() - 5);  // "<y>.mask"
    ASSERT_EQ(t.name.substr(y.size()), ".mask");
    const std::vector<std::uint8_t> bits = one.tensor_bytes(t.name), v = kept.tensor_bytes(y);
    const std::int64_t rows = t.shape.n * t.shape.h * t.shape.w;
    const std::int64_t channels = static_cast<std::int64_t>(v.size() / 2) / rows;
    ASSERT_EQ((channels + 7) / 8, t.shape.c) << t.name;
    std::int64_t on = 0, wrong = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t ch = 0; ch < t.shape.c * 8; ++ch) {
        bool positive = false;  // padding bits: 0
        if (ch < channels) {
          const std::size_t e = static_cast<std::size_t>(r * channels + ch);
          const unsigned h = v[2 * e] | (v[2 * e + 1] << 8);  // FP16, little-endian
          positive = (h & 0x8000u) == 0 && (h & 0x7FFFu) != 0;
        }
        const bool bit = (bits[static_cast<std::size_t>(r * t.shape.c + ch / 8)] >> (ch % 8)) & 1u;
        on += bit;
        wrong += bit != positive;
      }
    EXPECT_EQ(wrong, 0) << t.name;
    EXPECT_GT(on, 0) << t.name;  // an all-zero mask would be a poor witness
  }
  // block ends whose ReLU backward is a sum+relu+bn backward pass: all but the last
  EXPECT_EQ(masks, 3);
}

TEST(Trainer, ShortcutBnBackwardJoinedTrainsLikeApart) {
  // TrainConfig::fuse_shortcut_bn_backward (AMP): a projection block followed by another block ends in a
  // sum+relu+bn+bn backward pass (its shortcut BN's backward joins the block end's); the CPU runs the composition in
  // that pass's place: the same training bit for bit as with the two apart, and the profile names the pass.
  const std::string data = synthetic(256, 64, 16, 3, 10);
  bp::BluePrint m;
  m.name = "tiny_res_shortcut";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2), bp::block(32, 32, bp::BlockKind::RESNET_3_3, 1),
                   bp::gap_fc(10), bp::softmax_ce(10));
  auto o = small_options(data);
  o.amp = true;
  o.max_steps = 3;
  runtime::Trainer joined(m, o);
  o.fuse_shortcut_bn_backward = false;
  runtime::Trainer apart(m, o);
  const auto hj = joined.run(), ha = apart.run();
  EXPECT_TRUE(bit_equal(joined.state_values(), apart.state_values()));
  ASSERT_EQ(hj.size(), 1u);
  EXPECT_EQ(hj[0].train_loss, ha[0].train_loss);
  EXPECT_EQ(hj[0].val_loss, ha[0].val_loss);
  auto calls = [](const runtime::ProfileResult& p, const std::string& label) {
    for (const auto& r : p.kernels)
      if (r.label == label) return r.calls_per_step;
    return 0.0;
  };
  const auto pj = joined.profile(0, 1), pa = apart.profile(0, 1);
  EXPECT_EQ(calls(pj, "FUSED:sum+relu+bn+bn backward"), 1);
  EXPECT_EQ(calls(pj, "FUSED:sum+relu+bn backward"), 1);
  EXPECT_EQ(calls(pa, "FUSED:sum+relu+bn+bn backward"), 0);
  EXPECT_EQ(calls(pa, "FUSED:sum+relu+bn backward"), 2);
}

TEST(Trainer, ProgressiveResizeTrainsTheFirstEpochsOnTheLowResVariants) {
  const std::string data = synthetic(256, 64, 16, 3, 10);
  bp::BluePrint m;
  m.name = "gap_net";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::maxpool(2, 2), bp::cbr(32, 3, 1, 1), bp::gap_fc(10), bp::softmax_ce(10));
  auto o = small_options(data);
  o.epochs = 2;
  o.start_resolution = 8;
  o.lowres_epochs = 1;
  runtime::Trainer t(m, o);
  EXPECT_EQ(t.plan().specs[static_cast<int>(plan::Variant::TRAIN_LOWRES)].actual_resolution, 8);
  const auto h = t.run();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(std::isfinite(h[0].train_loss));
  EXPECT_TRUE(std::isfinite(h[1].train_loss));
  // A flatten + fc net cannot change resolution: the fc weight would change shape. That is a clear error.
  auto o2 = small_options(synthetic(300, 100));
  o2.start_resolution = 20;
  o2.lowres_epochs = 1;
  EXPECT_THROW(runtime::Trainer(bp::zoo_model("fmnist_cnn"), o2), Error);
}

TEST(Trainer, EmaValidationRuns) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  o.ema = true;
  o.ema_decay = 0.5;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  const auto h = t.run();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_GE(h[0].ema_val_top1, 0.0);
  EXPECT_LE(h[0].ema_val_top1, 1.0);
}

// The EMA after three steps against the weights each step left, averaged on the host with the warm-up decay
// min(decay, (1 + t) / (10 + t)) of step t.
TEST(Trainer, EmaIsTheWarmedUpAverageOfTheWeightsEachStepLeft) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  o.ema = true;
  o.ema_decay = 0.9;
  o.validate = false;
  std::string wname;
  std::vector<std::vector<float>> w;  // w[t]: the master after t steps
  for (int t = 0; t <= 3; ++t) {
    o.max_steps = t;
    runtime::Trainer tr(bp::zoo_model("fmnist_cnn"), o);
    if (t > 0) tr.run();
    if (wname.empty())
      for (const DTensor& d : tr.plan().plan(plan::Variant::TRAIN_BASE).tensors())
        if (d.region == Region::W_DEEP_CONV) {
          wname = d.name;
          break;
        }
    ASSERT_FALSE(wname.empty());
    w.push_back(tr.tensor_values(wname));
    if (t == 3) {
      std::vector<double> e(w[0].begin(), w[0].end());  // the EMA starts at the initial weights
      for (int k = 1; k <= 3; ++k) {
        const double d = static_cast<float>(std::min(0.9, (1.0 + k) / (10.0 + k)));
        for (std::size_t i = 0; i < e.size(); ++i) e[i] = d * e[i] + (1.0 - d) * w[k][i];
      }
      const std::vector<float> got = tr.tensor_values(wname + ".ema");
      ASSERT_EQ(got.size(), e.size());
      double worst = 0;
      for (std::size_t i = 0; i < e.size(); ++i)
        worst = std::max(worst, std::abs(got[i] - e[i]) / (1e-3 + std::abs(e[i])));
      EXPECT_LT(worst, 1e-5) << wname;
      EXPECT_NE(got, w[3]);  // an average, not the last weights
    }
  }
}

TEST(Trainer, EveryOptimizerTrains) {
  const std::string data = synthetic(1024, 256);
  for (auto k : {plan::OptimizerKind::SGD, plan::OptimizerKind::MOMENTUM, plan::OptimizerKind::ADAM,
                 plan::OptimizerKind::ADAMW, plan::OptimizerKind::LARS}) {
    auto o = small_options(data);
    o.optimizer = k;
    o.lr = (k == plan::OptimizerKind::ADAM || k == plan::OptimizerKind::ADAMW) ? 1e-3
           : k == plan::OptimizerKind::LARS                                    ? 1.0
                                                                               : 0.01;
    o.epochs = 2;
    runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
    const auto h = t.run();
    EXPECT_TRUE(std::isfinite(h[1].train_loss)) << plan::optimizer_name(k);
    EXPECT_LT(h[1].train_loss, h[0].train_loss) << plan::optimizer_name(k);
  }
}

TEST(Trainer, NanLossIsAClearError) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  o.lr = 1e30;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  try {
    t.run();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN or inf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step"), std::string::npos) << e.what();
  }
}

TEST(Trainer, ImageShapeThatDoesNotMatchTheModelIsAnError) {
  const std::string data = synthetic(64, 32, 32, 3, 10);
  try {
    runtime::Trainer t(bp::zoo_model("fmnist_cnn"), small_options(data));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(data), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("channels"), std::string::npos) << e.what();
  }
}

TEST(Trainer, ClassCountMismatchIsAnError) {
  const std::string data = synthetic(64, 32, 28, 1, 5);
  try {
    runtime::Trainer t(bp::zoo_model("fmnist_cnn"), small_options(data));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("classes"), std::string::npos) << e.what();
  }
}

TEST(Trainer, MissingDatasetNamesTheFile) {
  auto o = small_options("/nonexistent/dir/data.h5");
  EXPECT_THROW(
      {
        try {
          runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/data.h5"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace

namespace {
TEST(Trainer, AmpOverflowSkipsTheStepAndHalvesTheScaleOnTheCpu) {
  const std::string data = synthetic(300, 100);
  auto o = small_options(data);
  o.amp = true;
  o.loss_scale = 1e30;  // FP16 gradients overflow at once
  o.max_steps = 1;
  o.validate = false;
  runtime::Trainer t(bp::zoo_model("fmnist_cnn"), o);
  const auto before = t.tensor_values("cbr2.conv.w");
  const auto mean_before = t.tensor_values("cbr1.bn.running_mean"), var_before = t.tensor_values("cbr2.bn.running_var");
  const auto h = t.run();
  EXPECT_EQ(t.tensor_values("cbr2.conv.w"), before);  // the update was skipped
  // ... and so was the running statistics' blend (an FP16 forward overflow would otherwise write NaN into them).
  EXPECT_EQ(t.tensor_values("cbr1.bn.running_mean"), mean_before);
  EXPECT_EQ(t.tensor_values("cbr2.bn.running_var"), var_before);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_FLOAT_EQ(static_cast<float>(h[0].loss_scale), 5e29f);

  // The same step with a loss scale that does not overflow moves both.
  o.loss_scale = 1024;
  runtime::Trainer clean(bp::zoo_model("fmnist_cnn"), o);
  clean.run();
  EXPECT_NE(clean.tensor_values("cbr2.conv.w"), before);
  EXPECT_NE(clean.tensor_values("cbr1.bn.running_mean"), mean_before);
  EXPECT_NE(clean.tensor_values("cbr2.bn.running_var"), var_before);
}
}  // namespace

namespace {
TEST(Trainer, LabelOutsideTheModelsClassesNamesFileBatchAndSample) {
  // A file whose num_classes attribute says 4 while its labels go up to 9 (the writer refuses such labels, so the
  // attribute is lowered afterwards, as a damaged or hand-made file would be).
  const std::string data = temp_path("bad_labels.h5");
  io::make_synthetic(data, 300, 100, 28, 28, 1, 10, 123);
  io::testing::set_int_attr(data, "num_classes", 4);
  bp::ZooOptions z;
  z.num_classes = 4;
  auto o = small_options(data);
  o.shuffle = false;
  try {
    runtime::Trainer t(bp::zoo_model("fmnist_cnn", z), o);
    t.run();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(data), std::string::npos) << msg;
    EXPECT_NE(msg.find("outside [0, 4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sample"), std::string::npos) << msg;
  }
}
}  // namespace
