// Issue 13, class 1: bounded parsing through the commands a user runs. A few hundred bytes of YAML whose anchors
// alias anchors ("billion laughs") are refused at once with the file named, by `plan`, `train`, `eval
// --model-file`, `train --config`, and when they sit in a checkpoint's model_yaml (`checkpoint inspect` calls it
// invalid, `eval --checkpoint` refuses it; the same for its arch_plan). Deep nesting names the file and the limit.
#include "hardening_util.h"

#include <renaissance/io/checkpoint.h>

#include <tuple>
#include <vector>

namespace {

using namespace hardening;

std::string laughs_layers(const std::string& indent) {
  std::string s = indent + "- &a0 {seq: [relu, relu, relu, relu, relu, relu, relu, relu, relu, relu]}\n";
  for (int i = 1; i < 9; ++i) {
    s += indent + "- &a" + std::to_string(i) + " {seq: [";
    for (int k = 0; k < 10; ++k) s += (k ? ", *a" : "*a") + std::to_string(i - 1);
    s += "]}\n";
  }
  return s;
}

std::string laughs_model() {
  return "name: lol\ninput: [28, 28, 1]\nlayers:\n" + laughs_layers("  ") +
         "  - gap\n  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n";
}

}  // namespace

TEST(HardeningBounded, BillionLaughsModelIsRefusedQuicklyByEveryCommand) {
  const fs::path d = temp_dir();
  const fs::path model = d / "lol.yaml";
  write_text(model, laughs_model());
  ASSERT_LT(fs::file_size(model), 1000u);
  const std::string data = tiny_data();
  for (const std::string& cmd :
       {"plan --model-file " + model.string(), "train --data " + data + " --model-file " + model.string(),
        "eval --data " + data + " --weights none.h5 --model-file " + model.string()}) {
    SCOPED_TRACE(cmd);
    const CliResult r = run(cmd, 60);
    EXPECT_CLEAN_ERROR(r, model.string() + ":", "more than 1000000 nodes", "billion laughs");
    EXPECT_LT(r.seconds, 10.0);  // it used to grow to 5.8 GB and run until killed
  }
  // The same YAML in run.yaml: refused before any option is applied.
  const fs::path cfg = d / "run.yaml";
  write_text(cfg, "epochs: 1\nx: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + [] {
    std::string s;
    for (int i = 1; i < 8; ++i) {
      s += "x" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
      for (int k = 0; k < 10; ++k) s += std::string(k ? ", " : "") + (i == 1 ? "*a" : "*a" + std::to_string(i - 1));
      s += "]\n";
    }
    return s;
  }());
  const CliResult r = run("train --data " + data + " --config " + cfg.string(), 60);
  EXPECT_CLEAN_ERROR(r, cfg.string() + ":", "more than 1000000 nodes");
  EXPECT_LT(r.seconds, 10.0);
}

TEST(HardeningBounded, DeepNestingNamesTheFileAndTheLimit) {
  const fs::path d = temp_dir();
  const fs::path model = d / "deep.yaml";
  write_text(model, "name: deep\ninput: [28, 28, 1]\nlayers: " + std::string(3000, '[') + std::string(3000, ']') + "\n");
  const CliResult r = run("plan --model-file " + model.string());
  EXPECT_CLEAN_ERROR(r, model.string() + ":3", "deeper than 100 levels", "(the limit)");
}

TEST(HardeningBounded, AnAliasInsideTheNodeItNamesIsACycleAndIsRefused) {
  // yaml-cpp registers an anchor when its list or map opens: `&a [*a]` builds a node that contains itself, and
  // the model parser recursed on it until the stack ran out (found by fuzz_blueprint_yaml).
  const fs::path d = temp_dir();
  const fs::path model = d / "cycle.yaml";
  write_text(model,
             "name: cycle\ninput: [28, 28, 1]\nlayers:\n  - &a {seq: [relu, *a]}\n  - gap\n"
             "  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n");
  const CliResult r = run("plan --model-file " + model.string(), 60);
  EXPECT_CLEAN_ERROR(r, model.string() + ":4", "contains it (a cycle)");
  const fs::path cfg = d / "run.yaml";
  write_text(cfg, "epochs: 1\nx: &x\n  y: [*x]\n");
  const CliResult c = run("train --data " + tiny_data() + " --config " + cfg.string(), 60);
  EXPECT_CLEAN_ERROR(c, cfg.string() + ":3", "contains it (a cycle)");
  // An alias to a complete node is still allowed: a repeated block is what anchors are for.
  write_text(model,
             "name: twice\ninput: [28, 28, 1]\nlayers:\n  - &b {seq: [relu, relu]}\n  - *b\n  - gap\n"
             "  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n");
  const CliResult ok = run("plan --model-file " + model.string(), 60);
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(HardeningBounded, ACheckpointWhoseModelYamlExpandsIsNotValid) {
  const fs::path d = temp_dir();
  const CliResult train = run("train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32 --checkpoint-dir " +
                        (d / "ck").string());
  ASSERT_EQ(train.code, 0) << train.out;
  // A checkpoint whose every checksum is right but whose model_yaml is a billion laughs.
  renaissance::io::Checkpoint ck = renaissance::io::read_checkpoint((d / "ck" / "latest.h5").string());
  ck.state.model_yaml = laughs_model();
  const fs::path bad = d / "laughs.h5";
  renaissance::io::write_checkpoint(bad.string(), ck);
  const CliResult inspect = run("checkpoint inspect " + bad.string(), 60);
  EXPECT_CLEAN_ERROR(inspect, "INVALID", bad.string() + ": model_yaml:", "more than 1000000 nodes");
  EXPECT_EQ(inspect.out.find("valid ("), std::string::npos) << inspect.out;
  EXPECT_LT(inspect.seconds, 10.0);
  const CliResult eval = run("eval --data " + tiny_data() + " --checkpoint " + bad.string(), 60);
  EXPECT_CLEAN_ERROR(eval, bad.string() + ": model_yaml:", "more than 1000000 nodes");
  EXPECT_LT(eval.seconds, 10.0);
  // With --model too (the recorded YAML was only read without it, and the file was scored).
  const CliResult eval_model =
      run("eval --data " + tiny_data() + " --model fmnist_cnn --checkpoint " + bad.string(), 60);
  EXPECT_CLEAN_ERROR(eval_model, bad.string() + ": model_yaml:", "more than 1000000 nodes");
  // The same for its arch plan: eval builds the model from model_yaml, but a checkpoint that inspect calls INVALID
  // is not scored either (eval used to score it).
  ck = renaissance::io::read_checkpoint((d / "ck" / "latest.h5").string());
  ck.state.arch_plan = laughs_model();
  const fs::path bad_arch = d / "laughs-arch.h5";
  renaissance::io::write_checkpoint(bad_arch.string(), ck);
  const CliResult inspect_arch = run("checkpoint inspect " + bad_arch.string(), 60);
  EXPECT_CLEAN_ERROR(inspect_arch, "INVALID", bad_arch.string() + ": arch_plan:", "more than 1000000 nodes");
  const CliResult eval_arch = run("eval --data " + tiny_data() + " --checkpoint " + bad_arch.string(), 60);
  EXPECT_CLEAN_ERROR(eval_arch, bad_arch.string() + ": arch_plan:", "more than 1000000 nodes");
  const CliResult eval_arch_model =
      run("eval --data " + tiny_data() + " --model fmnist_cnn --checkpoint " + bad_arch.string(), 60);
  EXPECT_CLEAN_ERROR(eval_arch_model, bad_arch.string() + ": arch_plan:", "more than 1000000 nodes");
  // The untouched checkpoint is valid: the check is not a blanket refusal.
  const CliResult good = run("checkpoint inspect " + (d / "ck" / "latest.h5").string());
  EXPECT_EQ(good.code, 0) << good.out;
  EXPECT_NE(good.out.find("valid ("), std::string::npos) << good.out;
}

TEST(HardeningBounded, AnAbsurdBatchIsRefusedInsteadOfWrappingAround) {
  // plan --batch 9e15 used to print a negative region (int64 overflow); 2e9 samples of 224x224x3 a 24 GiB "arena".
  EXPECT_CLEAN_ERROR(run("plan --model vgg16 --batch 9000000000000000 --dataset-size 9000000000000000"),
                     "batch must be from 1 to 2^31, got 9000000000000000");
  EXPECT_CLEAN_ERROR(run("plan --model vgg16 --batch 2000000000 --dataset-size 2000000000"), "more than 2^46 elements");
  const CliResult ok = run("plan --model resnet50 --batch 1000000 --dataset-size 1000000");
  EXPECT_EQ(ok.code, 0) << ok.out;  // big, but representable
}

TEST(HardeningBounded, AnArenaLargerThanTheHostIsRefusedBeforeAnyWork) {
  // bench used to write its synthetic batch first (15 GB for ResNet-50 at batch 100,000) and then fail inside the
  // allocation with "std::bad_alloc", leaving the file behind; now the plan is checked first, in well under a second.
  const fs::path d = temp_dir();
  const CliResult bench =
      run_shell("TMPDIR=" + d.string() + " exec " + cli() + " bench --model resnet50 --batch 100000 --device cpu", 60);
  EXPECT_CLEAN_ERROR(bench, "host memory", "model 'resnet50' (batch 100000, fp32)", "of host memory for its arena",
                     "--batch");
  EXPECT_LT(bench.seconds, 10.0);
  EXPECT_TRUE(fs::is_empty(d)) << "bench left its temporary directory behind";
  // (train makes the same check, Trainer::check_memory's, before it allocates; its plan is sized by the dataset,
  // so a test of it would need a dataset larger than the test machine's memory allows.)
}

TEST(HardeningBounded, ABatchLargerThanTheSplitTrainsOnePartialBatch) {
  // The loader sized its buffers by --batch: 2e9 samples of 28x28 were a 1.5 TB allocation and "std::bad_alloc".
  const CliResult r = run("train --data " + tiny_data() + " --device cpu --batch 2000000000 --epochs 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("done: 1 steps"), std::string::npos) << r.out;
}

TEST(HardeningBounded, AnImageOfFourGiBOrMoreIsRefusedBeforeTheFileExists) {
  // HDF5's own "number of elements in chunk must be < 4GB" used to be the message, after the file was created.
  const fs::path d = temp_dir();
  const fs::path out = d / "x.h5";
  EXPECT_CLEAN_ERROR(run("data synthetic --out " + out.string() +
                         " --train 10 --val 10 --shape 100000,100000,3 --classes 10"),
                     out.string(), "one image of 100000x100000x3 is 27.9 GiB", "less than 4 GiB");
  EXPECT_FALSE(fs::exists(out));
}

// Found by a hunt of model files: repeats of repeats of an empty body added no layer, so the layer cap never fired
// and `plan` walked for hours; a 20x36 input was planned and trained as 20x20; 17 channels passed `plan` and `data
// synthetic` and failed only after the trainer's start-up; a convolution's MACs overflowed int64 (a negative GMACs
// figure); a 3 GB model or run.yaml file ended in "std::bad_alloc". Each is an error at once naming the file.
TEST(HardeningBounded, ModelsThePlannerCannotTakeAreRefusedAtOnceNamingTheFile) {
  const fs::path d = temp_dir();
  const std::string tail = "  - gap\n  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n";
  for (const auto& [name, text, words] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"empty_repeats.yaml",
            "name: r\ninput: [28, 28, 1]\nlayers:\n  - repeat: {n: 100000, layer: {repeat: {n: 100000, layer: "
            "{repeat: {n: 100000, layer: []}}}}}\n" +
                tail,
            "the model expands to more than 400000 nodes"},
           {"rect.yaml", "name: r\ninput: [20, 36, 1]\nlayers:\n  - conv: {out: 8, k: 3, pad: 1}\n" + tail,
            "rect.yaml:2: input [20, 36, 1]: only square inputs are supported"},
           {"c17.yaml", "name: r\ninput: [8, 8, 17]\nlayers:\n  - conv: {out: 8, k: 3, pad: 1}\n" + tail,
            "c17.yaml:2: input [8, 8, 17]: at most 16 image channels are supported"},
           {"macs.yaml",
            "name: r\ninput: [1024, 1024, 16]\nlayers:\n  - conv: {out: 1024, k: 1024, stride: 1, pad: 131071}\n" +
                tail,  // 1.2e21: past int64
            "multiply-accumulates per sample is more than"}}) {
    SCOPED_TRACE(name);
    write_text(d / name, text);
    const CliResult r = run("plan --model-file " + (d / name).string(), 60);
    EXPECT_CLEAN_ERROR(r, (d / name).string() + ":", words);
    EXPECT_LT(r.seconds, 10.0);
  }
  EXPECT_CLEAN_ERROR(
      run("data synthetic --out " + (d / "c17.h5").string() + " --train 8 --val 8 --shape 8,8,17 --classes 10"),
      "--shape: '8,8,17': at most 16 image channels are supported");
  EXPECT_FALSE(fs::exists(d / "c17.h5"));
  // A sparse 3 GB file: refused by its size before a byte is read.
  const fs::path big = d / "big.yaml";
  { std::ofstream(big) << "name: x\n"; }
  fs::resize_file(big, std::uintmax_t{3} << 30);
  for (const std::string& cmd : {"plan --model-file " + big.string(), "train --config " + big.string()}) {
    SCOPED_TRACE(cmd);
    const CliResult r = run(cmd, 60);
    EXPECT_CLEAN_ERROR(r, big.string() + ":", "3221225472 bytes is more than the 64 MiB a YAML input may have");
    EXPECT_LT(r.seconds, 10.0);
  }
  fs::remove(big);
}
