// Checkpoints (issue 6, DESIGN §10): the file format and its validation, the checkpoint directory (latest.h5,
// --keep, fall-back past broken files), and exact resume through the Trainer API: k steps + checkpoint + a fresh
// Trainer loading it + k steps gives the per-step losses and the final state of 2k uninterrupted steps, bit for bit.
#include "../io/io_test_util.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/devices.h>
#include <renaissance/runtime/trainer.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;
namespace fs = std::filesystem;
using io::testing::TempDir;

std::string synthetic(const TempDir& dir, std::int64_t n_train = 300, std::int64_t hw = 28, std::int64_t c = 1) {
  const std::string p = dir.file(fmt::format("syn_{}_{}_{}.h5", n_train, hw, c));
  if (!fs::exists(p)) io::make_synthetic(p, n_train, 100, hw, hw, c, 10, 123);
  return p;
}

runtime::TrainOptions options(const std::string& data) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.epochs = 2;
  o.batch = 32;  // 300 samples: 9 full batches and one of 12 per epoch
  o.lr = 0.01;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.optimizer = plan::OptimizerKind::NESTEROV;
  o.seed = 11;
  o.augmentation.crop_padding = 2;
  o.augmentation.horizontal_flip = true;
  return o;
}

/// fmnist_cnn trained `steps` steps under `o`, without validation; its checkpoint written as dir.file(name).
std::string checkpoint_after(const TempDir& dir, runtime::TrainOptions o, std::int64_t steps, const std::string& name) {
  o.max_steps = steps;
  o.validate = false;
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), o);
  a.run();
  const std::string p = dir.file(name);
  a.save_checkpoint(p);
  return p;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected renaissance::Error, nothing was thrown";
  return {};
}

/// Every tensor a checkpoint holds, by group and name, as the trainer's arena has them.
std::vector<std::vector<float>> checkpointed_values(const runtime::Trainer& t, bool ema, bool momentum) {
  std::vector<std::vector<float>> out{t.state_values()};
  for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors()) {
    const RegionFamily f = region_family(d.region);
    if ((ema && f == RegionFamily::E && d.dtype == DType::F32) ||
        (momentum && (f == RegionFamily::M || f == RegionFamily::V)))
      out.push_back(t.tensor_values(d.name));
  }
  return out;
}

struct Recorded {
  std::vector<double> losses;  // per step
  std::vector<runtime::EpochMetrics> epochs;
};

runtime::TrainObserver recorder(Recorded& r) {
  runtime::TrainObserver obs;
  obs.on_step_loss = [&r](std::int64_t step, std::int64_t, double loss) {
    EXPECT_EQ(step, static_cast<std::int64_t>(r.losses.size()) + 1);  // a resumed run continues the numbering
    r.losses.push_back(loss);
  };
  obs.on_epoch = [&r](const runtime::EpochMetrics& m) { r.epochs.push_back(m); };
  return obs;
}

io::Checkpoint small_checkpoint() {
  io::Checkpoint ck;
  ck.state.step = 42;
  ck.state.epoch = 3;
  ck.state.position = 5;
  ck.state.samples_done = 160;
  ck.state.batch = 32;
  ck.state.seed = 0xfedcba9876543210ull;
  ck.state.optimizer = "adam";
  ck.state.model = "tiny";
  ck.state.model_yaml = "name: tiny\n";
  ck.state.run_config = "lr: 0.1\n";
  ck.state.plan_hash = "0123456789abcdef";
  ck.state.loss_scale = {1024.0f, 17.0f, 2000.0f, 2.0f};
  ck.state.train_metrics = {12.5f, 100.0f, 150.0f, 160.0f};
  for (const char* g : {"params", "bn", "optimizer", "ema"}) {
    io::NamedTensor t;
    t.group = g;
    t.name = "conv1.w";
    t.shape = Shape{8, 3, 3, 4};
    for (std::int64_t i = 0; i < t.shape.elems(); ++i) t.values.push_back(0.25f * static_cast<float>(i) + 1.0f);
    ck.tensors.push_back(t);
  }
  return ck;
}

// ---- the file --------------------------------------------------------------------------------------------------

TEST(CheckpointFile, RoundTripsEveryTensorAndTheState) {
  TempDir dir;
  const std::string p = dir.file("c.h5");
  const io::Checkpoint ck = small_checkpoint();
  io::write_checkpoint(p, ck);
  const io::Checkpoint back = io::read_checkpoint(p);
  EXPECT_EQ(back.state.step, 42);
  EXPECT_EQ(back.state.epoch, 3);
  EXPECT_EQ(back.state.position, 5);
  EXPECT_EQ(back.state.samples_done, 160);
  EXPECT_EQ(back.state.seed, 0xfedcba9876543210ull);
  EXPECT_EQ(back.state.optimizer, "adam");
  EXPECT_EQ(back.state.model_yaml, "name: tiny\n");
  EXPECT_FALSE(back.state.created.empty());
  EXPECT_TRUE(bit_equal(back.state.loss_scale, ck.state.loss_scale));
  EXPECT_TRUE(bit_equal(back.state.train_metrics, ck.state.train_metrics));
  ASSERT_EQ(back.tensors.size(), 4u);
  for (const io::NamedTensor& t : ck.tensors) {
    const io::NamedTensor* b = back.find(t.group, t.name);
    ASSERT_NE(b, nullptr) << t.group;
    EXPECT_EQ(b->shape, t.shape);
    EXPECT_TRUE(bit_equal(b->values, t.values)) << t.group;
  }
  const io::CheckpointReport r = io::inspect_checkpoint(p);
  EXPECT_TRUE(r.valid) << r.error;
  EXPECT_EQ(r.attributes.at("step"), "42");
  EXPECT_EQ(r.attributes.at("format"), "renaissance-checkpoint");
  EXPECT_EQ(r.tensors.size(), 6u);  // 4 tensors + /state/loss_scale, /state/train_metrics
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// The partial epoch's loss sum may be infinite (an AMP step whose logits overflowed FP16 adds an infinite loss; the
// step is skipped and the weights stay finite): such a checkpoint reads back, the sum with it. The other state values,
// a NaN among them, and the tensors stay refused.
TEST(CheckpointFile, AnInfiniteLossSumOfAnAmpEpochReadsBackTheRestMustBeFinite) {
  TempDir dir;
  io::Checkpoint ck = small_checkpoint();
  ck.state.train_metrics[0] = std::numeric_limits<float>::infinity();
  io::write_checkpoint(dir.file("inf.h5"), ck);
  const io::Checkpoint back = io::read_checkpoint(dir.file("inf.h5"));
  EXPECT_TRUE(std::isinf(back.state.train_metrics[0]));
  io::Checkpoint bad = small_checkpoint();
  bad.state.train_metrics[1] = std::numeric_limits<float>::quiet_NaN();  // a top-1 sum
  io::write_checkpoint(dir.file("nan.h5"), bad);
  try {
    (void)io::read_checkpoint(dir.file("nan.h5"));
    ADD_FAILURE() << "read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/state/train_metrics: holds a non-finite value"), std::string::npos)
        << e.what();
  }
}

TEST(CheckpointFile, FlippedByteInATensorNamesTheFileAndTheTensor) {
  TempDir dir;
  const std::string p = dir.file("c.h5");
  io::write_checkpoint(p, small_checkpoint());
  io::testing::corrupt_chunk(p, "/optimizer/conv1.w", 0);
  const std::string msg = message_of([&] { io::read_checkpoint(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("/optimizer/conv1.w"), std::string::npos) << msg;
  EXPECT_NE(msg.find("content checksum"), std::string::npos) << msg;  // format 2: the header's entry for the tensor
  const io::CheckpointReport r = io::inspect_checkpoint(p);
  EXPECT_FALSE(r.valid);
  EXPECT_NE(r.error.find("/optimizer/conv1.w"), std::string::npos) << r.error;
  int bad = 0;
  for (const auto& e : r.tensors) bad += e.ok ? 0 : 1;
  EXPECT_EQ(bad, 1);
}

TEST(CheckpointFile, TruncationAndBrokenMetadataAreClearErrors) {
  TempDir dir;
  const std::string p = dir.file("c.h5");
  io::write_checkpoint(p, small_checkpoint());
  const std::string q = dir.file("meta.h5");
  fs::copy_file(p, q);
  io::testing::truncate_file(p, 0.6);
  const std::string msg = message_of([&] { io::read_checkpoint(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_FALSE(io::inspect_checkpoint(p).valid);
  // A flipped byte in the root object header (the attributes): its metadata checksum catches it.
  io::testing::flip_byte(q, 200);
  const std::string meta = message_of([&] { io::read_checkpoint(q); });
  EXPECT_NE(meta.find(q), std::string::npos) << meta;
  EXPECT_NE(meta.find("checksum"), std::string::npos) << meta;
}

TEST(CheckpointFile, MissingStateAndOtherFormatsAreRejected) {
  TempDir dir;
  const std::string p = dir.file("c.h5");
  io::write_checkpoint(p, small_checkpoint());
  io::testing::delete_attr(p, "epoch");
  {  // any edit of a format-2 file fails its header: the size or the whole-file checksum
    const std::string m = message_of([&] { io::read_checkpoint(p); });
    EXPECT_TRUE(m.find("checksum") != std::string::npos || m.find("but was written with") != std::string::npos) << m;
  }
  io::testing::reseal_checksum_header(p);  // an edit behind a valid header: the attribute checks still catch it
  EXPECT_NE(message_of([&] { io::read_checkpoint(p); }).find("'epoch' is missing"), std::string::npos);
  io::write_checkpoint(p, small_checkpoint());
  io::testing::set_int_attr(p, "version", 99);
  io::testing::reseal_checksum_header(p);
  EXPECT_NE(message_of([&] { io::read_checkpoint(p); }).find("version 99"), std::string::npos);
  io::write_checkpoint(p, small_checkpoint());
  io::testing::delete_link(p, "/ema/conv1.w");
  io::testing::reseal_checksum_header(p);
  EXPECT_NE(message_of([&] { io::read_checkpoint(p); }).find("3 tensors but was written with 4"), std::string::npos);
  const std::string w = dir.file("w.h5");
  io::write_weights(w, {small_checkpoint().tensors[0]}, {});
  EXPECT_NE(message_of([&] { io::read_checkpoint(w); }).find("it is a weights file (--save), not a checkpoint"),
            std::string::npos);
  EXPECT_NE(message_of([&] { io::read_checkpoint(dir.file("none.h5")); }).find("none.h5"), std::string::npos);
}

// ---- the directory ---------------------------------------------------------------------------------------------

TEST(CheckpointDir, LatestPointsAtTheNewestAndKeepPrunesTheOldest) {
  TempDir dir;
  const std::string d = dir.file("ck");
  io::Checkpoint ck = small_checkpoint();
  for (std::int64_t step : {10, 20, 30, 40}) {
    ck.state.step = step;
    EXPECT_EQ(io::save_checkpoint_in_dir(d, ck, 2), (fs::path(d) / io::checkpoint_file_name(step)).string());
  }
  EXPECT_FALSE(fs::exists(fs::path(d) / "ckpt-step00000010.h5"));
  EXPECT_FALSE(fs::exists(fs::path(d) / "ckpt-step00000020.h5"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000030.h5"));
  EXPECT_TRUE(fs::is_symlink(fs::path(d) / "latest.h5"));
  EXPECT_EQ(fs::read_symlink(fs::path(d) / "latest.h5").string(), "ckpt-step00000040.h5");
  EXPECT_EQ(io::read_checkpoint((fs::path(d) / "latest.h5").string()).state.step, 40);
  const std::string found = io::find_latest_checkpoint(d);
  EXPECT_EQ(fs::path(found).filename().string(), "ckpt-step00000040.h5");
  EXPECT_EQ(io::find_latest_checkpoint(dir.file("nothing-here")), "");
}

TEST(CheckpointDir, ABrokenNewestFallsBackToTheNewestValidOne) {
  TempDir dir;
  const std::string d = dir.file("ck");
  io::Checkpoint ck = small_checkpoint();
  for (std::int64_t step : {10, 20, 30}) {
    ck.state.step = step;
    io::save_checkpoint_in_dir(d, ck, 3);
  }
  // A half-written temporary file (a writer killed mid-write) is never a candidate.
  std::ofstream(fs::path(d) / "ckpt-step00000040.h5.tmp-12345") << "partial";
  io::testing::corrupt_chunk((fs::path(d) / "ckpt-step00000030.h5").string(), "/params/conv1.w", 0);
  std::vector<std::string> warnings;
  const std::string found = io::find_latest_checkpoint(d, [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_EQ(fs::path(found).filename().string(), "ckpt-step00000020.h5");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ckpt-step00000030.h5"), std::string::npos) << warnings[0];
  // latest.h5 dangling (its target deleted): the newest valid file still wins.
  fs::remove(fs::path(d) / "ckpt-step00000030.h5");
  EXPECT_EQ(fs::path(io::find_latest_checkpoint(d)).filename().string(), "ckpt-step00000020.h5");
  // The next save replaces the dangling link and clears the stale temporary file.
  ck.state.step = 50;
  io::save_checkpoint_in_dir(d, ck, 3);
  EXPECT_FALSE(fs::exists(fs::path(d) / "ckpt-step00000040.h5.tmp-12345"));
  EXPECT_EQ(fs::path(io::find_latest_checkpoint(d)).filename().string(), "ckpt-step00000050.h5");
}

// A resume past a damaged newest checkpoint, then the next save under --keep 2: the rotation kept the newest files by
// step, so it deleted the valid step 10 and kept the damaged step 20 (a second damaged file then left nothing to
// resume from). A file the resume search found invalid is not counted, and goes once --keep valid ones are newer.
TEST(CheckpointDir, TheRotationNeverKeepsAFileFoundInvalidInsteadOfAValidOne) {
  TempDir dir;
  const std::string d = dir.file("ck");
  io::Checkpoint ck = small_checkpoint();
  for (std::int64_t step : {10, 20}) {
    ck.state.step = step;
    io::save_checkpoint_in_dir(d, ck, 2);
  }
  io::testing::corrupt_chunk((fs::path(d) / "ckpt-step00000020.h5").string(), "/params/conv1.w", 0);
  std::vector<std::string> warnings;
  // Through a relative path too (latest.h5's target was compared canonical against the listing's relative names).
  const std::string rel = fs::relative(d).string();
  ASSERT_TRUE(fs::path(rel).is_relative()) << rel;
  const std::string found = io::find_latest_checkpoint(rel, [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_EQ(fs::path(found).filename().string(), "ckpt-step00000010.h5");
  ASSERT_EQ(warnings.size(), 1u) << "latest.h5's target is read once, not again by its own name";
  ck.state.step = 15;  // the resumed run's next checkpoint
  io::save_checkpoint_in_dir(d, ck, 2);
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000015.h5"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000010.h5")) << "a valid checkpoint was pruned for an invalid one";
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000020.h5")) << "newer than the kept ones: left for now";
  ck.state.step = 18;
  io::save_checkpoint_in_dir(d, ck, 2);  // two valid ones newer than 10 and older than 20
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000018.h5"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000015.h5"));
  EXPECT_FALSE(fs::exists(fs::path(d) / "ckpt-step00000010.h5"));
  ck.state.step = 20;  // the step written again: valid now, and counted
  io::save_checkpoint_in_dir(d, ck, 2);
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000020.h5"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "ckpt-step00000018.h5"));
  EXPECT_FALSE(fs::exists(fs::path(d) / "ckpt-step00000015.h5"));
  EXPECT_EQ(fs::path(io::find_latest_checkpoint(d)).filename().string(), "ckpt-step00000020.h5");
}

TEST(CheckpointDir, AStepNameTooLargeForItsTypeIsNotOneOfOurs) {
  // A stray ckpt-step<23 digits>.h5 ended --resume auto and rotation with "error: stoll" (std::out_of_range).
  TempDir dir;
  const std::string d = dir.file("ck");
  io::Checkpoint ck = small_checkpoint();
  ck.state.step = 10;
  io::save_checkpoint_in_dir(d, ck, 1);
  const fs::path stray = fs::path(d) / "ckpt-step99999999999999999999999.h5";
  std::ofstream(stray) << "not ours";
  EXPECT_EQ(fs::path(io::find_latest_checkpoint(d)).filename().string(), "ckpt-step00000010.h5");
  ck.state.step = 20;
  io::save_checkpoint_in_dir(d, ck, 1);  // keep 1: prunes step 10, leaves the stray file alone
  EXPECT_FALSE(fs::exists(fs::path(d) / "ckpt-step00000010.h5"));
  EXPECT_TRUE(fs::exists(stray));
  EXPECT_EQ(fs::path(io::find_latest_checkpoint(d)).filename().string(), "ckpt-step00000020.h5");
}

// ---- exact resume through the Trainer ------------------------------------------------------------------------------

TEST(CheckpointResume, MidEpochResumeIsBitIdenticalToAnUninterruptedRun) {
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.ema = true;
  o.max_steps = 14;  // 2k = 14: epoch 1 (10 steps) and 4 of epoch 2
  Recorded full;
  runtime::Trainer ref(bp::zoo_model("fmnist_cnn"), o);
  ref.run(recorder(full));
  ASSERT_EQ(full.losses.size(), 14u);

  // k = 7 steps (mid epoch 1), checkpoint, a fresh Trainer resumes and trains the other 7.
  o.max_steps = 7;
  o.checkpoint_dir = dir.file("ck");
  o.checkpoint_every = 3;
  Recorded part;
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), o);
  a.run(recorder(part));
  ASSERT_EQ(part.losses.size(), 7u);
  ASSERT_EQ(fs::path(a.last_checkpoint()).filename().string(), "ckpt-step00000007.h5");
  const io::Checkpoint ck = io::read_checkpoint(a.last_checkpoint());
  EXPECT_EQ(ck.state.step, 7);
  EXPECT_EQ(ck.state.epoch, 0);
  EXPECT_EQ(ck.state.position, 7);
  EXPECT_GT(ck.state.train_metrics[3], 0.0f);  // the partial epoch's samples
  EXPECT_NE(ck.find("optimizer", "cbr1.conv.w.m"), nullptr);
  EXPECT_NE(ck.find("ema", "cbr1.conv.w"), nullptr);

  o.max_steps = 14;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o);
  EXPECT_TRUE(b.load_checkpoint(io::find_latest_checkpoint(o.checkpoint_dir)).empty());
  EXPECT_EQ(b.steps(), 7);
  b.run(recorder(part));
  ASSERT_EQ(part.losses.size(), 14u);
  for (std::size_t i = 0; i < 14; ++i) EXPECT_EQ(part.losses[i], full.losses[i]) << "step " << i + 1;
  const auto want = checkpointed_values(ref, true, true), got = checkpointed_values(b, true, true);
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(bit_equal(want[i], got[i])) << "tensor group " << i;
  // The epoch the interruption fell into reports the same metrics as the uninterrupted run.
  ASSERT_EQ(full.epochs.size(), 2u);
  ASSERT_EQ(part.epochs.size(), 3u);  // the first run reported its partial epoch 1 when it stopped
  for (int e = 0; e < 2; ++e) {
    EXPECT_EQ(part.epochs[static_cast<std::size_t>(e) + 1].train_loss,
              full.epochs[static_cast<std::size_t>(e)].train_loss);
    EXPECT_EQ(part.epochs[static_cast<std::size_t>(e) + 1].val_loss, full.epochs[static_cast<std::size_t>(e)].val_loss);
    EXPECT_EQ(part.epochs[static_cast<std::size_t>(e) + 1].ema_val_top1,
              full.epochs[static_cast<std::size_t>(e)].ema_val_top1);
  }
}

TEST(CheckpointResume, PreemptionFlagWritesACheckpointAndTheResumedRunContinuesTheSameCurve) {
  // The default one-cycle schedule (a function of the step over the whole run), Adam, AMP's dynamic loss scale.
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.schedule = runtime::ScheduleKind::ONE_CYCLE;
  o.optimizer = plan::OptimizerKind::ADAM;
  o.amp = true;
  o.lr = 0.003;
  o.validate = false;
  Recorded full;
  runtime::Trainer ref(bp::zoo_model("fmnist_cnn"), o);
  ref.run(recorder(full));
  ASSERT_EQ(full.losses.size(), 20u);

  std::atomic<int> stop{0};
  o.stop_request = &stop;
  o.checkpoint_dir = dir.file("ck");
  Recorded part;
  runtime::TrainObserver obs = recorder(part);
  auto record = obs.on_step_loss;
  obs.on_step_loss = [&](std::int64_t step, std::int64_t epoch, double loss) {
    record(step, epoch, loss);
    if (step == 13) stop = 10;  // "SIGUSR1" arrives during step 13
  };
  std::vector<std::string> written;
  obs.on_checkpoint = [&](const std::string& p, std::int64_t) { written.push_back(p); };
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), o);
  a.run(obs);
  EXPECT_TRUE(a.preempted());
  EXPECT_EQ(a.steps(), 13);
  ASSERT_EQ(written.size(), 1u);  // no periodic checkpoints asked for: the preemption's alone
  EXPECT_EQ(fs::path(written.back()).filename().string(), "ckpt-step00000013.h5");

  stop = 0;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o);
  EXPECT_TRUE(b.load_checkpoint(io::find_latest_checkpoint(o.checkpoint_dir)).empty());
  b.run(recorder(part));
  EXPECT_FALSE(b.preempted());
  ASSERT_EQ(part.losses.size(), 20u);
  for (std::size_t i = 0; i < 20; ++i) EXPECT_EQ(part.losses[i], full.losses[i]) << "step " << i + 1;
  EXPECT_TRUE(bit_equal(b.state_values(), ref.state_values()));
  EXPECT_EQ(part.epochs.back().loss_scale, full.epochs.back().loss_scale);
  EXPECT_EQ(part.epochs.back().train_loss, full.epochs.back().train_loss);
}

// ---- portability ---------------------------------------------------------------------------------------------------

TEST(CheckpointPortability, AnotherBatchSizeAmpSettingOrWorldSizeLoadsWithAWarning) {
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.max_steps = 5;
  o.validate = false;
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), o);
  a.run();
  const std::string p = dir.file("a.h5");
  a.save_checkpoint(p);

  auto o2 = o;
  o2.batch = 64;
  o2.max_steps = 8;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o2);
  const auto w = b.load_checkpoint(p);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("batch 32"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("batch 64"), std::string::npos) << w[0];
  for (const char* t : {"cbr1.conv.w", "fc1.w", "cbr1.bn.running_mean", "cbr2.conv.w.m"})
    EXPECT_TRUE(bit_equal(b.tensor_values(t), a.tensor_values(t))) << t;
  EXPECT_EQ(b.steps(), 5);
  b.run();  // trains on: 160 samples done → batch 2 of 5 at batch 64 (128 samples), 3 more steps
  EXPECT_EQ(b.steps(), 8);

  auto o3 = o;
  o3.amp = true;  // the first conv's input channels are padded to 8 under AMP
  runtime::Trainer c(bp::zoo_model("fmnist_cnn"), o3);
  const auto wc = c.load_checkpoint(p);
  ASSERT_EQ(wc.size(), 1u);  // AMP differs (FP32 and AMP plans fuse the same layers: the same names)
  EXPECT_NE(wc[0].find("AMP"), std::string::npos) << wc[0];
  const std::string first_conv = "cbr1.conv.w";
  const auto src = a.tensor_values(first_conv), padded = c.tensor_values(first_conv);
  ASSERT_EQ(padded.size(), src.size() * 8);  // [32,3,3,1] → [32,3,3,8]
  for (std::size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(padded[i * 8], src[i]);
    for (int k = 1; k < 8; ++k) EXPECT_EQ(padded[i * 8 + k], 0.0f);
  }
  c.run();
  // ... and back: an AMP checkpoint into an FP32 run drops the padding.
  const std::string pc = dir.file("c.h5");
  c.save_checkpoint(pc);
  runtime::Trainer d(bp::zoo_model("fmnist_cnn"), o);
  EXPECT_EQ(d.load_checkpoint(pc).size(), 1u);
  const auto cw = c.tensor_values(first_conv), dw = d.tensor_values(first_conv);
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(dw[i], cw[i * 8]);

  // As if written by 2 ranks (each rank's partial-epoch sums in its row): loads with a warning, and the metric
  // sums of both rows go to the one rank.
  io::Checkpoint two = io::read_checkpoint(p);
  two.state.world_size = 2;
  two.state.train_metrics.resize(8, 1.0f);
  const std::string p2 = dir.file("two.h5");
  io::write_checkpoint(p2, two);
  io::testing::set_int_attr(p, "world_size", 2);  // ... and a file whose rows do not match its world size
  io::testing::reseal_checksum_header(p);
  EXPECT_NE(message_of([&] { io::read_checkpoint(p); }).find("/state/train_metrics"), std::string::npos);
  runtime::Trainer e(bp::zoo_model("fmnist_cnn"), o);
  const auto we = e.load_checkpoint(p2);
  ASSERT_EQ(we.size(), 1u);
  EXPECT_NE(we[0].find("2 rank"), std::string::npos) << we[0];
}

TEST(CheckpointPortability, WeightsFilesLoadAcrossAmpSettingsLikeCheckpoints) {
  // `train --amp --save w.h5` then `eval --weights w.h5` (FP32) failed: "cbr1.conv.w has shape 32x3x3x8 but the
  // model needs 32x3x3x1" (AMP pads the first conv's input channels to 8), and FP32 weights in an AMP eval the other
  // way round. Weights files now load as checkpoints do: the padding cut or added, the rest as written.
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.max_steps = 3;
  o.validate = false;
  auto oa = o;
  oa.amp = true;
  runtime::Trainer amp(bp::zoo_model("fmnist_cnn"), oa), fp32(bp::zoo_model("fmnist_cnn"), o);
  amp.run();
  fp32.run();
  const std::string wa = dir.file("amp.h5"), wf = dir.file("fp32.h5");
  amp.save_weights(wa);
  fp32.save_weights(wf);
  const std::string first_conv = "cbr1.conv.w";
  runtime::Trainer into_fp32(bp::zoo_model("fmnist_cnn"), o), into_amp(bp::zoo_model("fmnist_cnn"), oa);
  into_fp32.load_weights(wa);
  into_amp.load_weights(wf);
  const auto padded = amp.tensor_values(first_conv), cut = into_fp32.tensor_values(first_conv);
  ASSERT_EQ(padded.size(), cut.size() * 8);
  for (std::size_t i = 0; i < cut.size(); ++i) EXPECT_EQ(cut[i], padded[i * 8]) << i;
  const auto plain = fp32.tensor_values(first_conv), grown = into_amp.tensor_values(first_conv);
  ASSERT_EQ(grown.size(), plain.size() * 8);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(grown[i * 8], plain[i]);
    for (int k = 1; k < 8; ++k) EXPECT_EQ(grown[i * 8 + k], 0.0f);
  }
  for (const char* t : {"fc1.w", "cbr2.conv.w", "cbr1.bn.running_var"}) {
    EXPECT_TRUE(bit_equal(into_fp32.tensor_values(t), amp.tensor_values(t))) << t;
    EXPECT_TRUE(bit_equal(into_amp.tensor_values(t), fp32.tensor_values(t))) << t;
  }
  // The same FP32 logits as from the AMP run's checkpoint (its path has matched across AMP settings all along).
  const std::string ck = dir.file("amp-ck.h5");
  amp.save_checkpoint(ck);
  runtime::Trainer via_ck(bp::zoo_model("fmnist_cnn"), o);
  via_ck.load_checkpoint(ck, /*weights_only=*/true);
  EXPECT_TRUE(bit_equal(into_fp32.logits(io::Split::val, 0, 64), via_ck.logits(io::Split::val, 0, 64)));
}

TEST(CheckpointPortability, ALargerBatchAfterManyStepsStillTrainsTheRestOfTheRun) {
  // 20 steps of batch 8 (160 samples, epoch 1 of 2 at batch 64 has 5 batches): resumed with batch 64 the run ended at
  // once, "done" after 0 steps, because its step count (20) was past the new run's 10. Now epoch 1 continues at its
  // third batch (sample 128) and epoch 2 follows: 3 + 5 more steps, the optimizer's count going on from 20.
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.batch = 8;
  const std::string p = checkpoint_after(dir, o, 20, "a.h5");
  auto o2 = options(data);
  o2.batch = 64;
  o2.validate = false;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o2);
  ASSERT_EQ(b.load_checkpoint(p).size(), 1u);  // the batch warning
  const std::vector<runtime::EpochMetrics> h = b.run();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].train_samples, 300 - 128);  // batches 3..5 of epoch 1 (the last one partial)
  EXPECT_EQ(h[1].train_samples, 300);
  EXPECT_EQ(b.steps(), 20 + 3 + 5);
}

// The checkpoint records --deterministic (in its run config); resuming with the other setting warns, like seed and
// batch do.
// Found by a hunt: a checkpoint 5 batches into an epoch, resumed on a dataset whose epoch has 2 batches, had no
// batches left in that epoch; the run then ended a batch early and cut a later epoch short, with only the warning
// about another dataset. Refused, naming the places, and nothing is loaded.
TEST(CheckpointPortability, APlaceInTheEpochPastAShorterEpochIsAnError) {
  TempDir dir;
  const std::string p = checkpoint_after(dir, options(synthetic(dir)), 5, "a.h5");
  auto small = options(synthetic(dir, 50));  // 2 batches of 32 per epoch
  small.validate = false;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), small);
  const auto before = b.state_values();
  const std::string msg = message_of([&] { b.load_checkpoint(p); });
  EXPECT_NE(msg.find("written 5 batch(es) into epoch 1, but an epoch of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has 2 batch(es) at --batch 32"), std::string::npos) << msg;
  EXPECT_TRUE(bit_equal(b.state_values(), before));
  EXPECT_EQ(b.steps(), 0);
}

TEST(CheckpointPortability, AnotherDeterminismSettingLoadsWithAWarning) {
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.max_steps = 2;
  o.validate = false;
  const std::string p = checkpoint_after(dir, o, 2, "det.h5");
  EXPECT_NE(io::read_checkpoint(p).state.run_config.find("deterministic: true"), std::string::npos);
  auto o2 = o;
  o2.deterministic = false;
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o2);
  const auto w = b.load_checkpoint(p);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("--deterministic on"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("--deterministic off"), std::string::npos) << w[0];
  runtime::Trainer c(bp::zoo_model("fmnist_cnn"), o);
  EXPECT_TRUE(c.load_checkpoint(p).empty()) << "the same setting: no warning";
  // A run_config that records none of the options (edited, or another writer's): nothing could be compared, and
  // nothing said so.
  io::Checkpoint ck = io::read_checkpoint(p);
  ck.state.run_config = "note: written by hand\n";
  const std::string bare = (dir.path() / "bare.h5").string();
  io::write_checkpoint(bare, ck);
  runtime::Trainer d(bp::zoo_model("fmnist_cnn"), o2);
  const auto wb = d.load_checkpoint(bare);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_NE(wb[0].find("records no --lr or --epochs"), std::string::npos) << wb[0];
}

// What a resume changed without a word: another network whose tensors have the same names and shapes (a pool's
// window), the EMA of an --ema checkpoint dropped by a run without --ema, the CPU's Winograd convolutions switched;
// and what it said though nothing changed: --warmup-epochs under a onecycle schedule, which does not use it, and a
// --data path with a newline (its recorded line broke: "--data changed"). --sync-bn on one rank changes nothing.
TEST(CheckpointPortability, AnotherNetworkEmaOrWinogradSettingLoadsWithAWarning) {
  TempDir dir;
  fs::create_directories(dir.path() / "odd\n\"dir");
  const std::string data = (dir.path() / "odd\n\"dir" / "syn.h5").string();
  fs::copy_file(synthetic(dir), data);
  auto o = options(data);
  o.ema = true;
  o.schedule = runtime::ScheduleKind::ONE_CYCLE;
  o.max_steps = 2;
  o.validate = false;
  const std::string p = checkpoint_after(dir, o, 2, "ema.h5");
  const auto load = [&](const bp::BluePrint& m, const runtime::TrainOptions& oo) {
    runtime::Trainer t(m, oo);
    return t.load_checkpoint(p);
  };
  const bp::BluePrint model = bp::zoo_model("fmnist_cnn");
  EXPECT_TRUE(load(model, o).empty()) << load(model, o).front();
  auto same = o;
  same.warmup_epochs = 3;  // onecycle has no warm-up
  same.sync_bn = true;     // one rank: its own statistics are every rank's
  EXPECT_TRUE(load(model, same).empty()) << load(model, same).front();

  auto no_ema = o;
  no_ema.ema = false;
  const auto w = load(model, no_ema);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("the checkpoint's EMA weights are dropped"), std::string::npos) << w[0];

  // fmnist_cnn with a 3x3 window in its first pool: every tensor the same, another network.
  std::string yaml = bp::blueprint_to_yaml(model);
  const std::string pool = "maxpool: {k: 2, stride: 2, pad: 0}";
  ASSERT_NE(yaml.find(pool), std::string::npos) << yaml;
  yaml.replace(yaml.find(pool), pool.size(), "maxpool: {k: 3, stride: 2, pad: 1}");
  const auto wa = load(bp::blueprint_from_yaml(yaml), o);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_NE(wa[0].find("written for model 'fmnist_cnn', resumed with model 'fmnist_cnn' whose layers differ"),
            std::string::npos)
      << wa[0];

  if (io::read_checkpoint(p).state.run_config.find("cpu-winograd: on") != std::string::npos) {
    runtime::set_cpu_winograd(false);
    const auto ww = load(model, o);
    runtime::set_cpu_winograd(true);
    ASSERT_EQ(ww.size(), 1u);
    EXPECT_NE(ww[0].find("written with the CPU's Winograd convolutions on, resumed with them off"), std::string::npos)
        << ww[0];
  } else {
    std::printf("note: this CPU has no Winograd convolutions: their setting's warning is not shown here\n");
  }
}

// Checkpoints written before FP32 plans fused Conv+BN+ReLU name those tensors after the plain layers (conv1.w,
// bn2d1.gamma for cbr1.conv.w, cbr1.bn.gamma): the same model resumes from them by position, with a warning, bit for
// bit.
TEST(CheckpointPortability, PlainLayerNamesOfAnOlderFp32FileLoadByPosition) {
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.max_steps = 3;
  o.validate = false;
  const std::string p = checkpoint_after(dir, o, 3, "new.h5");
  io::Checkpoint old = io::read_checkpoint(p);
  int renamed = 0;
  for (io::NamedTensor& t : old.tensors) {
    // cbrK.conv.<leaf> -> convK.<leaf>, cbrK.bn.<leaf> -> bn2dK.<leaf> (the plain plan's names)
    for (const auto& [from, to] : {std::pair<std::string, std::string>{".conv.", ""}, {".bn.", "bn2d"}}) {
      const auto at = t.name.find(from);
      if (t.name.rfind("cbr", 0) != 0 || at == std::string::npos) continue;
      const std::string k = t.name.substr(3, at - 3), leaf = t.name.substr(at + from.size());
      t.name = (to.empty() ? "conv" : to) + k + "." + leaf;
      ++renamed;
    }
  }
  ASSERT_GT(renamed, 0);
  ASSERT_NE(old.find("params", "conv1.w"), nullptr);
  const std::string legacy = dir.file("legacy.h5");
  io::write_checkpoint(legacy, old);
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o);
  const auto w = b.load_checkpoint(legacy);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("matched by position"), std::string::npos) << w[0];
  const io::Checkpoint ck = io::read_checkpoint(p);
  for (const io::NamedTensor& t : ck.tensors)
    if (t.group == "params" || t.group == "bn") {
      EXPECT_TRUE(bit_equal(b.tensor_values(t.name), t.values)) << t.name;
    }
  // Another model with plain names is still refused, naming the tensor.
  bp::BluePrint other = bp::zoo_model("fmnist_cnn");
  other.name = "other";
  runtime::Trainer c(other, o);
  const std::string msg = message_of([&] { c.load_checkpoint(legacy); });
  EXPECT_NE(msg.find("cbr1.conv.w"), std::string::npos) << msg;
}

TEST(CheckpointPortability, AnotherArchitectureFailsNamingTheFirstMismatchingTensor) {
  TempDir dir;
  const std::string data = synthetic(dir, 300, 16, 3);
  auto o = options(data);
  o.max_steps = 1;
  o.validate = false;
  bp::BluePrint m;
  m.name = "narrow";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(8, 3, 1, 1), bp::cbr(16, 3, 2, 1), bp::gap_fc(10), bp::softmax_ce(10));
  runtime::Trainer a(m, o);
  const std::string p = dir.file("narrow.h5");
  a.save_checkpoint(p);
  bp::BluePrint wide = m;
  wide.name = "wide";
  wide.root = bp::seq(bp::cbr(8, 3, 1, 1), bp::cbr(24, 3, 2, 1), bp::gap_fc(10), bp::softmax_ce(10));
  runtime::Trainer b(wide, o);
  const auto before = b.state_values();
  const std::string msg = message_of([&] { b.load_checkpoint(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("cbr2.conv.w"), std::string::npos) << msg;  // the first tensor whose shape differs
  EXPECT_NE(msg.find("24x3x3x8"), std::string::npos) << msg;
  EXPECT_TRUE(bit_equal(b.state_values(), before));  // a failed load changes nothing
  bp::BluePrint deeper = m;
  deeper.name = "deeper";
  deeper.root =
      bp::seq(bp::cbr(8, 3, 1, 1), bp::cbr(16, 3, 2, 1), bp::cbr(16, 3, 1, 1), bp::gap_fc(10), bp::softmax_ce(10));
  runtime::Trainer c(deeper, o);
  const std::string missing = message_of([&] { c.load_checkpoint(p); });
  EXPECT_NE(missing.find("is missing"), std::string::npos) << missing;
}

// A NaN or an infinity in a file (a diverged run; a damaged file of format 1, which has no checksums) makes the file
// invalid, naming the tensor and element, for a checkpoint and a weights file alike, so `--resume auto` falls back
// to the newest checkpoint without one; a state built by hand is refused by the Trainer before its start-up. An
// evaluation of NaN weights reported loss nan and top-1 1.0.
TEST(CheckpointPortability, NonFiniteValuesAreRefusedNamingTheTensor) {
  TempDir dir;
  const std::string data = synthetic(dir);
  auto o = options(data);
  o.max_steps = 2;
  o.validate = false;
  runtime::Trainer a(bp::zoo_model("fmnist_cnn"), o);
  a.run();
  const std::string ckdir = dir.file("ck"), w = dir.file("w.h5");
  a.save_checkpoint(dir.file("first.h5"));
  const std::string good = io::save_checkpoint_in_dir(ckdir, io::read_checkpoint(dir.file("first.h5")), 5);
  a.save_weights(w);
  // `w` with one value changed, written as a new weights file (checksums of its own).
  auto altered_weights = [&](const char* group, const char* name, std::size_t i, float v, const std::string& path) {
    io::WeightsFile wf = io::read_weights(w);
    for (io::NamedTensor& t : wf.tensors)
      if (t.group == group && t.name == name) t.values[i] = v;
    io::WeightsMeta meta;
    meta.strings["model"] = "fmnist_cnn";
    io::write_weights(path, wf.tensors, meta);
    return wf;
  };
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    io::Checkpoint c = io::read_checkpoint(good);
    c.state.step = 3;
    for (io::NamedTensor& t : c.tensors)
      if (t.group == "bn" && t.name == "cbr2.bn.running_var") t.values[5] = bad;
    const std::string newest = io::save_checkpoint_in_dir(ckdir, c, 5);  // latest.h5 points at it
    const std::string msg = message_of([&] { (void)io::read_checkpoint(newest); });
    EXPECT_NE(msg.find(newest), std::string::npos) << msg;
    EXPECT_NE(msg.find("/bn/cbr2.bn.running_var"), std::string::npos) << msg;
    EXPECT_NE(msg.find("non-finite value"), std::string::npos) << msg;
    EXPECT_NE(msg.find("element 5"), std::string::npos) << msg;
    EXPECT_EQ(io::find_latest_checkpoint(ckdir), good);  // --resume auto falls back past it
    const std::string bad_w = dir.file("bad-w.h5");
    const io::WeightsFile wf = altered_weights("params", "fc1.w", 0, bad, bad_w);
    const std::string wmsg = message_of([&] { (void)io::read_weights(bad_w); });
    EXPECT_NE(wmsg.find("/params/fc1.w"), std::string::npos) << wmsg;
    EXPECT_NE(wmsg.find("non-finite value"), std::string::npos) << wmsg;
    // A state built by hand: the Trainer refuses it before its start-up.
    const runtime::InitialState sw = runtime::InitialState::of_weights(wf, bad_w);
    const std::string tmsg = message_of([&] { runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o, &sw); });
    EXPECT_NE(tmsg.find("/params/fc1.w"), std::string::npos) << tmsg;
    EXPECT_NE(tmsg.find("non-finite"), std::string::npos) << tmsg;
  }
  // A negative running variance (NaN after the BN, zeros after its ReLU: a plausible-looking, meaningless score).
  {
    const std::string neg = dir.file("neg-var.h5");
    (void)altered_weights("bn", "cbr1.bn.running_var", 2, -0.5f, neg);
    const std::string msg = message_of([&] { (void)io::read_weights(neg); });
    EXPECT_NE(msg.find("/bn/cbr1.bn.running_var"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a running variance of -0.5 at element 2"), std::string::npos) << msg;
    // A checkpoint the same way: invalid, and `checkpoint inspect` lists that tensor as the bad one.
    io::Checkpoint c = io::read_checkpoint(good);
    for (io::NamedTensor& t : c.tensors)
      if (t.group == "bn" && t.name == "cbr1.bn.running_var") t.values[2] = -0.5f;
    const std::string neg_ck = dir.file("neg-var-ck.h5");
    io::write_checkpoint(neg_ck, c);
    const io::CheckpointReport r = io::inspect_checkpoint(neg_ck);
    EXPECT_FALSE(r.valid);
    EXPECT_NE(r.error.find("a running variance of -0.5"), std::string::npos) << r.error;
    for (const auto& e : r.tensors)
      EXPECT_EQ(e.ok, !(e.group == "bn" && e.name == "cbr1.bn.running_var")) << e.group << "/" << e.name;
  }
  // The good file starts a Trainer, with its weights.
  const runtime::InitialState st = runtime::InitialState::of_checkpoint(io::read_checkpoint(good), good);
  runtime::Trainer b(bp::zoo_model("fmnist_cnn"), o, &st);
  EXPECT_EQ(b.steps(), 2);
  EXPECT_TRUE(bit_equal(b.logits(io::Split::val, 0, 64), a.logits(io::Split::val, 0, 64)));
}

}  // namespace
