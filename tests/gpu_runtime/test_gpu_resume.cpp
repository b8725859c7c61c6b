// Exact resume on the GPU (issues 6 and 11): 2k steps uninterrupted vs k steps, checkpoint, a fresh Trainer resumes
// and trains k more → the per-step losses and every checkpointed tensor are bit-identical, at a realistic size
// (32×32, batch 128, every fused kind, side streams on). cuDNN engines are restricted to deterministic ones (the
// default) and chosen once per process, so a GPU run is repeatable and a resumed run is the same run.
#include "gpu_models.h"

#include <renaissance/blueprint/zoo.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;
namespace fs = std::filesystem;

fs::path work_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("rn_gpu_resume_{}_{}", ::getpid(), name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bp::BluePrint residual_model() { return test::realistic_residual_model(); }

struct Recorded {
  std::vector<double> losses;
  std::vector<float> state;  // masters + BN running statistics
  std::vector<std::vector<float>> extra;  // optimizer moments, EMA
};

runtime::TrainObserver recorder(Recorded& r) {
  runtime::TrainObserver obs;
  obs.on_step_loss = [&r](std::int64_t, std::int64_t, double loss) { r.losses.push_back(loss); };
  return obs;
}

void snapshot(const runtime::Trainer& t, Recorded& r) {
  r.state = t.state_values();
  for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors()) {
    const RegionFamily f = region_family(d.region);
    if ((f == RegionFamily::E && d.dtype == DType::F32) || f == RegionFamily::M || f == RegionFamily::V)
      r.extra.push_back(t.tensor_values(d.name));
  }
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GpuResume : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-test)";
  }
};

TEST_P(GpuResume, StopAndResumeIsBitIdenticalToAnUninterruptedRun) {
  const bool amp = GetParam();
  const fs::path dir = work_dir(amp ? "amp" : "fp32");
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 700, 64, 32, 32, 3, 10, 5);
  runtime::TrainOptions o;
  o.data_path = data;
  o.backend = runtime::Backend::CUDA;
  o.batch = 128;  // 700 samples: 5 full batches and one of 60 per epoch
  o.epochs = 2;
  o.lr = 0.02;
  o.schedule = runtime::ScheduleKind::ONE_CYCLE;
  o.optimizer = plan::OptimizerKind::ADAMW;
  o.weight_decay = 0.01;
  o.ema = true;
  o.amp = amp;
  o.seed = 17;
  o.augmentation.crop_padding = 2;
  o.concurrent_streams = true;
  o.max_steps = 12;  // 2k: epoch 1 (6 steps) and 6 of epoch 2
  Recorded full;
  runtime::Trainer ref(residual_model(), o);
  ref.run(recorder(full));
  ASSERT_EQ(full.losses.size(), 12u);
  snapshot(ref, full);

  // k = 4: a "SIGUSR1" during step 4 (the preemption path: the same command line, so the same schedule) stops
  // the run after a checkpoint; a fresh Trainer loads it and trains the other k steps.
  std::atomic<int> stop{0};
  o.stop_request = &stop;
  o.checkpoint_dir = (dir / "ck").string();
  Recorded part;
  {
    runtime::TrainObserver obs = recorder(part);
    auto record = obs.on_step_loss;
    obs.on_step_loss = [&](std::int64_t step, std::int64_t epoch, double loss) {
      record(step, epoch, loss);
      if (step == 4) stop = 1;  // mid-epoch
    };
    runtime::Trainer a(residual_model(), o);
    a.run(obs);
    ASSERT_TRUE(a.preempted());
    ASSERT_EQ(part.losses.size(), 4u);
  }
  stop = 0;
  runtime::Trainer b(residual_model(), o);
  b.load_checkpoint(io::find_latest_checkpoint(o.checkpoint_dir));
  ASSERT_EQ(b.steps(), 4);
  b.run(recorder(part));
  ASSERT_EQ(part.losses.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(part.losses[i], full.losses[i]) << "step " << i + 1;
  snapshot(b, part);
  EXPECT_TRUE(bit_equal(part.state, full.state)) << "masters / BN running statistics differ";
  ASSERT_EQ(part.extra.size(), full.extra.size());
  for (std::size_t i = 0; i < full.extra.size(); ++i) EXPECT_TRUE(bit_equal(part.extra[i], full.extra[i])) << i;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fp32AndAmp, GpuResume, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("Amp") : std::string("Fp32"); });

}  // namespace
