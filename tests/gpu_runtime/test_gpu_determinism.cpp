// GPU training is reproducible bit for bit (issue 11): same seed, same binary, same GPU, the same engine choices →
// the same per-step losses, weights, BN statistics and optimizer state, with captured graphs and the side compute
// streams on, in FP32 and AMP; also across processes that share an engine cache (the CLI's default), which is what
// pins the timed engine choices.
#include "gpu_models.h"

#include <renaissance/io/importers.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using namespace renaissance;
namespace fs = std::filesystem;

fs::path work_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("rn_gpu_det_{}_{}", ::getpid(), name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> state;                 // masters + BN running statistics
  std::vector<std::vector<float>> moments;  // optimizer state
  runtime::EpochMetrics last;
  test::RunFingerprint print;  // to say why, when two runs differ
  std::string hash_file;       // RN_TEST_NODE_HASHES only
};

/// Says where two trainings that should be one part: the fingerprints, and with RN_TEST_NODE_HASHES the first node
/// whose hashed inputs or outputs differ.
void explain(const TrainedRun& a, const TrainedRun& b, const char* what) {
  test::print_divergence(a.print, b.print, what);
  const std::string layer = test::print_hash_divergence(a.hash_file, b.hash_file, what);
  if (layer.empty()) return;
  for (std::size_t i = 0; i < a.print.engines.size(); ++i)  // the engines of the layer where they part
    if (a.print.engines[i].find(layer) != std::string::npos)
      std::printf("[ hashes  ] %s: %s engine: %s\n", what, layer.c_str(), a.print.engines[i].c_str());
}

TrainedRun train(const std::string& data, bool amp, bool deterministic = true, int arena_fill = -1,
                 const std::string& poison = "", const std::string& engine_cache = "", int workspace_fill = -1) {
  runtime::TrainOptions o = test::residual_run_options(data, amp);
  o.deterministic = deterministic;
  o.debug_workspace_fill = workspace_fill;
  o.engine_cache = engine_cache;
  o.debug_arena_fill = arena_fill;
  o.debug_poison_families = poison;
  TrainedRun r;
  static int trainings = 0;  // RN_TEST_NODE_HASHES: each training's hashes in a file of its own
  test::NodeHashFile hashes(
      (fs::temp_directory_path() / fmt::format("rn_gpu_det_{}_{}.hashes", ::getpid(), ++trainings)).string());
  r.hash_file = hashes.path;
  runtime::Trainer t(test::realistic_residual_model(), o);
  hashes.release();
  runtime::TrainObserver obs;
  test::fingerprint_start(t, &r.print);
  obs.on_step_loss = [&](std::int64_t, std::int64_t, double loss) {
    if (r.losses.empty()) test::fingerprint_first_step(t, &r.print);
    r.losses.push_back(loss);
  };
  const auto history = t.run(obs);
  r.print.engines = t.conv_engines();
  r.last = history.back();
  r.state = t.state_values();
  for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors())
    if (region_family(d.region) == RegionFamily::M) r.moments.push_back(t.tensor_values(d.name));
  return r;
}

class GpuDeterminism : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-test)";
  }
};

TEST_P(GpuDeterminism, TwoTrainingsAreBitIdentical) {
  const bool amp = GetParam();
  const fs::path dir = work_dir(amp ? "amp" : "fp32");
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 700, 256, 32, 32, 3, 10, 11);  // 5 full batches and one of 60 per epoch
  const TrainedRun a = train(data, amp);
  const TrainedRun b = train(data, amp);
  ASSERT_EQ(a.losses.size(), 12u);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  if (a.losses != b.losses) explain(a, b, amp ? "two trainings, amp" : "two trainings");
  EXPECT_TRUE(bit_equal(a.state, b.state)) << "weights / BN statistics differ";
  ASSERT_EQ(a.moments.size(), b.moments.size());
  ASSERT_FALSE(a.moments.empty());
  for (std::size_t i = 0; i < a.moments.size(); ++i) EXPECT_TRUE(bit_equal(a.moments[i], b.moments[i])) << i;
  EXPECT_EQ(a.last.val_loss, b.last.val_loss);
  EXPECT_EQ(a.last.val_top1, b.last.val_top1);
  fs::remove_all(dir);
}

// What start-up leaves in the arena (engine timing on the layers' own tensors, the warm-up run of every subgraph)
// must not reach the run: initialisation zeroes the arena, so a first run that timed its engines and a second one
// whose engines came from the cache start alike. The arena is filled with another byte before initialisation here.
TEST_P(GpuDeterminism, StartUpLeftoversDoNotReachTheRun) {
  const bool amp = GetParam();
  const fs::path dir = work_dir(amp ? "fill_amp" : "fill_fp32");
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 700, 256, 32, 32, 3, 10, 11);
  const TrainedRun a = train(data, amp, true, 0x00);
  const TrainedRun b = train(data, amp, true, 0x7F);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  if (a.losses != b.losses) explain(a, b, amp ? "arena fill, amp" : "arena fill");
  EXPECT_TRUE(bit_equal(a.state, b.state)) << "weights / BN statistics differ";
  EXPECT_EQ(a.last.val_loss, b.last.val_loss);
  fs::remove_all(dir);
}

// Nor may what start-up leaves in the cuDNN/cuBLASLt workspaces (the timed candidates ran there; a start-up from
// the engine cache leaves other bytes): the trainer zeroes them before the run, and no step may read a workspace
// byte it has not written first. Two fills of the workspaces must give the same run.
TEST_P(GpuDeterminism, WorkspaceLeftoversDoNotReachTheRun) {
  const bool amp = GetParam();
  const fs::path dir = work_dir(amp ? "ws_amp" : "ws_fp32");
  const std::string data = (dir / "syn.h5").string(), engines = (dir / "engines.txt").string();
  io::make_synthetic(data, 700, 256, 32, 32, 3, 10, 11);
  const TrainedRun a = train(data, amp, true, -1, "", engines, 0x00);
  const TrainedRun b = train(data, amp, true, -1, "", engines, 0xFF);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  if (a.losses != b.losses) explain(a, b, amp ? "workspace fill, amp" : "workspace fill");
  EXPECT_TRUE(bit_equal(a.state, b.state)) << "weights / BN statistics differ";
  fs::remove_all(dir);
}

// A step reads no byte of the input buffers, features and gradient slots or temporaries that it has not written
// first: NaN bytes in them after initialisation change nothing (a read before a write, e.g. of padding lanes or
// of an accumulator assumed zero, would show as another loss or a NaN).
TEST_P(GpuDeterminism, NoStepReadsInputsFeaturesOrTemporariesBeforeWritingThem) {
  const bool amp = GetParam();
  const fs::path dir = work_dir(amp ? "poison_amp" : "poison_fp32");
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 700, 256, 32, 32, 3, 10, 11);
  const TrainedRun clean = train(data, amp);
  for (const char* family : {"I", "F", "T"}) {
    const TrainedRun p = train(data, amp, true, -1, family);
    ASSERT_EQ(clean.losses.size(), p.losses.size()) << family;
    for (std::size_t i = 0; i < clean.losses.size(); ++i)
      EXPECT_EQ(clean.losses[i], p.losses[i]) << "family " << family << " poisoned, step " << i + 1;
    EXPECT_TRUE(bit_equal(clean.state, p.state)) << "family " << family << ": weights / BN statistics differ";
  }
  fs::remove_all(dir);
}

/// RN_DEBUG_STREAM_DELAY for the lifetime of the object (the session reads it when it opens).
struct StreamDelay {
  explicit StreamDelay(const char* spec) { ::setenv("RN_DEBUG_STREAM_DELAY", spec, 1); }
  ~StreamDelay() { ::unsetenv("RN_DEBUG_STREAM_DELAY"); }
};

// Every fork of the step between two streams (weight gradients beside data gradients, the projection shortcut beside
// the main path, the bucket-1 cast/all-reduce beside the first layer's backward, the optimizer beside the statistics
// and metrics, the input copy beside the step) orders what it must: holding one side of each fork back by a spin
// kernel, then the other side, changes no bit. A missing wait shows here as another loss whatever the GPU's load,
// where without the delays it shows only when the timing happens to expose it. The engines are shared through one
// cache file, so all three runs use the same ones.
TEST_P(GpuDeterminism, HoldingBackEitherSideOfEveryStreamForkChangesNoBit) {
  const bool amp = GetParam();
  const fs::path dir = work_dir(amp ? "delay_amp" : "delay_fp32");
  const std::string data = (dir / "syn.h5").string(), engines = (dir / "engines.txt").string();
  io::make_synthetic(data, 700, 256, 32, 32, 3, 10, 11);
  const TrainedRun plain = train(data, amp, true, -1, "", engines);
  for (const char* spec : {"wgrad:200,main-branch:200,update:2000,main-comm:2000,transfer:2000",
                           "main-wgrad:200,branch:200,main-update:2000,comm:2000"}) {
    const StreamDelay delay(spec);
    const TrainedRun d = train(data, amp, true, -1, "", engines);
    ASSERT_EQ(plain.losses.size(), d.losses.size()) << spec;
    for (std::size_t i = 0; i < plain.losses.size(); ++i)
      EXPECT_EQ(plain.losses[i], d.losses[i]) << spec << ", step " << i + 1;
    EXPECT_TRUE(bit_equal(plain.state, d.state)) << spec << ": weights / BN statistics differ";
    EXPECT_EQ(plain.print.engines, d.print.engines) << spec << ": the engine cache was not replayed";
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fp32AndAmp, GpuDeterminism, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("Amp") : std::string("Fp32"); });

// Start-up runs every subgraph once before capturing it; none of that may leak into the run.
TEST(GpuStartUp, OptimizerStateAndGradientsStartAtZero) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = work_dir("zero");
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 256, 64, 32, 32, 3, 10, 1);
  for (const bool amp : {false, true}) {
    runtime::TrainOptions o;
    o.data_path = data;
    o.backend = runtime::Backend::CUDA;
    o.amp = amp;
    o.batch = 64;
    o.optimizer = plan::OptimizerKind::ADAMW;
    runtime::Trainer t(test::realistic_residual_model(), o);
    std::size_t checked = 0;
    for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors()) {
      const RegionFamily f = region_family(d.region);
      if (f != RegionFamily::M && f != RegionFamily::V && f != RegionFamily::G && f != RegionFamily::G16) continue;
      for (float v : t.tensor_values(d.name)) ASSERT_EQ(v, 0.0f) << d.name << (amp ? " (AMP)" : " (FP32)");
      ++checked;
    }
    EXPECT_GT(checked, 0u);
  }
  fs::remove_all(dir);
}

std::string run_cli(const std::string& args, const fs::path& log) {
  const std::string cmd = std::string(RENAISSANCE_CLI) + " " + args + " > '" + log.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(rc, 0) << cmd << "\n" << ss.str();
  return ss.str();
}

/// The CLI reproducer's data (1,280 synthetic 28x28 images in `dir`) and its `train` arguments, --save left out.
std::string reproducer_args(const fs::path& dir) {
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 1280, 256, 28, 28, 1, 10, 3);
  return fmt::format(
      "train --model resnet18_fmnist --amp --epochs 2 --batch 256 --crop-padding 2 --device cuda --data '{}'", data);
}

/// How many tensors of two weights files (the same names, in order) differ in any bit.
std::size_t differing_tensors(const fs::path& pa, const fs::path& pb) {
  const io::WeightsFile a = io::read_weights(pa.string());
  const io::WeightsFile b = io::read_weights(pb.string());
  EXPECT_EQ(a.tensors.size(), b.tensors.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < std::min(a.tensors.size(), b.tensors.size()); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    if (!bit_equal(a.tensors[i].values, b.tensors[i].values)) ++differ;
  }
  return differ;
}

// The reproducer, as a user runs it: two `renaissance train` processes one after the other with the default
// engine cache beside --save. The first times the engines and saves them, the second reads them: the same engines,
// so the same weights file, tensor by tensor, bit for bit.
TEST(GpuDeterminismCli, TwoProcessesSharingTheEngineCacheWriteTheSameWeights) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = work_dir("cli");
  const std::string common = reproducer_args(dir);
  const std::string first = run_cli(common + " --save '" + (dir / "a.h5").string() + "'", dir / "a.log");
  const std::string second = run_cli(common + " --save '" + (dir / "b.h5").string() + "'", dir / "b.log");
  EXPECT_TRUE(fs::exists(dir / "engines.txt")) << "the default engine cache lives beside --save";
  EXPECT_NE(second.find(" 0 chosen"), std::string::npos) << "the second run should time nothing:\n" << second;
  EXPECT_EQ(differing_tensors(dir / "a.h5", dir / "b.h5"), 0u) << "tensors of the two weights files differ";
  fs::remove_all(dir);
}

// Two `train` processes started together on an empty engine cache (a job array's first tasks): before the start-up
// lock each timed its own engines and they could differ (102 of 102 tensors did for two runs that each timed, on an
// H100 on 2026-12-05); now one times and saves while the other waits for it and takes its engines: the same weights,
// bit for bit, and one of the two timed nothing.
TEST(GpuDeterminismCli, TwoProcessesStartingTogetherOnAnEmptyCacheWriteTheSameWeights) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = work_dir("cli_together");
  const std::string common = std::string(RENAISSANCE_CLI) + " " + reproducer_args(dir);
  const std::string cmd = fmt::format("{0} --save '{1}/a.h5' > '{1}/a.log' 2>&1 & {0} --save '{1}/b.h5' > '{1}/b.log' "
                                      "2>&1; rb=$?; wait $!; ra=$?; exit $((ra + rb))",
                                      common, dir.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;  // /bin/sh -c: both processes, then the sum of their statuses
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string la = slurp(dir / "a.log"), lb = slurp(dir / "b.log");
  const bool a_timed_none = la.find(" 0 chosen") != std::string::npos;
  const bool b_timed_none = lb.find(" 0 chosen") != std::string::npos;
  EXPECT_TRUE(a_timed_none != b_timed_none) << "one start-up times, the other takes its engines:\n" << la << "\n" << lb;
  EXPECT_EQ(differing_tensors(dir / "a.h5", dir / "b.h5"), 0u) << "tensors of the two weights files differ";
  fs::remove_all(dir);
}

}  // namespace
