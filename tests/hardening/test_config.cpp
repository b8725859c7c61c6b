// Issue 13, class 5: run.yaml semantics. The command line wins for every key, including --model against a
// model-file in the file (and --model-file against a model); model and model-file together in the file are an
// error, as on the command line; a key set twice is an error naming both lines.
#include "hardening_util.h"

#include <kernels/cpu/gemm.h>

namespace {

using namespace hardening;

}  // namespace

TEST(HardeningConfig, TheCommandLineWinsForEveryKeyIncludingTheModelPair) {
  const fs::path d = temp_dir();
  write_text(d / "m.yaml", "name: from_file\ninput: [28, 28, 1]\nlayers:\n  - cbr: {out: 4, k: 3, pad: 1}\n  - gap\n"
                           "  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n");
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 ";
  write_text(d / "file_model.yaml", "model-file: " + (d / "m.yaml").string() + "\nlr: 0.5\n");
  CliResult r = run(train + "--config " + (d / "file_model.yaml").string() + " --model fmnist_cnn --lr 0.02");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training fmnist_cnn on"), std::string::npos) << r.out;  // not from_file
  EXPECT_NE(r.out.find("lr 0.02 "), std::string::npos) << r.out;
  write_text(d / "zoo_model.yaml", "model: resnet18_fmnist\n");
  r = run(train + "--config " + (d / "zoo_model.yaml").string() + " --model-file " + (d / "m.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training from_file on"), std::string::npos) << r.out;
  // Without a model on the command line the file's applies.
  r = run(train + "--config " + (d / "file_model.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training from_file on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr 0.5 "), std::string::npos) << r.out;
}

// A NUL in a quoted value ("w.h5\0.bak") cut every path at it without a word (`save:` then replaced w.h5), and in a
// key it cut the error message short; control characters in keys and values reached the terminal raw.
TEST(HardeningConfig, NulAndControlCharactersAreRefusedNamingTheLine) {
  const fs::path d = temp_dir();
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --config ";
  write_text(d / "victim.h5", "keep me");
  write_text(d / "nul.yaml", "epochs: 1\nsave: \"" + (d / "victim.h5").string() + "\\0.bak\"\n");
  CliResult r = run(train + (d / "nul.yaml").string());
  EXPECT_CLEAN_ERROR(r, (d / "nul.yaml").string() + ":2", "option 'save': the value '", "\\x00.bak' holds a NUL");
  EXPECT_EQ(read_text(d / "victim.h5"), "keep me");
  write_text(d / "key.yaml", "\"ep\\e[31mochs\\0x\": 1\n");
  r = run(train + (d / "key.yaml").string());
  EXPECT_CLEAN_ERROR(r, (d / "key.yaml").string() + ":1",
                     "option names must be plain words, got 'ep\\x1b[31mochs\\x00x'");
  write_text(d / "esc.yaml", "optimizer: \"\\e[2Jadam\"\n");
  r = run(train + (d / "esc.yaml").string());
  EXPECT_CLEAN_ERROR(r, (d / "esc.yaml").string() + ":1", "\\x1b[2Jadam");
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
}

// A value of the file out of its range is named by file:line as its parse errors are (`lr: 1e400` said only
// "--lr must be ..."); the same value on the command line names the option alone.
TEST(HardeningConfig, AValueOutOfRangeInTheFileNamesItsLine) {
  const fs::path d = temp_dir();
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --config ";
  write_text(d / "lr.yaml", "epochs: 1\nlr: 1e400\n");
  EXPECT_CLEAN_ERROR(run(train + (d / "lr.yaml").string()),
                     (d / "lr.yaml").string() + ":2: --lr must be a finite number > 0, got '1e400'");
  const CliResult cli = run(train + (d / "lr.yaml").string() + " --lr -1");
  EXPECT_CLEAN_ERROR(cli, "--lr must be a finite number > 0, got '-1'");
  EXPECT_EQ(cli.out.find("lr.yaml:"), std::string::npos) << cli.out;
}

TEST(HardeningConfig, ModelAndModelFileTogetherOrAKeySetTwiceAreErrorsNamingTheLines) {
  const fs::path d = temp_dir();
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --config ";
  write_text(d / "both.yaml", "epochs: 1\nmodel: fmnist_cnn\nmodel-file: m.yaml\n");
  CliResult r = run(train + (d / "both.yaml").string());
  EXPECT_CLEAN_ERROR(r, (d / "both.yaml").string() + ":3", "'model' (line 2) and 'model-file' cannot both be set");
  write_text(d / "twice.yaml", "lr: 0.1\nepochs: 1\nlr: 0.2\n");
  r = run(train + (d / "twice.yaml").string());
  EXPECT_CLEAN_ERROR(r, (d / "twice.yaml").string() + ":3", "option 'lr' is set twice (lines 1 and 3)");
  // Even when the command line sets it: the file itself is wrong.
  r = run(train + (d / "twice.yaml").string() + " --lr 0.3");
  EXPECT_CLEAN_ERROR(r, "option 'lr' is set twice (lines 1 and 3)");
  r = run(train + d.string());
  EXPECT_CLEAN_ERROR(r, d.string() + ": --config: is a directory, not a file");
  // validate and no-validate exclude each other the same way (the file's no-validate beat --validate last).
  write_text(d / "both_validate.yaml", "validate: last\nno-validate: true\n");
  r = run(train + (d / "both_validate.yaml").string());
  EXPECT_CLEAN_ERROR(r, "both_validate.yaml:2", "'validate' (line 1) and 'no-validate' cannot both be set");
  write_text(d / "no_validate.yaml", "no-validate: true\n");
  r = run(train + (d / "no_validate.yaml").string() + " --validate last");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("(no validation)"), std::string::npos) << "the command line's --validate last wins:\n" << r.out;
  EXPECT_NE(r.out.find("val_top1"), std::string::npos) << r.out;
}

// Found by a hostile-input hunt: integers with a leading zero were read as octal (CLI11 converts with base 0:
// "--epochs 010" trained 8 epochs, "09" was refused), on the command line and in run.yaml; a flag in run.yaml took
// any number (-1 off, 5 on) and 'help: true' was accepted; --classes was ignored with --model-file by train, eval
// and predict.
TEST(HardeningConfig, IntegersAreDecimalFlagsAreBooleansAndModelFilesKeepTheirClasses) {
  const fs::path d = temp_dir();
  const std::string train = "train --data " + tiny_data() + " --max-steps 1 --no-validate ";
  CliResult r = run(train + "--epochs 010 --batch 032");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("10 epochs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch 32,"), std::string::npos) << r.out;
  r = run(train + "--epochs 09 --batch 32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("9 epochs"), std::string::npos) << r.out;
  // Options with a range check too (CLI11 names their type "INT:INT in [...]"), the seed among them.
  r = run("data synthetic --out " + (d / "s.h5").string() + " --train 010 --val 010 --shape 28,28,1 --classes 010");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train 10, val 10 samples of 28x28x1, 10 classes"), std::string::npos) << r.out;
  ASSERT_EQ(run(train + "--batch 32 --seed 010 --checkpoint-dir " + (d / "ck").string()).code, 0);
  r = run("checkpoint inspect " + (d / "ck" / "latest.h5").string());
  EXPECT_NE(r.out.find("seed          10\n"), std::string::npos) << r.out;
  write_text(d / "octal.yaml", "epochs: 010\nbatch: 032\n");
  r = run(train + "--config " + (d / "octal.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("10 epochs"), std::string::npos) << r.out;
  for (const char* bad : {"ema: -1\n", "drop-last: 5\n", "no-flip: maybe\n"}) {
    write_text(d / "flag.yaml", bad);
    r = run(train + "--batch 32 --config " + (d / "flag.yaml").string());
    EXPECT_CLEAN_ERROR(r, "flag.yaml:1", "is a flag: true or false (yes/no, on/off, y/n), got");
  }
  write_text(d / "flag.yaml", "drop-last: yes\nema: n\n");
  r = run(train + "--batch 32 --config " + (d / "flag.yaml").string());
  EXPECT_EQ(r.code, 0) << r.out;
  write_text(d / "help.yaml", "help: true\n");
  r = run(train + "--batch 32 --config " + (d / "help.yaml").string());
  EXPECT_CLEAN_ERROR(r, "help.yaml:1", "'help' cannot be set from a configuration file");
  // --classes with a model file whose softmax_ce has other classes: refused by every command that builds a model,
  // before any work (train, eval and predict ignored it; plan failed on a shape).
  const std::string model = " --model-file " + std::string(RENAISSANCE_SOURCE_DIR) + "/models/fmnist_cnn.yaml";
  for (const std::string& cmd : {train + "--batch 32" + model, "plan" + model, "bench --device cpu --steps 1" + model,
                                 "eval --data " + tiny_data() + " --weights w.h5" + model}) {
    r = run(cmd + " --classes 3");
    EXPECT_CLEAN_ERROR(r, "fmnist_cnn.yaml", "--classes 3: the model file's softmax_ce has 10 classes");
  }
  // A model file without a loss gets it from --classes, in train as in plan.
  write_text(d / "noloss.yaml", "name: noloss\ninput: [28, 28, 1]\nlayers:\n  - cbr: {out: 4, k: 3, pad: 1}\n"
                                "  - gap\n  - fc: {out: 10}\n");
  r = run(train + "--batch 32 --model-file " + (d / "noloss.yaml").string());
  EXPECT_CLEAN_ERROR(r, "no number of classes was given");
  r = run(train + "--batch 32 --model-file " + (d / "noloss.yaml").string() + " --classes 10");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(run("plan --model-file " + (d / "noloss.yaml").string() + " --classes 10").code, 0);
  // --resolution reaches a model file (it was ignored by train): 32x32 against a 28x28 data set.
  r = run(train + "--batch 32" + model + " --resolution 32");
  EXPECT_CLEAN_ERROR(r, "images are 28x28 but model 'fmnist_cnn' expects 32x32");
}

TEST(HardeningConfig, BenchTimeoutsAndDecodeCountsAreChecked) {
  for (const std::string& t : std::vector<std::string>{"0", "-1", "nan"}) {
    const CliResult r = run("bench --device cpu --model fmnist_cnn --batch 8 --steps 1 --comm-timeout " + t);
    EXPECT_CLEAN_ERROR(r, "--comm-timeout must be a number of seconds > 0");
  }
  // --steps and --warmup while parsing (they failed after the start-up naming no option; 2^63 ran for ever).
  for (const std::string& s :
       std::vector<std::string>{"--steps 0", "--warmup -1", "--steps 9223372036854775807", "--warmup 2000000000"}) {
    const CliResult b = run("bench --device cpu --model fmnist_cnn --batch 8 " + s);
    EXPECT_EQ(b.code, 2) << b.out;
    EXPECT_NE(b.out.find(s.substr(0, s.find(' ')) + ": Value"), std::string::npos) << b.out;
    EXPECT_EQ(b.out.find("start-up"), std::string::npos) << b.out;
  }
  const CliResult r = run("data bench-decode " + tiny_data() + " --device cpu --images -5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--images"), std::string::npos) << r.out;
  // An empty --tensorboard (run.yaml: tensorboard: "") wrote no events without a word.
  CliResult tb = run("train --data " + tiny_data() + " --max-steps 1 --tensorboard ''");
  EXPECT_EQ(tb.code, 2) << tb.out;
  EXPECT_NE(tb.out.find("--tensorboard"), std::string::npos) << tb.out;
  const fs::path d = temp_dir();
  write_text(d / "tb.yaml", "tensorboard: \"\"\n");
  tb = run("train --data " + tiny_data() + " --max-steps 1 --config " + (d / "tb.yaml").string());
  EXPECT_CLEAN_ERROR(tb, "tb.yaml:1", "needs a directory");
}

// The RENAISSANCE_* variables: a value one does not take fell back to its default without a word (Winograd stayed on
// with RENAISSANCE_CPU_WINOGRAD=false, RENAISSANCE_COMM_TIMEOUT=10s gave 300 s); now an error naming it, before any
// work, for every variable the table lists. Unset, empty and valid values run.
TEST(HardeningConfig, EnvironmentVariablesWithValuesTheyDoNotTakeAreErrorsNamingThem) {
  const std::string train =
      cli() + " train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --no-validate";
  for (const std::string bad :
       {"RENAISSANCE_CPU_WINOGRAD=false", "RENAISSANCE_COMM_TIMEOUT=10s", "RENAISSANCE_CPU_THREADS=2x",
        "RENAISSANCE_CPU_THREADS=0", "RENAISSANCE_CPU_THREADS=65536", "RENAISSANCE_CPU_ISA=avx-512",
        "RENAISSANCE_GEMM=mkl", "RENAISSANCE_GEMM_ISA=sse", "RENAISSANCE_HDF5_OPEN_TIMEOUT=abc",
        "RENAISSANCE_DATASET_CACHE_MB=-1", "RENAISSANCE_JPEG_DIRECT_READ=no", "RENAISSANCE_NCCL_LANES=3",
        "RENAISSANCE_MPI=sometimes"}) {
    const std::string name = bad.substr(0, bad.find('='));
    const CliResult r = run_shell("exec env " + bad + " " + train);
    EXPECT_CLEAN_ERROR(r, name + ": '" + bad.substr(bad.find('=') + 1) + "' is not a value it takes");
    EXPECT_EQ(r.out.find("training "), std::string::npos) << bad << ": refused before any work\n" << r.out;
  }
  const CliResult ok = run_shell(
      "exec env RENAISSANCE_CPU_WINOGRAD=off RENAISSANCE_CPU_THREADS=1 "
      "RENAISSANCE_COMM_TIMEOUT=12.5 RENAISSANCE_MPI= " +
      train);
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find(", 1 CPU threads\n"), std::string::npos) << "Winograd off, one thread: " << ok.out;
  // openblas where the build has no OpenBLAS fell back to the own GEMM without a word.
  const CliResult blas = run_shell("exec env RENAISSANCE_GEMM=openblas " + train);
  if (renaissance::cpu::openblas_available())
    EXPECT_EQ(blas.code, 0) << blas.out;
  else
    EXPECT_CLEAN_ERROR(blas, "RENAISSANCE_GEMM: 'openblas' is not a value it takes", "this build has no OpenBLAS");
}

// Numbers are checked as the run holds them (a double, and the float the kernels get): 1e999 was finite as a long
// double and trained with lr inf, 1e-400 and 1e-320 trained with lr 0, 0.99999999 became a momentum of 1.0f; CLI11's
// Range let --onecycle-div nan through to a NaN learning rate at the first step.
TEST(HardeningConfig, NumbersOutsideTheirRangeOnceConvertedAreRefusedBeforeTraining) {
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --no-validate ";
  for (const auto& [opt, must] : std::vector<std::pair<std::string, std::string>>{
           {"--lr 1e999", "--lr must be a finite number > 0"},
           {"--lr 1e-400", "--lr must be a finite number > 0"},
           {"--lr 1e-320", "--lr must be a finite number > 0"},
           {"--momentum 0.99999999", "--momentum must be a number in [0, 1)"},
           {"--weight-decay 1e400", "--weight-decay must be a finite number >= 0"},
           {"--onecycle-div nan", "--onecycle-div must be a number from 1 to 1e9"},
           {"--ema --ema-decay 1e-400", "--ema-decay must be a number in (0, 1)"},
           {"--schedule onecycle --onecycle-momentum 0.99999999,0.99999999", "needs 0 <= BASE <= MAX < 1"}}) {
    const CliResult r = run(train + opt);
    EXPECT_CLEAN_ERROR(r, must);
    EXPECT_EQ(r.out.find("training "), std::string::npos) << opt << ": refused before any work\n" << r.out;
  }
  EXPECT_EQ(run(train + "--lr 1e-30 --momentum 0.9999 --onecycle-div 1e9").code, 0);
  // A number too small for a double is still a number: it reaches the range check (std::stod threw on the
  // underflow, and the option said the text was not MIN,MAX).
  const CliResult tiny = run(train + "--crop random-resized --crop-scale 1e-330,1 --crop-ratio 1e-308,1e-300");
  EXPECT_EQ(tiny.code, 2) << tiny.out;  // a usage error, as CLI11's own
  EXPECT_NE(tiny.out.find("--crop-scale: '1e-330,1': need 0 < MIN <= MAX <= 1"), std::string::npos) << tiny.out;
  EXPECT_EQ(run(train + "--crop random-resized --crop-scale 1e-308,1 --crop-ratio 1e-308,1e-300").code, 0);
}

// A second YAML document in run.yaml (after '---', or text after '...') was ignored without a word; a flag given a
// value on the command line took any integer (--ema=5 on, --no-validate=-5 off); an empty path (--save "") was
// ignored, the run saving nothing. All usage errors naming the file line or the option.
TEST(HardeningConfig, ASecondDocumentAFlagValueOrAnEmptyPathIsRefused) {
  const fs::path d = temp_dir();
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --no-validate ";
  write_text(d / "two.yaml", "lr: 0.05\n---\nlr: 0.01\n");
  EXPECT_CLEAN_ERROR(run(train + "--config " + (d / "two.yaml").string()),
                     (d / "two.yaml").string() + ":3: a run configuration holds one YAML document");
  const auto usage_error = [](const CliResult& r, const std::string& must) {  // exit 2, as CLI11's own
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(must), std::string::npos) << "'" << must << "' not in:\n" << r.out;
  };
  for (const std::string bad : {"--ema=5", "--sync-bn=-1", "--drop-last=maybe"})
    usage_error(run(train + bad), bad.substr(0, bad.find('=')) + ": a flag is on or off");
  EXPECT_EQ(run(train + "--drop-last=false --ema=yes").code, 0);
  for (const std::string opt : {"--save", "--metrics", "--checkpoint-dir", "--config"})
    usage_error(run(train + opt + " ''"), "error: train: " + opt + ": ");  // CLI11: "1 required TEXT missing"
  write_text(d / "empty_save.yaml", "save: ''\n");
  EXPECT_CLEAN_ERROR(run(train + "--config " + (d / "empty_save.yaml").string()), "--save: needs a path");
}

// A recipe's onecycle keys under another --schedule (or an optimizer without momentum) on the command line: the
// comment of warn_inapplicable_options promised that a recipe's keys still work there, yet the run stopped with an
// error. They are left out with a warning; the same options typed on the command line stay errors.
TEST(HardeningConfig, ARecipesOnecycleKeysUnderAnotherScheduleWarn) {
  const fs::path d = temp_dir();
  write_text(d / "recipe.yaml", "onecycle-momentum: 0.85,0.95\nonecycle-pct: 0.25\nlr: 0.05\n");
  const std::string train = "train --data " + tiny_data() +
                            " --epochs 1 --max-steps 1 --batch 32 --no-validate --config " +
                            (d / "recipe.yaml").string() + " ";
  const CliResult cosine = run(train + "--schedule cosine");
  ASSERT_EQ(cosine.code, 0) << cosine.out;
  EXPECT_NE(cosine.out.find("onecycle-pct/onecycle-div have no effect with --schedule cosine"), std::string::npos)
      << cosine.out;
  EXPECT_NE(cosine.out.find("onecycle-momentum has no effect with --schedule cosine"), std::string::npos) << cosine.out;
  const CliResult adam = run(train + "--optimizer adam");
  ASSERT_EQ(adam.code, 0) << adam.out;
  EXPECT_NE(adam.out.find("onecycle-momentum has no effect with --schedule onecycle --optimizer adam"),
            std::string::npos)
      << adam.out;
  EXPECT_CLEAN_ERROR(run("train --data " + tiny_data() + " --max-steps 1 --schedule cosine --onecycle-pct 0.3"),
                     "they need --schedule onecycle");
  // A recipe that sets both contradicts itself: the command line's error (it was a warning, the key dropped).
  write_text(d / "self.yaml", "schedule: cosine\nonecycle-pct: 0.3\n");
  EXPECT_CLEAN_ERROR(run(train.substr(0, train.find("--config")) + "--config " + (d / "self.yaml").string()),
                     "they need --schedule onecycle");
  write_text(d / "self_adam.yaml", "optimizer: adam\nonecycle-momentum: 0.85,0.95\n");
  EXPECT_CLEAN_ERROR(run(train.substr(0, train.find("--config")) + "--config " + (d / "self_adam.yaml").string()),
                     "--optimizer adam has none");
}

// A relative model-file in a configuration is the configuration's own: found beside the file from any directory (an
// installed recipe named models/... only worked from the source tree's root); one not beside it is relative to the
// current directory, as before.
TEST(HardeningConfig, ARelativeModelFileIsFoundBesideTheConfigurationThenInTheCurrentDirectory) {
  const fs::path d = temp_dir();
  const fs::path here = d / "run" / "here";  // ../models from here is no directory: only beside the file is
  fs::create_directories(d / "recipes");
  fs::create_directories(d / "models");
  fs::create_directories(here);
  write_text(d / "models" / "m.yaml",
             "name: beside\ninput: [28, 28, 1]\nlayers:\n  - cbr: {out: 4, k: 3, pad: 1}\n"
             "  - gap\n  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n");
  write_text(here / "c.yaml",
             "name: cwd_relative\ninput: [28, 28, 1]\nlayers:\n  - gap\n"
             "  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n");
  write_text(d / "recipes" / "beside.yaml", "model-file: ../models/m.yaml\n");
  write_text(d / "recipes" / "cwd.yaml", "model-file: c.yaml\n");
  const std::string train = cli() + " train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --config ";
  CliResult r = run_shell("cd " + here.string() + " && exec " + train + (d / "recipes" / "beside.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training beside on"), std::string::npos) << r.out;
  r = run_shell("cd " + here.string() + " && exec " + train + (d / "recipes" / "cwd.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training cwd_relative on"), std::string::npos) << r.out;
  // In neither place: the error names the path as written.
  r = run_shell("cd " + d.string() + " && exec " + train + (d / "recipes" / "cwd.yaml").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("c.yaml: model file"), std::string::npos) << r.out;
}

// OpenBLAS is loaded only when RENAISSANCE_GEMM=openblas asks for it. Linked, its constructor started its thread pool
// in every run, and under `ulimit -v` a pool thread spun forever in its buffer allocation: a run that had stopped
// with "out of host memory" never exited (blas_shutdown joined that thread at exit). The dynamic loader's own log
// (LD_DEBUG=files) says which libraries a run loads.
TEST(HardeningConfig, OpenBlasIsLoadedOnlyWhenItIsAskedFor) {
  if (!renaissance::cpu::openblas_available()) GTEST_SKIP() << "this build has no OpenBLAS";
  const std::string train = cli() + " train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32";
  CliResult r = run_shell("LD_DEBUG=files exec " + train);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("libopenblas"), std::string::npos) << "loaded without being asked for";
  r = run_shell("RENAISSANCE_GEMM=openblas LD_DEBUG=files exec " + train);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("libopenblas"), std::string::npos) << "RENAISSANCE_GEMM=openblas did not load it";
  EXPECT_NE(r.out.find("done: 1 steps"), std::string::npos) << r.out;
}
