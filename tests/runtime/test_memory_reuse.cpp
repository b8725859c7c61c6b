// Liveness-based reuse of the activation pool (plan::TrainConfig::reuse_memory) changes where features and
// gradients live, never what is computed: training with reuse equals training without it bit for bit (weights,
// BN statistics, moments, metrics, validation), on a smaller arena.
#include "../io/io_test_util.h"

#include <renaissance/blueprint/zoo.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/trainer.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;

std::string synthetic(std::int64_t n_train, std::int64_t n_val, std::int64_t hw, std::int64_t c, int classes) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_reuse_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / fmt::format("syn_{}_{}_{}_{}_{}.h5", n_train, n_val, hw, c, classes)).string();
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n_train, n_val, hw, hw, c, classes, 321);
  return p;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Trains `m` twice, with and without reuse, and compares everything a run leaves behind.
void expect_same_training(const bp::BluePrint& m, runtime::TrainOptions o) {
  o.reuse_memory = true;
  runtime::Trainer reuse(m, o);
  o.reuse_memory = false;
  runtime::Trainer fixed(m, o);
  EXPECT_TRUE(reuse.plan().memory[0].reuses_memory());
  EXPECT_FALSE(fixed.plan().memory[0].reuses_memory());
  EXPECT_LT(reuse.plan().arena_bytes(), fixed.plan().arena_bytes());
  const auto ha = reuse.run(), hb = fixed.run();
  ASSERT_EQ(ha.size(), hb.size());
  for (std::size_t e = 0; e < ha.size(); ++e) {
    EXPECT_EQ(ha[e].train_loss, hb[e].train_loss) << "epoch " << e + 1;
    EXPECT_EQ(ha[e].train_top1, hb[e].train_top1);
    EXPECT_EQ(ha[e].val_loss, hb[e].val_loss);
    EXPECT_EQ(ha[e].val_top1, hb[e].val_top1);
    EXPECT_EQ(ha[e].ema_val_top1, hb[e].ema_val_top1);
  }
  const auto wa = reuse.state_values(), wb = fixed.state_values();
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(bit_equal(wa, wb));
  // and the run trained something, so the comparison means something
  runtime::Trainer fresh(m, o);
  EXPECT_FALSE(bit_equal(wa, fresh.state_values()));
}

runtime::TrainOptions options(const std::string& data) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.epochs = 1;
  o.batch = 32;
  o.lr = 0.01;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.seed = 11;
  o.augmentation.crop_padding = 2;
  o.augmentation.horizontal_flip = true;
  return o;
}

}  // namespace

TEST(MemoryReuse, FusedAmpResidualTrainingIsBitIdenticalWithoutReuse) {
  // Every fused kind (their tensors share bytes part by part), AMP, EMA validation, a last partial batch.
  bp::BluePrint m;
  m.name = "tiny_res";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::maxpool(2, 1, 0), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2), bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 1),
                   bp::block(16, 64, bp::BlockKind::RESNET_1_3_1, 2),
                   bp::block(128, 64, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(128, 48, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  auto o = options(synthetic(100, 40, 16, 3, 10));
  o.amp = true;
  o.ema = true;
  o.optimizer = plan::OptimizerKind::ADAMW;
  expect_same_training(m, o);
}

TEST(MemoryReuse, Fp32TrainingIsBitIdenticalWithoutReuse) {
  auto o = options(synthetic(100, 40, 28, 1, 10));
  o.optimizer = plan::OptimizerKind::NESTEROV;
  expect_same_training(bp::zoo_model("fmnist_cnn"), o);
  bp::BluePrint m = bp::zoo_model("resnet18_cifar");
  m.in_h = m.in_w = 16;
  auto r = options(synthetic(64, 32, 16, 3, 10));
  r.max_steps = 2;
  expect_same_training(m, r);
}
