// `renaissance train` and `renaissance eval` through the real executable, as a user runs them.
#include <renaissance/io/importers.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

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
  EXPECT_NE(wrong.out.find("conv1.w"), std::string::npos) << wrong.out;
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
