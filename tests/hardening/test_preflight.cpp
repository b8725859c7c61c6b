// Issue 13, class 4: checks before training, not after. Numeric options out of range, output directories that do
// not exist or are not directories, an empty val split, val labels outside the classes: each is refused before the
// first step, naming the option or the split.
#include "hardening_util.h"

#include <renaissance/io/dataset.h>

#include <sys/stat.h>

namespace {

using namespace hardening;

std::string train(const std::string& extra) { return "train --data " + tiny_data() + " --epochs 1 --batch 32 " + extra; }

void expect_refused_before_training(const std::string& args, const std::vector<std::string>& fragments) {
  SCOPED_TRACE(args);
  const CliResult r = run(args);
  EXPECT_EQ(r.code, 1) << r.out;
  for (const std::string& f : fragments) EXPECT_NE(r.out.find(f), std::string::npos) << "'" << f << "' not in:\n" << r.out;
  EXPECT_EQ(r.out.find("training fmnist_cnn on"), std::string::npos) << "refused before the trainer starts:\n" << r.out;
}

}  // namespace

TEST(HardeningPreflight, NumericOptionsOutOfRangeAreRefusedNamingOptionAndValue) {
  for (const auto& [opt, value, words] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--lr", "-0.1", "a finite number > 0"},
           {"--lr", "0", "a finite number > 0"},
           {"--lr", "inf", "a finite number > 0"},
           {"--lr", "nan", "a finite number > 0"},
           {"--label-smoothing", "1", "[0, 1)"},
           {"--label-smoothing", "-0.5", "[0, 1)"},
           {"--ema-decay", "1.5", "(0, 1)"},
           {"--ema-decay", "0", "(0, 1)"},
           {"--crop-padding", "-1", "from 0 (off) to 4096"},
           {"--momentum", "1", "[0, 1)"},
           {"--weight-decay", "-1e-4", ">= 0"},
           {"--warmup-epochs", "-1", "from 0 to 1000000"},
           {"--max-steps", "0", "from 1 to 2^53"},
           {"--comm-timeout", "-5", "> 0"},
           {"--val-batch", "-1", "from 0"},
       }) {
    const std::string args = opt == "--epochs" ? train("") : train(opt + " " + value);
    expect_refused_before_training(args, {opt + " must be a", words, "got '" + value + "'"});
  }
  // A value that overflows its type is reported as written, not as CLI11's clamped 9223372036854775807.
  expect_refused_before_training("train --data " + tiny_data() + " --epochs 99999999999999999999",
                                 {"--epochs must be an integer from 1 to 1000000, got '99999999999999999999'"});
  expect_refused_before_training(train("--schedule step"), {"--schedule step needs --step-epochs >= 1"});
  // The same through run.yaml.
  const fs::path d = temp_dir();
  write_text(d / "run.yaml", "lr: -1\n");
  expect_refused_before_training(train("--config " + (d / "run.yaml").string()), {"--lr must be a finite number > 0, got '-1'"});
  // A seed below 0 or past 2^64 - 1 was taken as 2^64 - 1 without a word (CLI11's conversion); a usage error now.
  for (const std::string seed : {"-1", "18446744073709551616", "99999999999999999999999", "1e3"}) {
    const CliResult r = run(train("--seed " + seed));
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--seed: '" + seed + "' is not a seed (an integer from 0 to 2^64 - 1)"), std::string::npos)
        << r.out;
  }
  write_text(d / "run.yaml", "seed: -1\n");
  const CliResult by_config = run(train("--config " + (d / "run.yaml").string()));
  EXPECT_NE(by_config.code, 0) << by_config.out;
  EXPECT_NE(by_config.out.find("run.yaml:1: option 'seed': --seed: '-1' is not a seed"), std::string::npos)
      << by_config.out;
  EXPECT_EQ(run(train("--max-steps 1 --device cpu --seed 18446744073709551615")).code, 0);  // 2^64 - 1 itself is fine
}

TEST(HardeningPreflight, OutputDirectoriesMustExistAndBeWritable) {
  const fs::path d = temp_dir();
  write_text(d / "file", "x");
  expect_refused_before_training(train("--save /nonexistent/dir/w.h5"), {"--save: the directory '/nonexistent/dir' does not exist"});
  expect_refused_before_training(train("--metrics /nonexistent/m.jsonl"), {"--metrics", "/nonexistent"});
  expect_refused_before_training(train("--loss-log " + d.string()), {"--loss-log: is a directory, not a file"});
  expect_refused_before_training(train("--checkpoint-dir " + (d / "file" / "ck").string()),
                                 {"--checkpoint-dir: cannot create the directory", "is a file"});
  expect_refused_before_training(train("--checkpoint-dir " + (d / "file").string()), {"--checkpoint-dir: is a file, not a directory"});
  // A dangling link into a directory that does not exist passed, and the log failed to open after the start-up.
  fs::create_symlink("../nodir/x.jsonl", d / "dangling.jsonl");
  expect_refused_before_training(train("--loss-log " + (d / "dangling.jsonl").string()),
                                 {"--loss-log", "nodir"});
}

TEST(HardeningPreflight, AnEmptyValSplitOrValLabelsOutOfRangeAreRefusedNamingTheSplit) {
  const fs::path d = temp_dir();
  const fs::path noval = d / "noval.h5";
  renaissance::io::make_synthetic(noval.string(), 100, 0, 28, 28, 1, 10, 1);
  expect_refused_before_training("train --data " + noval.string() + " --epochs 1 --batch 32",
                                 {noval.string() + ": the val split is empty", "--no-validate"});
  EXPECT_EQ(run("train --data " + noval.string() + " --epochs 1 --batch 32 --no-validate").code, 0);
  // A val label of 12 for 10 classes (written behind the writer's back).
  const fs::path bad = d / "badval.h5";
  renaissance::io::make_synthetic(bad.string(), 100, 40, 28, 28, 1, 10, 1);
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t ds = H5Dopen2(f, "/val/labels", H5P_DEFAULT);
    const hid_t fs_ = H5Dget_space(ds);
    const hsize_t at[1] = {17}, one[1] = {1};
    H5Sselect_hyperslab(fs_, H5S_SELECT_SET, at, nullptr, one, nullptr);
    const hid_t ms = H5Screate_simple(1, one, nullptr);
    const int v = 12;
    EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_INT, ms, fs_, H5P_DEFAULT, &v), 0);
    H5Sclose(ms);
    H5Sclose(fs_);
    H5Dclose(ds);
    H5Fclose(f);
  }
  expect_refused_before_training("train --data " + bad.string() + " --epochs 1 --batch 32",
                                 {bad.string() + ": dataset '/val/labels'", "label 12 at index 17 is outside [0, 10)"});
  // eval and predict too, before their inference (they stopped after the whole pass naming "batch 0 sample 17").
  const std::string w = (d / "w.h5").string();
  ASSERT_EQ(
      run("train --data " + noval.string() + " --epochs 1 --max-steps 1 --batch 32 --no-validate --save " + w).code, 0);
  for (const std::string& cmd :
       {"eval --data " + bad.string() + " --weights " + w,
        "predict --split val --data " + bad.string() + " --weights " + w + " --out " + (d / "p.h5").string()}) {
    SCOPED_TRACE(cmd);
    const CliResult r = run(cmd);
    EXPECT_CLEAN_ERROR(r, bad.string() + ": dataset '/val/labels'", "label 12 at index 17 is outside [0, 10)");
  }
  EXPECT_FALSE(fs::exists(d / "p.h5"));
}

TEST(HardeningPreflight, PredictWithoutCountStopsWhereTheSplitEnds) {
  // predict's default of 256 samples asked a 64-sample val split for samples [0, 256) and stopped with an error the
  // user had not asked for; now the default stops at the split's end. An explicit --count beyond it is still an error.
  const fs::path d = temp_dir();
  const std::string w = (d / "w.h5").string(), out = (d / "logits.h5").string();
  ASSERT_EQ(run(train("--max-steps 1 --device cpu --save " + w)).code, 0);
  const CliResult r = run("predict --device cpu --data " + tiny_data() + " --weights " + w + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0) << out;
  const hid_t ds = H5Dopen2(f, "/logits", H5P_DEFAULT);
  const hid_t sp = H5Dget_space(ds);
  hsize_t dims[2] = {0, 0};
  EXPECT_EQ(H5Sget_simple_extent_dims(sp, dims, nullptr), 2);
  EXPECT_EQ(dims[0], 64u);  // tiny_data's val split
  EXPECT_EQ(dims[1], 10u);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  // An explicit --count past the end is refused before the model is built (no start-up line), naming the range.
  for (const auto& [args, range] : std::vector<std::pair<std::string, std::string>>{
           {" --count 65", "samples [0, 65)"},
           {" --first 60 --count 5", "samples [60, 65)"},
           {" --first 60 --count 9223372036854775807", "samples [60, 60 + 9223372036854775807)"}}) {
    const CliResult bad = run("predict --device cpu --data " + tiny_data() + " --weights " + w + args + " --out " + out);
    EXPECT_CLEAN_ERROR(bad, range + " are past the end of the val split (64 samples)");
    EXPECT_EQ(bad.out.find("start-up"), std::string::npos) << "refused before start-up:\n" << bad.out;
  }
  // -1 was the "not given" value, so --count -1 wrote the default range; 0 and -1 are refused alike.
  for (const std::string n : {"0", "-1"}) {
    const CliResult bad =
        run("predict --device cpu --data " + tiny_data() + " --weights " + w + " --count " + n + " --out " + out);
    EXPECT_CLEAN_ERROR(bad, "--count must be >= 1, got " + n);
  }
}

// A FIFO as --data: opening it blocked until something wrote into it (train, eval, predict and data inspect hung,
// past RENAISSANCE_HDF5_OPEN_TIMEOUT). eval --checkpoint without --model ignored --classes and --resolution.
TEST(HardeningPreflight, AFifoAsTheDatasetAndModelOptionsWithoutAModelAreRefused) {
  const fs::path d = temp_dir();
  const std::string fifo = (d / "data.h5").string(), w = (d / "w.h5").string(), ck = (d / "ck").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(run(train("--max-steps 1 --device cpu --save " + w + " --checkpoint-dir " + ck)).code, 0);
  for (const std::string& cmd :
       {"data inspect " + fifo, "train --data " + fifo + " --max-steps 1", "eval --data " + fifo + " --weights " + w,
        "predict --data " + fifo + " --weights " + w + " --out " + (d / "l.h5").string()}) {
    const CliResult r = run(cmd, 30);
    EXPECT_CLEAN_ERROR(r, fifo + ": is not a regular file");
  }
  for (const std::string opt : {" --classes 5", " --resolution 32"}) {
    const CliResult r = run("eval --data " + tiny_data() + " --checkpoint " + ck + "/latest.h5" + opt);
    EXPECT_CLEAN_ERROR(r, "--resolution and --classes shape --model or --model-file");
  }
}

// bench of a model for 1x1 images at --batch 1 wrote a synthetic batch of one value per channel, whose standard
// deviation of 0 the dataset then refused to normalise; `plan --json --pool` printed the JSON and dropped --pool.
TEST(HardeningPreflight, BenchOfATinyInputRunsAndPlanJsonRefusesTheTextOnlyOptions) {
  const fs::path d = temp_dir();
  write_text(d / "tab.yaml",
             "name: tab\ninput: [1, 1, 16]\nlayers: [fc: {out: 32}, relu, fc: {out: 10}, "
             "softmax_ce: {classes: 10}]\n");
  const CliResult b =
      run("bench --device cpu --model-file " + (d / "tab.yaml").string() + " --batch 1 --warmup 1 --steps 2");
  EXPECT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("images/s"), std::string::npos) << b.out;
  for (const char* opt : {"--pool", "--graph", "--nodes"}) {
    const CliResult p = run(std::string("plan --model fmnist_cnn --json ") + opt);
    EXPECT_EQ(p.code, 2) << p.out;
    EXPECT_NE(p.out.find(std::string(opt) + " excludes --json"), std::string::npos) << p.out;
  }
}
