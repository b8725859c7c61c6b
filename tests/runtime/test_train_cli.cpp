// `renaissance train` and `renaissance eval` through the real executable, as a user runs them.
#include <renaissance/io/dataset.h>
#include <renaissance/io/image.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/devices.h>

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string out;
};

CliRun run(const std::string& args, const std::string& cwd = {}) {
  const std::string cmd =
      (cwd.empty() ? std::string() : "cd '" + cwd + "' && ") + std::string(RENAISSANCE_CLI) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p)) r.out += buf.data();
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("rn_train_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string synthetic(std::int64_t hw, std::int64_t c) {
  const fs::path p = temp_dir() / ("syn_" + std::to_string(hw) + "_" + std::to_string(c) + ".h5");
  if (!fs::exists(p)) renaissance::io::make_synthetic(p.string(), 300, 100, hw, hw, c, 10, 5);
  return p.string();
}

double json_number(const std::string& line, const std::string& key) {
  const std::regex re("\"" + key + "\":(-?[0-9.eE+-]+)");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return -1e300;
  return std::stod(m[1].str());
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) v.push_back(l);
  return v;
}

TEST(TrainCli, WritesOneMetricsObjectPerEpoch) {
  const fs::path m = temp_dir() / "m.jsonl";
  const CliRun r = run("train --data " + synthetic(28, 1) + " --epochs 2 --batch 64 --lr 0.01 --schedule constant --metrics " +
                    m.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = lines_of(m);
  ASSERT_EQ(lines.size(), 2u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(json_number(lines[i], "epoch"), static_cast<double>(i + 1));
    EXPECT_EQ(json_number(lines[i], "step"), 5.0 * static_cast<double>(i + 1));  // 300 = 4·64 + 44
    const double top1 = json_number(lines[i], "val_top1");
    EXPECT_GE(top1, 0.0);
    EXPECT_LE(top1, 1.0);
    EXPECT_GT(json_number(lines[i], "train_loss"), 0.0);
    EXPECT_GT(json_number(lines[i], "val_loss"), 0.0);
    EXPECT_GT(json_number(lines[i], "images_per_s"), 0.0);
  }
  // Not a terminal: one line per epoch (no progress bar escape codes in logs).
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
}

// `--validate last` scores the val split once, after the last epoch: the epochs before report no validation, and
// the run is the every-epoch run's (validation changes no training state), so both the training figures of every
// epoch and the final validation equal it.
// HDF5 stores creation and modification times in each object's header: two imports of one source, or two --save of
// one deterministic run, differed in a few dozen bytes, so a checksum or cmp could not tell that nothing changed.
TEST(TrainCli, TheSameRunWritesTheSameBytes) {
  const auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const fs::path d = temp_dir() / "same_bytes";
  fs::create_directories(d);
  // The times have a resolution of a second: each pair is written more than a second apart.
  for (const char* name : {"a.h5", "b.h5"}) {
    if (name[0] == 'b') std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    ASSERT_EQ(run("data synthetic --out " + (d / name).string() + " --train 96 --val 16 --shape 28,28,1 --classes 10")
                  .code,
              0);
  }
  const std::string da = bytes(d / "a.h5");
  ASSERT_FALSE(da.empty());
  EXPECT_TRUE(da == bytes(d / "b.h5")) << "two imports of one source differ";
  for (const char* name : {"wa.h5", "wb.h5"}) {
    if (name[1] == 'b') std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    const CliRun r = run("train --device cpu --data " + (d / "a.h5").string() + " --batch 32 --max-steps 2 --save " +
                         (d / name).string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  const std::string wa = bytes(d / "wa.h5");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == bytes(d / "wb.h5")) << "two --save of one run differ";
  for (const char* name : {"pa.h5", "pb.h5"}) {
    if (name[1] == 'b') std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    const CliRun r = run("predict --device cpu --data " + (d / "a.h5").string() + " --weights " +
                         (d / "wa.h5").string() + " --out " + (d / name).string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  const std::string pa = bytes(d / "pa.h5");
  ASSERT_FALSE(pa.empty());
  EXPECT_TRUE(pa == bytes(d / "pb.h5")) << "two predict --out of one model differ";
}

TEST(TrainCli, ValidateLastScoresOnlyTheLastEpochAndTrainsTheSame) {
  const std::string data = synthetic(28, 1);
  const fs::path each = temp_dir() / "val_each.jsonl", last = temp_dir() / "val_last.jsonl";
  const std::string common = "train --data " + data + " --epochs 3 --batch 64 --lr 0.01 --metrics ";
  const CliRun a = run(common + each.string());
  ASSERT_EQ(a.code, 0) << a.out;
  const CliRun b = run(common + last.string() + " --validate last");
  ASSERT_EQ(b.code, 0) << b.out;
  const auto la = lines_of(each), lb = lines_of(last);
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(json_number(la[i], "train_loss"), json_number(lb[i], "train_loss")) << i;
    EXPECT_GE(json_number(la[i], "val_top1"), 0.0) << la[i];
  }
  EXPECT_EQ(json_number(lb[0], "val_top1"), -1e300) << "not validated: " << lb[0];
  EXPECT_EQ(json_number(lb[1], "val_top1"), -1e300) << "not validated: " << lb[1];
  EXPECT_EQ(json_number(lb[2], "val_top1"), json_number(la[2], "val_top1")) << lb[2];
  EXPECT_EQ(json_number(lb[2], "val_loss"), json_number(la[2], "val_loss")) << lb[2];
  EXPECT_NE(b.out.find("(no validation)"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("done: 15 steps, val_top1"), std::string::npos) << b.out;
  // --keep-best compares the epochs' validations: refused with `last`, before any work.
  const CliRun k = run(common + last.string() + " --validate last --checkpoint-dir " +
                       (temp_dir() / "vl_ck").string() + " --keep-best val_top1");
  EXPECT_EQ(k.code, 1) << k.out;
  EXPECT_NE(k.out.find("--keep-best val_top1 compares every epoch's validation"), std::string::npos) << k.out;
  EXPECT_FALSE(fs::exists(temp_dir() / "vl_ck")) << "refused before the run";
}

TEST(TrainCli, ReluMaskOffTrainsTheSameInTheSmallerArena) {
  // --relu-mask on|off (plan::TrainConfig::relu_masks) through the CLI: an AMP residual model trains to the same
  // losses either way (the masks change which bytes the block-end backward reads, not a value), and `plan` shows the
  // masks' bytes in the arena. A value other than on|off is a usage error naming the option.
  const std::string data = synthetic(28, 1);
  const std::string common = "train --data " + data + " --model resnet18_fmnist --amp --device cpu --epochs 1 "
                             "--batch 64 --max-steps 2 --metrics ";
  const fs::path on = temp_dir() / "mask_on.jsonl", off = temp_dir() / "mask_off.jsonl";
  const CliRun a = run(common + on.string());
  ASSERT_EQ(a.code, 0) << a.out;
  const CliRun b = run(common + off.string() + " --relu-mask off");
  ASSERT_EQ(b.code, 0) << b.out;
  const auto la = lines_of(on), lb = lines_of(off);
  ASSERT_EQ(la.size(), 1u);
  ASSERT_EQ(lb.size(), 1u);
  for (const char* k : {"train_loss", "val_loss", "val_top1"})
    EXPECT_EQ(json_number(la[0], k), json_number(lb[0], k)) << k;
  auto arena = [](const std::string& extra) {
    const CliRun p = run("plan --model resnet18_fmnist --amp --batch 64 --json" + extra);
    EXPECT_EQ(p.code, 0) << p.out;
    return json_number(p.out, "arena_bytes");
  };
  const double with = arena(""), without = arena(" --relu-mask off");
  EXPECT_GT(without, 0.0);
  EXPECT_GT(with, without) << "the masks take bytes of their own (S_MASK)";
  const CliRun bad = run(common + off.string() + " --relu-mask maybe");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--relu-mask: maybe not in {on,off}"), std::string::npos) << bad.out;
}

// --zero-init-residual through the CLI: a residual model trains with it; a model without residual sums is refused
// with the option's name, exit 1, before it trains (the weights it would start from: Trainer.ZeroInitResidual*).
TEST(TrainCli, ZeroInitResidualNeedsAResidualModel) {
  const CliRun ok = run("train --data " + synthetic(32, 3) + " --model-file " + std::string(RENAISSANCE_SOURCE_DIR) +
                        "/models/tiny_resnet.yaml --epochs 1 --batch 32 --max-steps 1 --no-validate "
                        "--zero-init-residual");
  EXPECT_EQ(ok.code, 0) << ok.out;
  const CliRun bad = run("train --data " + synthetic(28, 1) + " --model fmnist_cnn --epochs 1 --batch 32 --zero-init-residual");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("--zero-init-residual: the model has no residual sum"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("epoch 1/"), std::string::npos) << "refused before training: " << bad.out;
}

// --onecycle-pct/--onecycle-div reach the schedule the steps use (the loss log's lr, before each step: 300 samples at
// batch 32 = 10 steps; rising over 0.4 of them, so the peak 0.1 is at step 4 and the first rate 0.1/10), and are
// refused with another schedule or outside (0, 1).
TEST(TrainCli, OneCycleShapeOptionsReachTheSchedule) {
  const std::string data = synthetic(28, 1);
  const fs::path ll = temp_dir() / "onecycle_loss.jsonl";
  const CliRun r = run("train --data " + data + " --epochs 1 --batch 32 --lr 0.1 --no-validate --onecycle-pct 0.4 "
                       "--onecycle-div 10 --loss-log " + ll.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = lines_of(ll);
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_NEAR(json_number(lines[0], "lr"), 0.01, 1e-9) << lines[0];
  EXPECT_NEAR(json_number(lines[3], "lr"), 0.1, 1e-9) << lines[3];
  const CliRun cos = run("train --data " + data + " --epochs 1 --schedule cosine --onecycle-pct 0.3");
  EXPECT_EQ(cos.code, 1) << cos.out;
  EXPECT_NE(cos.out.find("they need --schedule onecycle"), std::string::npos) << cos.out;
  const CliRun one = run("train --data " + data + " --epochs 1 --onecycle-pct 1");
  EXPECT_EQ(one.code, 1) << one.out;
  EXPECT_NE(one.out.find("--onecycle-pct must lie strictly between 0 and 1"), std::string::npos) << one.out;
}

// --onecycle-momentum reaches the optimizer step by step. 300 samples at batch 32 = 10 steps, rising over 0.4 of them:
// the loss log's momentum is PyTorch 1.13's OneCycleLR(total_steps=10, pct_start=0.4, base_momentum=0.85,
// max_momentum=0.95) before each step. The first update (momentum 0.95) is the one of a run at --momentum 0.95, so
// step 2's loss is that run's to the bit and step 3's (after an update at 0.925) is not; 0.9,0.9 trains the bits of
// --momentum 0.9. Refused with Adam, another schedule, or BASE > MAX.
TEST(TrainCli, OneCycleMomentumReachesTheOptimizerStepByStep) {
  const std::string data = synthetic(28, 1);
  const std::string common = "train --data " + data +
                             " --epochs 1 --batch 32 --lr 0.1 --no-validate --onecycle-pct 0.4 --onecycle-div 10 "
                             "--loss-log ";
  auto losses = [&](const std::string& name, const std::string& extra) {
    const fs::path ll = temp_dir() / ("momentum_" + name + ".jsonl");
    const CliRun r = run(common + ll.string() + " " + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    return lines_of(ll);
  };
  const auto cyc = losses("cycled", "--onecycle-momentum 0.85,0.95");
  ASSERT_EQ(cyc.size(), 10u);
  const double want[10] = {0.95, 0.9249999999999999, 0.875, 0.85, 0.856698729810778, 0.875, 0.8999999999999999,
                           0.9249999999999999, 0.9433012701892219, 0.95};
  for (std::size_t i = 0; i < 10; ++i) EXPECT_NEAR(json_number(cyc[i], "momentum"), want[i], 1e-12) << cyc[i];
  const auto at95 = losses("095", "--momentum 0.95");
  ASSERT_EQ(at95.size(), 10u);
  EXPECT_EQ(json_number(at95[0], "momentum"), -1e300) << "not cycled, not logged: " << at95[0];
  EXPECT_EQ(json_number(cyc[1], "loss"), json_number(at95[1], "loss")) << cyc[1] << " vs " << at95[1];
  EXPECT_NE(json_number(cyc[2], "loss"), json_number(at95[2], "loss")) << cyc[2] << " vs " << at95[2];
  const auto flat = losses("flat", "--onecycle-momentum 0.9,0.9"), plain = losses("plain", "");
  ASSERT_EQ(flat.size(), 10u);
  ASSERT_EQ(plain.size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(json_number(flat[i], "loss"), json_number(plain[i], "loss")) << i;
  for (const auto& [extra, says] : std::vector<std::pair<std::string, std::string>>{
           {"--optimizer adam --onecycle-momentum 0.85,0.95", "--optimizer adam has none"},
           {"--schedule cosine --onecycle-momentum 0.85,0.95", "it needs --schedule onecycle"},
           {"--onecycle-momentum 0.95,0.85", "needs 0 <= BASE <= MAX < 1"},
           {"--onecycle-momentum 0.85", "takes off or BASE,MAX"}}) {
    const CliRun bad = run("train --data " + data + " --epochs 1 " + extra);
    EXPECT_EQ(bad.code, 1) << extra << ": " << bad.out;
    EXPECT_NE(bad.out.find(says), std::string::npos) << bad.out;
  }
}

// --drop-last: 300 samples at batch 64 train 4 full batches an epoch instead of 4 + one of 44 (the loss log has a line
// per step, with its epoch); a checkpoint written with it is not resumed without it (an epoch's batches differ).
TEST(TrainCli, DropLastTrainsOnlyFullBatchesAndResumesOnlyWithIt) {
  const std::string data = synthetic(28, 1);
  const fs::path dir = temp_dir() / "drop_last";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto steps_of_epoch = [](const std::vector<std::string>& lines, int epoch) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return json_number(l, "epoch") == epoch;
    });
  };
  for (const bool drop : {false, true}) {
    const fs::path ll = dir / (drop ? "drop.jsonl" : "keep.jsonl");
    const CliRun r = run("train --data " + data + " --epochs 2 --batch 64 --no-validate --loss-log " + ll.string() +
                         (drop ? " --drop-last --checkpoint-dir " + (dir / "ck").string() : std::string()));
    ASSERT_EQ(r.code, 0) << r.out;
    const auto lines = lines_of(ll);
    EXPECT_EQ(lines.size(), drop ? 8u : 10u);
    EXPECT_EQ(steps_of_epoch(lines, 1), drop ? 4 : 5);
    EXPECT_EQ(steps_of_epoch(lines, 2), drop ? 4 : 5);
    if (drop) {
      EXPECT_NE(r.out.find("--drop-last: the last 44 sample(s) of each epoch's order are not trained"),
                std::string::npos)
          << r.out;
    }
  }
  const CliRun resumed = run("train --data " + data + " --epochs 3 --batch 64 --no-validate --checkpoint-dir " +
                             (dir / "ck").string() + " --resume auto");
  EXPECT_EQ(resumed.code, 1) << resumed.out;
  EXPECT_NE(resumed.out.find("written with --drop-last true, resumed with false"), std::string::npos) << resumed.out;
  const CliRun tiny = run("train --data " + data + " --epochs 1 --batch 512 --drop-last");
  EXPECT_EQ(tiny.code, 1) << tiny.out;
  EXPECT_NE(tiny.out.find("fewer than one --batch of 512"), std::string::npos) << tiny.out;
  fs::remove_all(dir);
}

TEST(TrainCli, ConfigFileSetsOptionsAndTheCommandLineWins) {
  const fs::path cfg = temp_dir() / "run.yaml";
  std::ofstream(cfg) << "epochs: 1\nbatch: 32\nlr: 0.01\nschedule: constant\nmax-steps: 2\n";
  const CliRun a = run("train --data " + synthetic(28, 1) + " --config " + cfg.string());
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("batch 32"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("step 2 "), std::string::npos) << a.out;
  const CliRun b = run("train --data " + synthetic(28, 1) + " --config " + cfg.string() + " --batch 64");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("batch 64"), std::string::npos) << b.out;
}

TEST(TrainCli, UnknownConfigKeyNamesFileAndKey) {
  const fs::path cfg = temp_dir() / "bad.yaml";
  std::ofstream(cfg) << "epochs: 1\nlearning_rate: 0.1\n";
  const CliRun r = run("train --data " + synthetic(28, 1) + " --config " + cfg.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("bad.yaml:2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("learning_rate"), std::string::npos) << r.out;
}

TEST(TrainCli, BadInputFailsWithTheFileNamed) {
  const CliRun missing = run("train --data /nonexistent/x.h5 --max-steps 1");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("/nonexistent/x.h5"), std::string::npos) << missing.out;
  const std::string rgb = synthetic(32, 3);
  const CliRun shape = run("train --data " + rgb + " --max-steps 1");
  EXPECT_NE(shape.code, 0);
  EXPECT_NE(shape.out.find(rgb), std::string::npos) << shape.out;
  const CliRun device = run("train --data " + synthetic(28, 1) + " --device tpu");
  EXPECT_NE(device.code, 0);
}

// --data-cache (runtime/gpu_input.h): `off` and `auto` train on the CPU backend (no cache there), `on` stops with the
// reason and exit 1, an unknown value is the command line's error; the config key works like the option.
TEST(TrainCli, DataCacheOption) {
  const std::string data = synthetic(28, 1);
  const CliRun off = run("train --device cpu --data " + data + " --max-steps 1 --no-validate --data-cache off");
  EXPECT_EQ(off.code, 0) << off.out;
  const CliRun aut = run("train --device cpu --data " + data + " --max-steps 1 --no-validate --data-cache auto");
  EXPECT_EQ(aut.code, 0) << aut.out;
  const CliRun on = run("train --device cpu --data " + data + " --max-steps 1 --no-validate --data-cache on");
  EXPECT_EQ(on.code, 1) << on.out;
  EXPECT_NE(on.out.find("--data-cache on"), std::string::npos) << on.out;
  EXPECT_NE(on.out.find("not the CUDA backend"), std::string::npos) << on.out;
  const CliRun bad = run("train --device cpu --data " + data + " --max-steps 1 --data-cache yes");
  EXPECT_NE(bad.code, 0);
  EXPECT_LT(bad.code, 128);
  EXPECT_NE(bad.out.find("--data-cache"), std::string::npos) << bad.out;
  const fs::path cfg = temp_dir() / "cache.yaml";
  std::ofstream(cfg) << "max-steps: 1\ndata-cache: on\n";
  const CliRun c = run("train --device cpu --data " + data + " --no-validate --config " + cfg.string());
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("--data-cache on"), std::string::npos) << c.out;
}

// --decode (runtime/gpu_jpeg.h) on a JPEG store: cpu and auto train on the CPU backend (libjpeg-turbo, logged),
// gpu stops with the reason and exit 1, an unknown value is the command line's error. `data bench-decode` refuses
// a raw store and a missing file, naming them.
TEST(TrainCli, DecodeOption) {
  if (!renaissance::io::have_jpeg_codec()) GTEST_SKIP() << "no libturbojpeg in this build: no JPEG store to make";
  const fs::path store = temp_dir() / "jpeg_store.h5";
  {
    renaissance::io::JpegStoreSpec spec;
    spec.channels = 1;
    renaissance::io::DatasetWriter w(store.string(), spec, 10);
    std::vector<std::uint8_t> px(30 * 34);
    for (int i = 0; i < 80; ++i) {
      for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>((k * 7 + i * 13) % 251);
      const std::vector<std::uint8_t> jpg = renaissance::io::encode_jpeg(px.data(), 30, 34, 1, 90, "test");
      const auto split = i < 60 ? renaissance::io::Split::train : renaissance::io::Split::val;
      w.append_encoded(split, jpg.data(), static_cast<std::int64_t>(jpg.size()), 30, 34, i % 10, px.data());
    }
    w.finish();
  }
  const std::string base =
      "train --device cpu --model fmnist_cnn --data " + store.string() + " --max-steps 1 --batch 16 --no-validate";
  const CliRun cpu = run(base + " --decode cpu");
  EXPECT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("JPEG decode: on the CPU"), std::string::npos) << cpu.out;
  const CliRun aut = run(base + " --decode auto");
  EXPECT_EQ(aut.code, 0) << aut.out;
  const CliRun gpu = run(base + " --decode gpu");
  EXPECT_EQ(gpu.code, 1) << gpu.out;
  EXPECT_NE(gpu.out.find("--decode gpu"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("not the CUDA backend"), std::string::npos) << gpu.out;
  const CliRun bad = run(base + " --decode nvjpeg");
  EXPECT_NE(bad.code, 0);
  EXPECT_LT(bad.code, 128);
  EXPECT_NE(bad.out.find("--decode"), std::string::npos) << bad.out;
  const CliRun decoders = run(base + " --decode cpu --gpu-decoders 0");  // 1 to 16
  EXPECT_EQ(decoders.code, 2) << decoders.out;
  EXPECT_NE(decoders.out.find("--gpu-decoders"), std::string::npos) << decoders.out;
  const CliRun raw = run("data bench-decode " + synthetic(28, 1));
  EXPECT_EQ(raw.code, 1) << raw.out;
  EXPECT_NE(raw.out.find("needs a JPEG store"), std::string::npos) << raw.out;
  const CliRun missing = run("data bench-decode " + (temp_dir() / "none.h5").string());
  EXPECT_NE(missing.code, 0);
  EXPECT_LT(missing.code, 128);
  EXPECT_NE(missing.out.find("none.h5"), std::string::npos) << missing.out;
}

// Found by a hunt: a BN on 1x1 features (after a GAP and an FC) sees one value per channel in an epoch's last batch
// of one sample; the kernels stopped the run at that step, after the epoch's work and its checkpoints, naming no
// layer. The plan knows it: refused before the first step, naming the layer and the way out. Evaluation never trains.
TEST(TrainCli, ABatchNormOverOneValuePerChannelIsRefusedBeforeTheFirstStep) {
  const fs::path d = temp_dir() / "one_value_bn";
  fs::create_directories(d);
  const std::string data = (d / "d.h5").string();
  renaissance::io::make_synthetic(data, 33, 8, 8, 8, 3, 4, 5);
  std::ofstream(d / "m.yaml") << "name: gapbn\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 8, k: 3, pad: 1}\n  - gap\n"
                                 "  - fc: {out: 16}\n  - bn\n  - relu\n  - fc: {out: 4}\n  - softmax_ce: {classes: 4}\n";
  const std::string base = "train --device cpu --model-file " + (d / "m.yaml").string() + " --data " + data +
                           " --epochs 1 --save " + (d / "w.h5").string();
  CliRun r = run(base + " --batch 16");  // 33 = 2 x 16 + 1
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("layer 'bn1d1': its batch normalisation would see one value per channel in the last batch of "
                       "each epoch"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--drop-last"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << "refused before the first step:\n" << r.out;
  r = run(base + " --batch 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("in every batch (batch 1)"), std::string::npos) << r.out;
  r = run(base + " --batch 16 --drop-last");
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(base + " --batch 11");  // 33 = 3 x 11
  ASSERT_EQ(r.code, 0) << r.out;
  // One sample through predict and eval: inference, no batch statistics.
  r = run("predict --device cpu --model-file " + (d / "m.yaml").string() + " --data " + data + " --weights " +
          (d / "w.h5").string() + " --count 1 --out " + (d / "p.h5").string());
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("eval --device cpu --model-file " + (d / "m.yaml").string() + " --data " + data + " --weights " +
          (d / "w.h5").string() + " --batch 1");
  EXPECT_EQ(r.code, 0) << r.out;
}

// Found by a hunt: options that do nothing with the others ran without a word (results bit-identical to leaving
// them out); each now says so, and so does a run that ends within its warm-up.
TEST(TrainCli, OptionsWithoutEffectAreNamed) {
  const std::string base = "train --device cpu --data " + synthetic(28, 1) + " --epochs 2 --batch 64 --max-steps 1 "
                           "--no-validate ";
  CliRun r = run(base + "--warmup-epochs 1 --step-epochs 3 --optimizer adam --momentum 0.5 --start-resolution 28");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* w : {"--warmup-epochs 1 has no effect with --schedule onecycle",
                        "--step-epochs 3 has no effect with --schedule onecycle",
                        "--momentum 0.5 has no effect with --optimizer adam",
                        "--start-resolution 28 has no effect without --lowres-epochs"})
    EXPECT_NE(r.out.find(w), std::string::npos) << w << "\n" << r.out;
  r = run(base + "--ema-decay 0.5 --crop-scale 0.5,1 --keep 5 --val-batch 16 --start-resolution 14");
  ASSERT_EQ(r.code, 0) << r.out;  // --start-resolution 14 alone no longer compiles (and fails on) a low-res variant
  for (const char* w :
       {"--ema-decay 0.5 has no effect without --ema", "--crop-scale has no effect with --crop none",
        "--keep 5 has no effect without --checkpoint-dir", "--val-batch has no effect: the run does not validate",
        "--start-resolution 14 has no effect without --lowres-epochs"})
    EXPECT_NE(r.out.find(w), std::string::npos) << w << "\n" << r.out;
  r = run(base + "--schedule cosine --warmup-epochs 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--warmup-epochs 3 >= --epochs 2: the run ends within its warm-up"), std::string::npos)
      << r.out;
  r = run(base + "--schedule cosine --warmup-epochs 1 --optimizer nesterov --momentum 0.8");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("has no effect"), std::string::npos) << r.out;
}

TEST(TrainCli, EvalReproducesTheFinalValidation) {
  const fs::path w = temp_dir() / "w.h5";
  const fs::path m = temp_dir() / "m2.jsonl";
  const std::string data = synthetic(28, 1);
  const CliRun t = run("train --data " + data + " --epochs 1 --batch 64 --lr 0.01 --schedule constant --metrics " +
                    m.string() + " --save " + w.string());
  ASSERT_EQ(t.code, 0) << t.out;
  const CliRun e = run("eval --data " + data + " --weights " + w.string() + " --json");
  ASSERT_EQ(e.code, 0) << e.out;
  const auto lines = lines_of(m);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_DOUBLE_EQ(json_number(e.out, "val_top1"), json_number(lines[0], "val_top1")) << e.out;
  // A different architecture names the first tensor that does not fit.
  const CliRun wrong = run("eval --data " + data + " --weights " + w.string() + " --model resnet18_fmnist");
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.out.find("cbr1.conv.w"), std::string::npos) << wrong.out;
}

/// A float32 or int32 dataset of an HDF5 file, whole (`predict`'s /logits and /labels).
template <typename T>
std::vector<T> read_h5(const fs::path& file, const char* name) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << file;
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  EXPECT_GE(d, 0) << file << " " << name;
  const hid_t space = H5Dget_space(d);
  std::vector<T> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  EXPECT_GE(H5Dread(d, std::is_same_v<T, float> ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                    v.data()),
            0);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  return v;
}

// `--tta flip` against its definition computed independently: `renaissance predict` of the saved weights on the val
// images and on a copy of the dataset whose val images this test mirrored itself (the train split, which sets the
// normalisation, copied unchanged), the two logits averaged here: the same top-1 and cross-entropy; `eval --tta flip`
// of the saved weights too.
TEST(TrainCli, FlipTestTimeAugmentationScoresTheMeanOfTheImageAndItsMirror) {
  namespace io = renaissance::io;
  const fs::path dir = temp_dir() / "tta";
  fs::create_directories(dir);
  const std::string data = (dir / "syn.h5").string();
  io::make_synthetic(data, 256, 100, 32, 32, 3, 10, 9);  // RGB: a pixel's 3 bytes move together
  const fs::path w = dir / "w.h5", m = dir / "m.jsonl";
  const std::string model = "--model-file " + std::string(RENAISSANCE_SOURCE_DIR) + "/models/tiny_resnet.yaml";
  const CliRun t = run("train " + model + " --data " + data +
                       " --device cpu --epochs 2 --batch 32 --val-batch 64 --lr 0.05 --tta flip --metrics " +
                       m.string() + " --save " + w.string());
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("with flip test-time augmentation"), std::string::npos) << t.out;
  const auto lines = lines_of(m);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(json_number(lines[0], "tta_val_top1"), -1e300) << "only the last epoch is scored with TTA: " << lines[0];
  const double top1 = json_number(lines[1], "tta_val_top1"), loss = json_number(lines[1], "tta_val_loss");
  ASSERT_GE(top1, 0) << lines[1];

  // The mirrored copy: train as stored, each val image's columns reversed.
  const std::string mirrored = (dir / "mirrored.h5").string();
  {
    const io::DatasetFile src(data);
    const io::SplitInfo& info = src.info(io::Split::train);
    io::DatasetWriter out(mirrored, info.height, info.width, info.channels, src.num_classes());
    for (io::Split split : io::kAllSplits) {
      const std::int64_t n = src.size(split), px = info.height * info.width * info.channels;
      std::vector<std::uint8_t> img(static_cast<std::size_t>(n * px));
      std::vector<std::int32_t> lab(static_cast<std::size_t>(n));
      src.read(split, 0, n, img.data(), lab.data());
      if (split == io::Split::val)
        for (std::int64_t row = 0; row < n * info.height; ++row)
          for (std::int64_t x = 0; x < info.width / 2; ++x)
            for (std::int64_t c = 0; c < info.channels; ++c)
              std::swap(img[static_cast<std::size_t>((row * info.width + x) * info.channels + c)],
                        img[static_cast<std::size_t>((row * info.width + info.width - 1 - x) * info.channels + c)]);
      out.append(split, img.data(), lab.data(), n);
    }
    out.finish();
  }
  const fs::path a = dir / "a.h5", b = dir / "b.h5";
  for (const auto& [file, out] : {std::pair{data, a}, std::pair{mirrored, b}}) {
    const CliRun p = run("predict " + model + " --device cpu --weights " + w.string() + " --data " + file +
                         " --count 100 --batch 64 --out " + out.string());
    ASSERT_EQ(p.code, 0) << p.out;
  }
  const std::vector<float> la = read_h5<float>(a, "logits"), lb = read_h5<float>(b, "logits");
  const std::vector<std::int32_t> labels = read_h5<std::int32_t>(a, "labels");
  ASSERT_EQ(la.size(), 1000u);
  ASSERT_EQ(lb.size(), 1000u);
  ASSERT_EQ(labels.size(), 100u);
  double want_top1 = 0, want_loss = 0;
  int differ = 0;  // images whose mirror changes the prediction: the test sees a difference if flips were ignored
  auto argmax = [](const float* row) { return std::max_element(row, row + 10) - row; };
  for (std::size_t i = 0; i < 100; ++i) {
    std::array<double, 10> z{};
    for (std::size_t k = 0; k < 10; ++k) z[k] = 0.5 * (la[i * 10 + k] + lb[i * 10 + k]);
    const auto best = static_cast<std::size_t>(std::max_element(z.begin(), z.end()) - z.begin());
    differ += argmax(la.data() + i * 10) != argmax(lb.data() + i * 10);
    double sum = 0;
    for (double v : z) sum += std::exp(v - z[best]);
    want_loss += z[best] + std::log(sum) - z[static_cast<std::size_t>(labels[i])];
    want_top1 += best == static_cast<std::size_t>(labels[i]);
  }
  EXPECT_GT(differ, 0) << "no val image's prediction changed with its mirror: the comparison could not fail";
  EXPECT_DOUBLE_EQ(top1, want_top1 / 100);
  EXPECT_NEAR(loss, want_loss / 100, 1e-5 * std::abs(want_loss / 100));
  // `eval --tta flip` of the saved weights: the same figures.
  const CliRun e = run("eval " + model + " --device cpu --weights " + w.string() + " --data " + data +
                       " --batch 64 --tta flip --json");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_DOUBLE_EQ(json_number(e.out, "tta_val_top1"), want_top1 / 100) << e.out;
  EXPECT_NEAR(json_number(e.out, "tta_val_loss"), want_loss / 100, 1e-5 * std::abs(want_loss / 100)) << e.out;
  fs::remove_all(dir);
}

}  // namespace

namespace {

TEST(BenchCli, ReportsThroughputAndArena) {
  const CliRun r = run("bench --model fmnist_cnn --batch 32 --warmup 1 --steps 2 --device cpu --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(json_number(r.out, "images_per_s"), 0.0) << r.out;
  EXPECT_GT(json_number(r.out, "ms_per_step"), 0.0) << r.out;
  EXPECT_GT(json_number(r.out, "arena_bytes"), 0.0) << r.out;
  EXPECT_EQ(json_number(r.out, "batch"), 32.0);
  const CliRun bad = run("bench --model fmnist_cnn --graphs maybe");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--graphs"), std::string::npos) << bad.out;
}

}  // namespace

namespace {
/// The running loss the progress shows: an exponential average over steps with weight 0.1 per step (app/progress.h),
/// recomputed here from the per-step losses of --loss-log.
std::vector<double> running_losses(const std::vector<std::string>& loss_log) {
  std::vector<double> out;
  double r = 0;
  for (std::size_t i = 0; i < loss_log.size(); ++i) {
    const double l = json_number(loss_log[i], "loss");
    r = i == 0 ? l : 0.9 * r + 0.1 * l;
    out.push_back(r);
  }
  return out;
}
}  // namespace

// --max-steps bounds the run: 7 steps of a 3-epoch run of 5 batches are "epoch 1/2"; --log-every 3 prints a heartbeat
// at steps 3, 6 and the last, with the running loss of the loss log's values.
TEST(TrainCli, HeartbeatEveryNStepsBoundedByMaxSteps) {
  const fs::path ll = temp_dir() / "hb_loss.jsonl", m = temp_dir() / "hb_metrics.jsonl";
  const CliRun r = run("train --device cpu --data " + synthetic(28, 1) +
                       " --epochs 3 --batch 64 --lr 0.01 --max-steps 7 --log-every 3 --loss-log " + ll.string() +
                       " --metrics " + m.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto losses = lines_of(ll);
  ASSERT_EQ(losses.size(), 7u);
  const std::vector<double> running = running_losses(losses);
  const std::regex beat(R"(step (\d+)/7  epoch (\d)/2  batch (\d)/5  loss ([0-9.]+)  [0-9]+ img/s  ETA \S+)");
  std::vector<int> steps;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), beat); it != std::sregex_iterator(); ++it) {
    const int step = std::stoi((*it)[1].str());
    steps.push_back(step);
    EXPECT_EQ(std::stoi((*it)[2].str()), step <= 5 ? 1 : 2);
    EXPECT_EQ(std::stoi((*it)[3].str()), step <= 5 ? step : step - 5);
    EXPECT_NEAR(std::stod((*it)[4].str()), running[static_cast<std::size_t>(step - 1)], 6e-5) << "step " << step;
  }
  EXPECT_EQ(steps, (std::vector<int>{3, 6, 7})) << r.out;
  EXPECT_NE(r.out.find("epoch 1/2  step 5 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 2/2  step 7 "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("epoch 1/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 epochs (at most 7 steps: --max-steps)"), std::string::npos) << r.out;
  // The metrics JSONL carries the wall time and one run id for every line.
  const auto rows = lines_of(m);
  ASSERT_EQ(rows.size(), 2u);
  const std::regex id("\"run_id\":\"([^\"]+)\"");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(rows[0], a, id)) << rows[0];
  ASSERT_TRUE(std::regex_search(rows[1], b, id)) << rows[1];
  EXPECT_EQ(a[1].str(), b[1].str());
  const double t0 = json_number(rows[0], "time"), t1 = json_number(rows[1], "time");
  EXPECT_GT(t0, 1.7e9);  // seconds since 1970: after 2023
  EXPECT_GE(t1, t0);
}

// On a terminal (script(1) gives the run a pseudo-terminal): a bar over the whole run, with the running loss, that
// ends at the last step.
TEST(TrainCli, ProgressBarOnATerminalCoversTheWholeRun) {
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1) for a pseudo-terminal";
  const std::string inner = std::string(RENAISSANCE_CLI) + " train --device cpu --data " + synthetic(28, 1) +
                            " --epochs 3 --batch 64 --lr 0.01 --max-steps 7 --no-validate";
  const fs::path out = temp_dir() / "tty.txt";
  const std::string cmd = "script -qec \"" + inner + "\" /dev/null > '" + out.string() + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("[########################] 100%  step 7/7  epoch 2/2 (2/5)  loss "), std::string::npos) << text;
  EXPECT_EQ(text.find("epoch 1/3"), std::string::npos) << text;
}

namespace {
/// What a shell command prints on stdout (the command redirects stderr where it wants it).
std::string out_of(const std::string& cmd) {
  std::string s;
  FILE* p = ::popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && std::fgets(buf.data(), buf.size(), p)) s += buf.data();
  if (p) ::pclose(p);
  return s;
}
}  // namespace

// The train log's header line ends ", N CPU threads" or ", N CPU threads, Winograd".
static bool says_cpu_threads(const std::string& log, int n) {
  const std::string t = ", " + std::to_string(n) + " CPU threads";
  return log.find(t + "\n") != std::string::npos || log.find(t + ", Winograd\n") != std::string::npos;
}

// Thread count of the CPU kernels: the process's affinity mask (taskset -c 0: one CPU, one thread), unless
// RENAISSANCE_CPU_THREADS says otherwise.
TEST(TrainCli, CpuThreadsFollowTheAffinityMask) {
  if (std::system("command -v taskset >/dev/null 2>&1") != 0) GTEST_SKIP() << "no taskset";
  const std::string args = std::string(" train --device cpu --data ") + synthetic(28, 1) +
                           " --epochs 1 --batch 64 --max-steps 1 --no-validate 2>&1";
  const std::string one = out_of("env -u RENAISSANCE_CPU_THREADS taskset -c 0 " + std::string(RENAISSANCE_CLI) + args);
  EXPECT_TRUE(says_cpu_threads(one, 1)) << one;
  const std::string three = out_of("RENAISSANCE_CPU_THREADS=3 taskset -c 0 " + std::string(RENAISSANCE_CLI) + args);
  EXPECT_TRUE(says_cpu_threads(three, 3)) << three;
  // More threads than the mask holds: they spin between kernels and take turns, which the run says.
  EXPECT_NE(three.find("RENAISSANCE_CPU_THREADS=3 is more than the 1 CPU this process may run on"), std::string::npos)
      << three;
  EXPECT_EQ(one.find("is more than the"), std::string::npos) << one;
}

// --cpu-winograd on|off (default: RENAISSANCE_CPU_WINOGRAD, else on) reaches the kernels and says so where this CPU has
// the kernels (AVX-512 with oneDNN; elsewhere no run says Winograd): the train log's header line, bench's --json; the
// option overrides the environment.
TEST(TrainCli, CpuWinogradIsOnByDefaultAndSetByTheOptionOrTheEnvironment) {
  renaissance::runtime::set_cpu_winograd(true);
  const bool here = renaissance::runtime::cpu_winograd();  // the setting is on: whether this CPU runs the kernels
  const auto npos = std::string::npos;
  const std::string train = std::string(RENAISSANCE_CLI) + " train --device cpu --data " + synthetic(28, 1) +
                            " --epochs 1 --batch 64 --max-steps 1 --no-validate";
  const std::string by_default = out_of("env -u RENAISSANCE_CPU_WINOGRAD " + train + " 2>&1");
  EXPECT_EQ(by_default.find(", Winograd\n") != npos, here) << by_default;  // on by default where the CPU has them
  EXPECT_EQ(out_of("env -u RENAISSANCE_CPU_WINOGRAD " + train + " --cpu-winograd on 2>&1").find(", Winograd\n") != npos,
            here);
  EXPECT_EQ(out_of("RENAISSANCE_CPU_WINOGRAD=off " + train + " 2>&1").find("Winograd"), npos);
  EXPECT_EQ(out_of("RENAISSANCE_CPU_WINOGRAD=on " + train + " 2>&1").find(", Winograd\n") != npos, here);
  EXPECT_EQ(out_of("RENAISSANCE_CPU_WINOGRAD=off " + train + " --cpu-winograd on 2>&1").find(", Winograd\n") != npos,
            here);
  EXPECT_EQ(out_of("RENAISSANCE_CPU_WINOGRAD=on " + train + " --cpu-winograd off 2>&1").find("Winograd"), npos);
  EXPECT_EQ(out_of("env -u RENAISSANCE_CPU_WINOGRAD " + train + " --cpu-winograd off 2>&1").find("Winograd"), npos);
  const std::string bench = std::string(RENAISSANCE_CLI) +
                            " bench --model fmnist_cnn --device cpu --batch 16 --warmup 1 --steps 1 --json";
  EXPECT_NE(out_of("env -u RENAISSANCE_CPU_WINOGRAD " + bench + " 2>/dev/null")
                .find(here ? "\"cpu_winograd\":true" : "\"cpu_winograd\":false"),
            npos);
  EXPECT_NE(out_of(bench + " --cpu-winograd off 2>/dev/null").find("\"cpu_winograd\":false"), npos);
  if (!here) GTEST_SKIP() << "this CPU has no Winograd kernels (AVX-512 with oneDNN): checked that no run says so";
}
