// LR schedules against hand-computed values and PyTorch's OneCycleLR formula; the data pipeline's order
// and augmentation are pure functions of (seed, epoch, sample).
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/schedule.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace {

using namespace renaissance::runtime;

/// A schedule of `kind` at `base_lr` over `total` steps.
Schedule schedule(ScheduleKind kind, double base_lr, std::int64_t total) {
  Schedule s;
  s.kind = kind;
  s.base_lr = base_lr;
  s.total_steps = total;
  return s;
}

TEST(Schedule, ConstantWithWarmup) {
  Schedule s = schedule(ScheduleKind::CONSTANT, 0.4, 100);
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(3), 0.4);
  EXPECT_DOUBLE_EQ(s.lr(50), 0.4);
}

TEST(Schedule, StepDecay) {
  Schedule s = schedule(ScheduleKind::STEP, 1.0, 100);
  s.step_size = 10;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(25), 0.25);
}

TEST(Schedule, CosineEndpoints) {
  const Schedule s = schedule(ScheduleKind::COSINE, 2.0, 101);
  EXPECT_DOUBLE_EQ(s.lr(0), 2.0);
  EXPECT_NEAR(s.lr(50), 1.0, 1e-12);  // half way: cos(π/2) = 0
}

TEST(Schedule, OneCycleMatchesPyTorchFormula) {
  // torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=100, pct_start=0.25) (cos annealing):
  // initial = 0.1/25 = 0.004, peak at step 24, final = 0.004/1e4.
  Schedule s = schedule(ScheduleKind::ONE_CYCLE, 0.1, 100);
  EXPECT_NEAR(s.lr(0), 0.004, 1e-12);
  EXPECT_NEAR(s.lr(24), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(99), 0.004 / 1e4, 1e-12);
  // step 12 of the rising phase: pct = 12/24 → mid-way between 0.004 and 0.1
  EXPECT_NEAR(s.lr(12), 0.052, 1e-12);
}

TEST(Schedule, OneCyclePctAndDivMatchPyTorch) {
  // --onecycle-pct 0.4 --onecycle-div 10. Reference values from PyTorch 1.13 (Debian's python3-torch):
  //   OneCycleLR(SGD(lr=0.1), max_lr=0.1, total_steps=100, pct_start=0.4, div_factor=10), the lr before each step.
  Schedule s = schedule(ScheduleKind::ONE_CYCLE, 0.1, 100);
  s.one_cycle_pct = 0.4;
  s.div_factor = 10.0;
  EXPECT_NEAR(s.lr(0), 0.009999999999999995, 1e-12);
  EXPECT_NEAR(s.lr(20), 0.05681196730492367, 1e-12);
  EXPECT_NEAR(s.lr(39), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(70), 0.047383728355830934, 1e-12);
  EXPECT_NEAR(s.lr(99), 1e-06, 1e-12);
}

TEST(Schedule, OneCycleMomentumMatchesPyTorch) {
  // --onecycle-pct 0.4 --onecycle-div 10 --onecycle-momentum 0.85,0.95. Reference values from PyTorch 1.13 (Debian's
  // python3-torch): OneCycleLR(SGD(lr=0.1, momentum=0.9, nesterov=True), max_lr=0.1, total_steps=100, pct_start=0.4,
  // div_factor=10, base_momentum=0.85, max_momentum=0.95), param_groups[0]["momentum"] before each step.
  Schedule s = schedule(ScheduleKind::ONE_CYCLE, 0.1, 100);
  s.one_cycle_pct = 0.4;
  s.div_factor = 10.0;
  s.momentum = 0.9;
  EXPECT_EQ(s.momentum_at(0), 0.9) << "not cycled: --momentum throughout";
  EXPECT_EQ(s.momentum_at(50), 0.9);
  s.cycle_momentum = true;
  EXPECT_NEAR(s.momentum_at(0), 0.95, 1e-12);
  EXPECT_NEAR(s.momentum_at(20), 0.8979867029945292, 1e-12);
  EXPECT_NEAR(s.momentum_at(39), 0.85, 1e-12);
  EXPECT_NEAR(s.momentum_at(70), 0.9026167978121472, 1e-12);
  EXPECT_NEAR(s.momentum_at(99), 0.95, 1e-12);
  // The rate is unchanged by it.
  EXPECT_NEAR(s.lr(20), 0.05681196730492367, 1e-12);
  s.kind = ScheduleKind::COSINE;
  EXPECT_EQ(s.momentum_at(20), 0.9) << "only onecycle cycles it";
}

TEST(DataPipeline, EpochOrderIsAPermutationKeyedBySeedAndEpoch) {
  const auto a = epoch_order(1, 0, 1000, true);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(a, epoch_order(1, 0, 1000, true));
  EXPECT_NE(a, epoch_order(1, 1, 1000, true));
  EXPECT_NE(a, epoch_order(2, 0, 1000, true));
  EXPECT_EQ(epoch_order(1, 0, 10, false), std::vector<std::int64_t>(iota.begin(), iota.begin() + 10));
}

TEST(DataPipeline, AugmentationDependsOnlyOnSeedEpochAndSample) {
  std::vector<std::uint8_t> img(8 * 8 * 3), a, b, c;
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<std::uint8_t>(i);
  std::vector<std::uint8_t> scratch;
  Augmentation aug{2, true};
  bool any_changed = false;
  for (std::int64_t sample = 0; sample < 16; ++sample) {
    a = img;
    b = img;
    augment_image(a.data(), 8, 8, 3, aug, 5, 1, sample, scratch);
    augment_image(b.data(), 8, 8, 3, aug, 5, 1, sample, scratch);
    EXPECT_EQ(a, b);
    any_changed |= a != img;
  }
  EXPECT_TRUE(any_changed);
}

TEST(DataPipeline, HorizontalFlipMirrorsColumns) {
  // With crop padding 0 and a flip drawn, out(y, x) = in(y, w-1-x); find a sample whose draw flips.
  std::vector<std::uint8_t> img(4 * 5), scratch;
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<std::uint8_t>(i);
  for (std::int64_t sample = 0; sample < 64; ++sample) {
    auto a = img;
    augment_image(a.data(), 4, 5, 1, Augmentation{0, true}, 9, 0, sample, scratch);
    if (a == img) continue;
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x) EXPECT_EQ(a[static_cast<std::size_t>(y * 5 + x)], img[static_cast<std::size_t>(y * 5 + 4 - x)]);
    return;
  }
  FAIL() << "no sample drew a flip in 64 tries";
}

TEST(DataPipeline, NormalizePadsChannelsWithZeros) {
  const std::uint8_t px[2] = {0, 255};
  const float mean[1] = {0.5f}, stddev[1] = {0.25f};
  float out[8];
  normalize_images(px, 1, 1, 2, 1, mean, stddev, reinterpret_cast<std::byte*>(out), renaissance::DType::F32, 4);
  EXPECT_FLOAT_EQ(out[0], -2.0f);
  EXPECT_FLOAT_EQ(out[4], 2.0f);
  for (int k : {1, 2, 3, 5, 6, 7}) EXPECT_EQ(out[k], 0.0f);
}

}  // namespace
