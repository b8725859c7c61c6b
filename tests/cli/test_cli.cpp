// `renaissance plan` end to end: the real executable, its output and its exit codes.
#include <renaissance/plan/arch_plan.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path temp_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("renaissance_test_cli_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

/// Runs `renaissance <args>` from the source tree, capturing stdout and stderr separately.
Result run(const std::string& args) {
  const fs::path out = temp_dir() / "stdout.txt", err = temp_dir() / "stderr.txt";
  const std::string cmd = "cd '" + std::string(RENAISSANCE_SOURCE_DIR) + "' && '" + RENAISSANCE_CLI + "' " + args +
                          " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path p = temp_dir() / name;
  std::ofstream(p) << text;
  return p;
}

/// The number after "key": in a JSON text (the first occurrence: top-level keys come first in our report).
double json_number(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\"";
  const auto at = json.find(k);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no key " << k;
    return -1;
  }
  auto p = json.find(':', at + k.size());
  return std::strtod(json.c_str() + p + 1, nullptr);
}

void expect_contains(const std::string& text, const std::string& what) {
  EXPECT_NE(text.find(what), std::string::npos) << "'" << what << "' not in:\n" << text.substr(0, 3000);
}

}  // namespace

TEST(CliPlan, Resnet50Json) {
  const Result r = run("plan --model resnet50 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json_number(r.out, "parameters"), 25557032.0);
  EXPECT_NEAR(json_number(r.out, "gmacs"), 4.09, 0.01);
  EXPECT_GT(json_number(r.out, "arena_bytes"), 0.0);
  expect_contains(r.out, "\"layers\"");
  expect_contains(r.out, "\"regions\"");
  expect_contains(r.out, "\"W_DEEP_CONV\"");
  expect_contains(r.out, "\"kind\":\"BottleneckProjection\"");  // FP32 plans fuse the same layers as AMP
  const Result plain = run("plan --model resnet50 --no-fuse --json");
  ASSERT_EQ(plain.code, 0) << plain.err;
  expect_contains(plain.out, "\"kind\":\"Add2End\"");  // --no-fuse keeps the blocks as plain layers
  expect_contains(plain.out, "\"kind\":\"CBR\"");
  EXPECT_EQ(r.out.front(), '{');
  EXPECT_EQ(r.out.substr(r.out.find_last_not_of("\n"), 1), "}");
}

TEST(CliPlan, Resnet50AmpJsonSameFigures) {
  const Result r = run("plan --model resnet50 --amp --optimizer adamw --ema --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json_number(r.out, "parameters"), 25557032.0);
  EXPECT_NEAR(json_number(r.out, "gmacs"), 4.09, 0.01);
  expect_contains(r.out, "\"amp\":true");
  expect_contains(r.out, "\"kind\":\"BottleneckProjection\"");
}

TEST(CliPlan, TextOutput) {
  const Result r = run("plan --model fmnist_cnn");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_contains(r.out, "Parameters: 87274");
  // the layer table: header and one row per layer
  expect_contains(r.out, "parameters");
  expect_contains(r.out, "MACs");
  expect_contains(r.out, "28x28x1");
  expect_contains(r.out, "SoftmaxCE");
  expect_contains(r.out, "Flatten");
  expect_contains(r.out, "Region map");
  expect_contains(r.out, "W_FIRST_CONV");
  expect_contains(r.out, "(first)");
}

TEST(CliPlan, YamlParsesBack) {
  for (const std::string& args :
       {std::string("plan --model resnet18 --yaml"), std::string("plan --model mobilenet_v2 --amp --yaml")}) {
    SCOPED_TRACE(args);
    const Result r = run(args);
    ASSERT_EQ(r.code, 0) << r.err;
    renaissance::plan::ArchPlan p;
    ASSERT_NO_THROW(p = renaissance::plan::ArchPlan::from_yaml(r.out, "stdout"));
    EXPECT_EQ(p.to_yaml(), r.out);
    EXPECT_EQ(p.parameter_count(), args.find("resnet18") != std::string::npos ? 11689512 : 3504872);
  }
}

TEST(CliPlan, ModelFile) {
  const Result r = run("plan --model-file models/tiny_resnet.yaml --json");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_contains(r.out, "\"model\":\"tiny_resnet\"");
  // stem 3·16·9 + 32; res1 2·(16·16·9 + 32); res2 16·32·9 + 64 + 32·32·9 + 64 + 16·32 + 64;
  // res3 32·64·9 + 128 + 64·64·9 + 128 + 32·64 + 128; fc 64·10 + 10
  const double want = (432 + 32) + 2 * (2304 + 32) + (4608 + 64 + 9216 + 64 + 512 + 64) +
                      (18432 + 128 + 36864 + 128 + 2048 + 128) + 650;
  EXPECT_EQ(json_number(r.out, "parameters"), want);
  const Result t = run("plan --model-file models/tiny_resnet.yaml --amp");
  ASSERT_EQ(t.code, 0) << t.err;
  expect_contains(t.out, "BasicBlockIdentity");
  expect_contains(t.out, "BasicBlockProjection");
}

TEST(CliPlan, Failures) {
  {
    const Result r = run("plan --model resnet5");
    EXPECT_NE(r.code, 0);
    expect_contains(r.err, "resnet5");
    expect_contains(r.err, "unknown");
    expect_contains(r.err, "resnet50");  // the known names are listed
  }
  {
    const fs::path f = write_file("malformed.yaml", "name: m\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 4, k: 3\n");
    const Result r = run("plan --model-file '" + f.string() + "'");
    EXPECT_NE(r.code, 0);
    expect_contains(r.err, "malformed.yaml");
  }
  {
    const fs::path f = write_file("negative.yaml",
                                  "name: neg\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 8, k: 3}\n"
                                  "  - conv: {out: -16, k: 3}\n  - gap_fc: {out: 2}\n  - softmax_ce: {classes: 2}\n");
    const Result r = run("plan --model-file '" + f.string() + "'");
    EXPECT_NE(r.code, 0);
    expect_contains(r.err, "negative.yaml");
    expect_contains(r.err, "layers[1]");
    expect_contains(r.err, "out");
  }
  {
    const fs::path f = write_file("add2.yaml",
                                  "name: bad_add\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 8, k: 3, pad: 1}\n"
                                  "  - add2:\n      name: res\n      main:\n        - conv: {out: 16, k: 3, pad: 1}\n"
                                  "        - bn\n      shortcut: []\n  - gap_fc: {out: 2}\n"
                                  "  - softmax_ce: {classes: 2}\n");
    const Result r = run("plan --model-file '" + f.string() + "'");
    EXPECT_NE(r.code, 0);
    expect_contains(r.err, "bad_add");
    expect_contains(r.err, "res");
    expect_contains(r.err, "add2 branches disagree");
  }
  {
    const Result r = run("plan --model resnet18 --optimizer adagrad");
    EXPECT_NE(r.code, 0);
    expect_contains(r.err, "adagrad");
  }
  // Accepted before (found by a review): a negative --start-resolution planned a variant train refuses; --yaml
  // beside the report's options printed only the YAML.
  {
    const Result r = run("plan --start-resolution -5");
    EXPECT_EQ(r.code, 2);
    expect_contains(r.err, "--start-resolution: Value -5 not in range 0 to 1048576");
  }
  for (const std::string other : {"--json", "--pool", "--graph", "--nodes"}) {
    const Result r = run("plan --yaml " + other);
    EXPECT_EQ(r.code, 2) << other;
    expect_contains(r.err, "excludes");  // CLI11 names the pair in the order it met them
    expect_contains(r.err, other);
  }
  // --yaml printed the ArchPlan with exit 0 whatever the options beside it said; they are checked as without it.
  for (const auto& [opt, must] : std::vector<std::pair<std::string, std::string>>{
           {"--batch -5", "--batch must be from 1 to 2^31, got -5"},
           {"--val-size 0", "validation size must be >= 1, got 0"},
           {"--recompute-budget 1", "needs recomputation on (--recompute bn-relu)"}}) {
    const Result r = run("plan --yaml " + opt);
    EXPECT_EQ(r.code, 1) << opt;
    expect_contains(r.err, must);
    EXPECT_EQ(r.out.find("renaissance-arch-plan"), std::string::npos) << opt << ": " << r.out;
  }
  // A negative --resolution was ignored with --model-file (the file's size was planned), refused with --model.
  {
    const Result r = run("plan --model-file models/resnet18_fmnist_narrow.yaml --resolution -3");
    EXPECT_EQ(r.code, 1);
    expect_contains(r.err, "--resolution must be a size > 0 (left out: the model's), got -3");
  }
}

TEST(CliBench, ProfileStepsAreBoundedAsSteps) {
  // --profile-steps 2^63 was accepted and profiled for ever.
  const Result r =
      run("bench --device cpu --model fmnist_cnn --batch 2 --warmup 0 --steps 1 --profile --profile-steps "
          "9223372036854775807");
  EXPECT_EQ(r.code, 2);
  expect_contains(r.err, "--profile-steps: Value 9223372036854775807 not in range 1 to 1073741824");
}

TEST(CliBench, OnOffOptionsRejectOtherValues) {
  for (const std::string opt : {"--graphs", "--fused-kernels", "--streams", "--fold-residual-sums",
                                "--fuse-residual-bn-backward", "--relu-mask", "--fuse-shortcut-bn-backward",
                                "--cpu-winograd", "--conv-stats"}) {
    const Result r = run("bench --device cpu --model fmnist_cnn --batch 8 --warmup 0 --steps 1 " + opt + " maybe");
    EXPECT_EQ(r.code, 2) << opt;  // a usage error
    expect_contains(r.err, opt + (opt == "--conv-stats" ? ": maybe not in {auto,on,off}" : ": maybe not in {on,off}"));
  }
  // On the CPU the GPU switches change nothing; the run still works and reports them (streams off by default,
  // conv-stats too in deterministic mode; --conv-stats auto takes it with --deterministic off).
  const Result ok = run("bench --device cpu --model fmnist_cnn --batch 8 --warmup 0 --steps 1 --fused-kernels off "
                        "--streams on --deterministic off --json");
  EXPECT_EQ(ok.code, 0) << ok.err;
  expect_contains(ok.out, "\"fused_kernels\":false");
  expect_contains(ok.out, "\"streams\":true");
  expect_contains(ok.out, "\"conv_stats\":true");
  const Result dflt = run("bench --device cpu --model fmnist_cnn --batch 8 --warmup 0 --steps 1 --json");
  EXPECT_EQ(dflt.code, 0) << dflt.err;
  expect_contains(dflt.out, "\"streams\":false");
  expect_contains(dflt.out, "\"conv_stats\":false");
  // --conv-stats on with --deterministic on (the default) asks for bits that do not repeat: refused before any work.
  const Result det = run("bench --device cpu --model fmnist_cnn --batch 8 --warmup 0 --steps 1 --conv-stats on");
  EXPECT_EQ(det.code, 1) << det.err;
  expect_contains(det.err, "--conv-stats: on needs --deterministic off");
}

TEST(CliPlan, NodesPrintsTheFusedPasses) {
  // The compiler's fused passes with named operands (plan/fusion.cpp), the plain parts each fused node keeps.
  const Result r = run("plan --model resnet18_cifar --amp --nodes");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_contains(r.out, "Fused nodes (plan/fusion.cpp; --fused-kernels on)");
  expect_contains(r.out, "train FIRST_LAYER_FWD_A FUSED_FWD (cbr1): 3 parts, 1 fused passes");
  expect_contains(r.out, "BN_RELU (parts 1,2) in x=cbr1.conv.y, gamma=cbr1.bn.gamma");
  expect_contains(r.out, "BN_BN_ADD_RELU");
  expect_contains(r.out, "shortcut.x=");
  expect_contains(r.out, "BN_STATS");
  expect_contains(r.out, "RELU_BN_BWD");
  expect_contains(r.out, "CONV_FWD in input.a.data, cbr1.conv.w.fp16 -> out cbr1.conv.y");
  // --fused-kernels off: the same nodes, no passes
  const Result off = run("plan --model resnet18_cifar --amp --nodes --fused-kernels off");
  ASSERT_EQ(off.code, 0) << off.err;
  expect_contains(off.out, "--fused-kernels off");
  expect_contains(off.out, "fused passes: none");
  EXPECT_EQ(off.out.find("BN_RELU"), std::string::npos);
  for (const std::string cmd : {"plan --model fmnist_cnn", "train --device cpu --model fmnist_cnn --max-steps 1"}) {
    const Result bad = run(cmd + " --fused-kernels maybe");
    EXPECT_EQ(bad.code, 2) << cmd;  // a usage error
    expect_contains(bad.err, "renaissance: error:");
    expect_contains(bad.err, "--fused-kernels: maybe not in {on,off}");
  }
}

TEST(CliPlan, RecomputeShrinksTheArenaAndShowsItsPasses) {
  // --recompute bn-relu (plan/recompute.h): the same model in a smaller arena, the recompute passes in --nodes, the
  // copies in --pool; bench reports the setting; a value outside {off,bn-relu} is a usage error.
  auto arena = [](const Result& r) {
    const auto at = r.out.find("\"arena_bytes\":");
    EXPECT_NE(at, std::string::npos) << r.out.substr(0, 300);
    return at == std::string::npos ? 0LL : std::stoll(r.out.substr(at + 14));
  };
  const Result kept = run("plan --model mobilenet_v2 --resolution 64 --batch 32 --amp --json");
  const Result again = run("plan --model mobilenet_v2 --resolution 64 --batch 32 --amp --json --recompute bn-relu");
  ASSERT_EQ(kept.code, 0) << kept.err;
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_LT(arena(again), arena(kept));
  const Result nodes = run("plan --model mobilenet_v2 --resolution 64 --batch 32 --amp --nodes --pool --recompute bn-relu");
  ASSERT_EQ(nodes.code, 0) << nodes.err;
  expect_contains(nodes.out, "BN_RELU_RECOMPUTE (parts ");
  expect_contains(nodes.out, "invresidualidentity1.expand_relu.y.recomputed");
  const Result bench = run("bench --device cpu --model fmnist_cnn --batch 8 --warmup 0 --steps 1 --amp --recompute bn-relu "
                           "--json");
  ASSERT_EQ(bench.code, 0) << bench.err;
  expect_contains(bench.out, "\"recompute\":\"bn-relu\"");
  for (const std::string cmd : {"plan --model fmnist_cnn", "train --device cpu --model fmnist_cnn --max-steps 1",
                                "bench --device cpu --model fmnist_cnn --steps 1"}) {
    const Result bad = run(cmd + " --recompute all");
    EXPECT_EQ(bad.code, 2) << cmd;
    expect_contains(bad.err, "--recompute: all not in {off,bn-relu}");
    // --recompute-budget: a size with a binary unit; a bad size is a usage error naming it, a budget without
    // recomputation an error before any work
    const Result unit = run(cmd + " --recompute bn-relu --recompute-budget 5XB");
    EXPECT_EQ(unit.code, 2) << cmd;
    expect_contains(unit.err, "--recompute-budget: '5XB': unknown unit 'XB'");
    const Result neg = run(cmd + " --recompute bn-relu --recompute-budget -1G");
    EXPECT_EQ(neg.code, 2) << cmd;
    const Result alone = run(cmd + " --recompute-budget 1GiB");
    EXPECT_EQ(alone.code, 1) << cmd << alone.err;
    expect_contains(alone.err, "needs recomputation on (--recompute bn-relu)");
  }
  // Within a budget: the fewest recomputed values, reported; the arena within it.
  const long long budget = (arena(kept) + arena(again)) / 2;
  const Result part = run("plan --model mobilenet_v2 --resolution 64 --batch 32 --amp --json --recompute bn-relu "
                          "--recompute-budget " + std::to_string(budget));
  ASSERT_EQ(part.code, 0) << part.err;
  EXPECT_LE(arena(part), budget);
  EXPECT_GT(json_number(part.out, "recomputed"), 0.0);
  EXPECT_LT(json_number(part.out, "recomputed"), json_number(again.out, "recomputed"));
  const Result text =
      run("plan --model mobilenet_v2 --resolution 64 --batch 32 --amp --recompute bn-relu "
          "--recompute-budget " +
          std::to_string(budget));
  ASSERT_EQ(text.code, 0) << text.err;
  expect_contains(text.out, "(the fewest that keep the arena within --recompute-budget ");
  // A budget no plan meets: every value is recomputed, and the report says the arena stays above it (it said "the
  // fewest that keep the arena within" it).
  const Result over =
      run("plan --model mobilenet_v2 --resolution 64 --batch 32 --amp --recompute bn-relu "
          "--recompute-budget 1.5MiB");
  ASSERT_EQ(over.code, 0) << over.err;
  expect_contains(over.out, "(all of them: the arena stays above --recompute-budget 1.50 MiB)");
}

// Usage errors: `renaissance: error:`, a "did you mean" for a near miss, exit 2; a bare `renaissance` prints help.
TEST(CliUsage, BareCommandPrintsHelp) {
  const Result r = run("");
  EXPECT_EQ(r.code, 0) << r.err;
  expect_contains(r.out, "Usage: renaissance");
  expect_contains(r.out, "train");
  expect_contains(r.out, "predict");
}

TEST(CliUsage, NearMissesExitTwoWithASuggestion) {
  struct Case {
    std::string args, error, hint;
  };
  for (const Case& c : std::vector<Case>{
           {"trian", "renaissance: error: unknown command 'trian'", "did you mean 'renaissance train'?"},
           {"train --epoch 3", "renaissance: error: train: unknown option '--epoch'", "did you mean '--epochs'?"},
           {"train --max-step 3", "unknown option '--max-step'", "did you mean '--max-steps'?"},
           {"data improt", "unknown command 'improt'", "did you mean 'renaissance data import'?"},
           {"data import fashion-mnst", "unknown command 'fashion-mnst'",
            "did you mean 'renaissance data import fashion-mnist'?"},
           {"plan --modle resnet18", "unknown option '--modle'", "did you mean '--model'?"},
           {"--verison", "renaissance: error: unknown option '--verison'", "did you mean '--version'?"},
       }) {
    const Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    expect_contains(r.err, c.error);
    expect_contains(r.err, c.hint);
  }
}

// Log lines go to stderr, through the one logger main() installs: stdout carries only results (--json lines, tables).
// The library once compiled its log calls without spdlog's compiled-library definitions: they went through a second,
// header-only default logger, onto stdout, on a machine with another spdlog (Ubuntu 24.04's 1.12).
TEST(CliUsage, LogLinesGoToStderrThroughTheNamedLogger) {
  const fs::path data = temp_dir() / "logs.h5", ck = temp_dir() / "logs_ck";
  fs::remove_all(ck);
  ASSERT_EQ(
      run("data synthetic --out '" + data.string() + "' --train 96 --val 32 --shape 28,28,1 --classes 10 --seed 1")
          .code,
      0);
  const Result r = run("train --device cpu --data '" + data.string() + "' --epochs 1 --batch 32 --checkpoint-dir '" +
                       ck.string() + "' --keep-best val_top1");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_contains(r.err, "[renaissance] [info] best val_top1 so far");
  EXPECT_EQ(r.out.find("[info]"), std::string::npos) << r.out;
}

// A value outside an option's set, or a malformed range, is a usage error too: exit 2, the option and the value named,
// before any work (no data imported, no model built).
TEST(CliUsage, MalformedValuesExitTwoNamingTheOption) {
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"train --device gpuu", "--device: gpuu not in {cpu,cuda,auto}"},
           {"bench --device gpuu", "--device: gpuu not in"},
           {"predict --split tset --weights w.h5", "--split: tset not in {train,val}"},
           {"train --schedule cosin", "--schedule: cosin not in"},
           {"train --optimizer adamm", "--optimizer: adamm not in"},
           {"plan --model fmnist_cnn --optimizer adamm", "--optimizer: adamm not in"},
           {"bench --graphs maybe", "--graphs: maybe not in {on,off}"},
           {"bench --streams 1", "--streams: 1 not in {on,off}"},
           {"train --streams 1", "--streams: 1 not in {on,off}"},
           {"train --crop-scale abc", "--crop-scale: 'abc' is not MIN,MAX"},
           {"train --crop-scale 0.5,2", "--crop-scale: '0.5,2': need 0 < MIN <= MAX <= 1"},
           {"train --crop-ratio 2,1", "--crop-ratio: '2,1': need 0 < MIN <= MAX"},
       }) {
    const Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    expect_contains(r.err, "renaissance: error:");
    expect_contains(r.err, c.expect);
  }
}

TEST(CliUsage, OtherUsageErrorsExitTwoWithoutAGuess) {
  {
    const Result r = run("frobnicate");
    EXPECT_EQ(r.code, 2) << r.err;
    expect_contains(r.err, "renaissance: error: unknown command 'frobnicate'");
    EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;
    expect_contains(r.err, "commands: plan, data, train");
  }
  {
    const Result r = run("train --epochs abc");
    EXPECT_EQ(r.code, 2) << r.err;
    expect_contains(r.err, "renaissance: error: train:");
    expect_contains(r.err, "--epochs");
  }
  {
    const Result r = run("data");
    EXPECT_EQ(r.code, 2) << r.err;
    expect_contains(r.err, "'renaissance data' needs a command");
  }
  {
    const Result r = run("train --zzzzzz");
    EXPECT_EQ(r.code, 2) << r.err;
    expect_contains(r.err, "'--zzzzzz' is not an option of 'renaissance train'");
  }
}

// `renaissance plan --graph`: the step schedule bucket by bucket, nodes with tensor names, regions and offsets.
TEST(CliPlan, GraphPrintsTheStepSchedule) {
  const Result r = run("plan --model resnet18_cifar --amp --graph");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_contains(r.out, "Step schedule");
  expect_contains(r.out, "[train step]");
  expect_contains(r.out, "[validation batch]");
  expect_contains(r.out, "ZERO_GRAD on the compute stream");
  expect_contains(r.out, "FIRST_LAYER_FWD_A on the compute stream, input buffer A");
  expect_contains(r.out, "DEEP_COMM on the side stream");
  expect_contains(r.out, "NAN_CHECK_AND_GRAD_SCALING on the compute stream, after joining the side stream");
  expect_contains(r.out, "OPTIMIZER on the update stream");
  // a node with its layer and operands as name:region@offset[shape dtype]
  expect_contains(r.out, "cbr1.conv.w.fp16:A_FIRST_CONV@");
  expect_contains(r.out, "FUSED_FWD cbr1: ");
  expect_contains(r.out, "CONV_FWD cbr1 in input.a.data:I_A_DATA@");
  // the step reads top to bottom: forward before backward before the update
  const auto fwd = r.out.find("FIRST_LAYER_FWD_A on"), deep = r.out.find("DEEP_FWD_BWD on"),
             opt = r.out.find("OPTIMIZER on");
  ASSERT_NE(fwd, std::string::npos);
  EXPECT_LT(fwd, deep);
  EXPECT_LT(deep, opt);
  // without --graph, none of it
  const Result plain = run("plan --model resnet18_cifar --amp");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("Step schedule"), std::string::npos);
}
