// Issue 13, class 7: messages that say what is wrong. A std of 0 or NaN in the dataset is named as such (not "the
// loss diverged: lower --lr"); a directory given as a file is named; a dataset given to --resume says it is not a
// checkpoint; CLI11's range messages print plain integers; resuming with another --epochs, --lr or --data warns,
// as another seed or batch does.
#include "hardening_util.h"

#include <cmath>

namespace {

using namespace hardening;

void set_std(const fs::path& p, float v) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t a = H5Aopen(f, "std", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_FLOAT, &v), 0);
  H5Aclose(a);
  H5Fclose(f);
}

}  // namespace

TEST(HardeningMessages, AStdOfZeroOrNanInTheDatasetIsNamedAsSuch) {
  const fs::path d = temp_dir();
  for (const float v : {0.0f, std::nanf("")}) {
    const fs::path p = d / (std::isnan(v) ? "nan.h5" : "zero.h5");
    fs::copy_file(tiny_data(), p);
    set_std(p, v);
    const CliResult r = run("train --data " + p.string() + " --epochs 1 --batch 32");
    EXPECT_CLEAN_ERROR(r, p.string() + ": attribute 'std' of channel 0 is " + (std::isnan(v) ? "nan" : "0"),
                       "must be finite and > 0");
    EXPECT_EQ(r.out.find("lower --lr"), std::string::npos) << r.out;
    EXPECT_CLEAN_ERROR(run("data inspect " + p.string()), "attribute 'std' of channel 0");
  }
}

// A --resume path that is not there stops `train` before any work: the default data set (imported on first use into
// ./data) is not imported first.
TEST(HardeningMessages, AMissingResumeFileStopsTheRunBeforeTheDefaultImport) {
  const fs::path d = temp_dir() / "resume_missing";
  fs::remove_all(d);
  fs::create_directories(d);
  const CliResult r = run_shell("cd '" + d.string() + "' && exec " + cli() + " train --resume nothing-here.h5");
  EXPECT_CLEAN_ERROR(r, "nothing-here.h5", "--resume: no such file");
  EXPECT_FALSE(fs::exists(d / "data")) << "the default data set was imported before the --resume check";
}

TEST(HardeningMessages, ADirectoryGivenAsAFileIsNamed) {
  const fs::path d = temp_dir();
  const std::string dir = d.string(), data = tiny_data();
  for (const auto& [args, what] : std::vector<std::pair<std::string, std::string>>{
           {"train --data " + dir, "is a directory"},
           {"train --data " + data + " --model-file " + dir, "model file: is a directory, not a file"},
           {"train --data " + data + " --config " + dir, "--config: is a directory, not a file"},
           {"train --data " + data + " --resume " + dir, "--resume: is a directory, not a file"},
           {"eval --data " + data + " --weights " + dir, "weights file: is a directory, not a file"},
           {"eval --data " + data + " --checkpoint " + dir, "checkpoint: is a directory, not a file"},
           {"checkpoint inspect " + dir, "is a directory, not a file"},
           {"data inspect " + dir, "is a directory"},
       }) {
    SCOPED_TRACE(args);
    EXPECT_CLEAN_ERROR(run(args), dir, what);
  }
}

TEST(HardeningMessages, AFileOfAnotherKindSaysWhatItIs) {
  const fs::path d = temp_dir();
  const std::string data = tiny_data();
  EXPECT_CLEAN_ERROR(run("train --data " + data + " --epochs 1 --batch 32 --resume " + data),
                     data + ": it is a Renaissance dataset, not a checkpoint");
  // eval and predict read the weights file before the model's start-up (engine timing on a GPU): no start-up line.
  for (const std::string& cmd : std::vector<std::string>{"eval", "predict --out " + (d / "logits.h5").string()}) {
    const CliResult r = run(cmd + " --data " + data + " --weights " + data);
    EXPECT_CLEAN_ERROR(r, "it is a Renaissance dataset, not a weights file");
    EXPECT_EQ(r.out.find("start-up"), std::string::npos) << "refused before start-up:\n" << r.out;
  }
  const fs::path w = d / "w.h5";
  ASSERT_EQ(run("train --data " + data + " --epochs 1 --max-steps 1 --batch 32 --save " + w.string()).code, 0);
  EXPECT_CLEAN_ERROR(run("eval --data " + data + " --checkpoint " + w.string()), "it is a weights file (--save), not a checkpoint");
  EXPECT_CLEAN_ERROR(run("checkpoint inspect " + w.string()), "not a checkpoint");
}

TEST(HardeningMessages, EmaAskedOfAFileWithoutEmaWeightsIsAnError) {
  // eval/predict --ema on weights or a checkpoint of a run without --ema scored the plain weights as "(EMA)".
  const fs::path d = temp_dir();
  const std::string data = tiny_data(), w = (d / "w.h5").string(), ck = (d / "ck").string();
  ASSERT_EQ(run("train --data " + data + " --epochs 1 --max-steps 1 --batch 32 --save " + w + " --checkpoint-dir " + ck)
                .code,
            0);
  for (const std::string& cmd : std::vector<std::string>{"eval", "predict --out " + (d / "logits.h5").string()}) {
    const CliResult r = run(cmd + " --data " + data + " --weights " + w + " --ema");
    EXPECT_CLEAN_ERROR(r, w + ": --ema: the file has no EMA weights");
    EXPECT_EQ(r.out.find("start-up"), std::string::npos) << "refused before start-up:\n" << r.out;
  }
  EXPECT_CLEAN_ERROR(run("eval --data " + data + " --checkpoint " + ck + "/latest.h5 --ema"),
                     "--ema: the checkpoint has no EMA weights");
  // With EMA weights in the file, --ema scores them.
  ASSERT_EQ(run("train --data " + data + " --epochs 1 --max-steps 1 --batch 32 --ema --save " + w).code, 0);
  const CliResult ok = run("eval --data " + data + " --weights " + w + " --ema");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("(EMA)"), std::string::npos) << ok.out;
}

TEST(HardeningMessages, FileSystemErrorsNameTheVariableOrOption) {
  // std::filesystem's own text ("filesystem error: temp_directory_path: No such file or directory") named neither
  // TMPDIR nor --data, and looked like a crash.
  CliResult r =
      run_shell("TMPDIR=/nonexistent/rn-tmp exec " + cli() + " bench --device cpu --batch 2 --steps 1 --warmup 0");
  EXPECT_CLEAN_ERROR(r, "/nonexistent/rn-tmp", "set TMPDIR to a writable directory");
  EXPECT_EQ(r.out.find("filesystem error"), std::string::npos) << r.out;
  const fs::path d = temp_dir();
  write_text(d / "data", "a file where the default dataset's directory would go\n");
  r = run_shell("cd '" + d.string() + "' && exec " + cli() + " train --max-steps 1");
  EXPECT_CLEAN_ERROR(r, "--data: cannot create the directory for the default dataset", "pass --data FILE");
  EXPECT_EQ(r.out.find("filesystem error"), std::string::npos) << r.out;
}

TEST(HardeningMessages, LayerNamesThatCollideInTheirTensorsSayHowToFixIt) {
  // cbr 'c' names its convolution's weights c.conv.w, as a conv named 'c.conv' does.
  const fs::path d = temp_dir();
  write_text(d / "m.yaml", "name: m\ninput: [8, 8, 2]\nlayers:\n  - cbr: {out: 4, k: 3, name: c}\n"
                           "  - conv: {out: 4, k: 3, pad: 1, name: c.conv}\n  - gap\n  - fc: {out: 10}\n"
                           "  - softmax_ce: {classes: 10}\n");
  EXPECT_CLEAN_ERROR(run("plan --model-file " + (d / "m.yaml").string()), "tensor 'c.conv.w' allocated twice",
                     "rename one of them");
}

// An integer past 64 bits was clamped by CLI11, and the command's own check then quoted the clamped value ("--batch
// 99999999999999999999": "got 9223372036854775807"). A usage error quoting what was written; an option's own check
// (a range, a seed, train's numbers) still speaks first.
TEST(HardeningMessages, AnIntegerPast64BitsIsQuotedAsWritten) {
  const fs::path d = temp_dir();
  const std::string w = " --weights " + (d / "none.h5").string();
  for (const auto& [cmd, must] : std::vector<std::pair<std::string, std::string>>{
           {"eval --data " + tiny_data() + w + " --batch 99999999999999999999",
            "--batch: '99999999999999999999' does not fit in a signed 64-bit integer"},
           {"eval --data " + tiny_data() + w + " --batch -99999999999999999999",
            "--batch: '-99999999999999999999' does not fit in a signed 64-bit integer"},
           {"predict --data " + tiny_data() + w + " --out " + (d / "p.h5").string() + " --first 9223372036854775808",
            "--first: '9223372036854775808' does not fit in a signed 64-bit integer"},
           {"plan --batch 9223372036854775808",
            "--batch: '9223372036854775808' does not fit in a signed 64-bit integer"},
           {"train --data " + tiny_data() + " --epochs 99999999999999999999",
            "--epochs must be an integer from 1 to 1000000, got '99999999999999999999'"},
           {"train --data " + tiny_data() + " --seed 18446744073709551616",
            "--seed: '18446744073709551616' is not a seed"}}) {
    const CliResult r = run(cmd);
    EXPECT_TRUE(r.code == 1 || r.code == 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find(must), std::string::npos) << cmd << "\n" << r.out;
    EXPECT_EQ(r.out.find("9223372036854775807"), std::string::npos) << cmd << "\n" << r.out;
  }
}

TEST(HardeningMessages, RangeMessagesPrintPlainIntegers) {
  const fs::path d = temp_dir();
  for (const char* bad : {"--train 0 --val 1", "--train 5 --val -1", "--train 99999999999999999999 --val 1"}) {
    const CliResult r = run("data synthetic --out " + (d / "x.h5").string() + " " + bad + " --shape 2,2,1 --classes 2");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_LT(r.code, 128) << r.out;
    EXPECT_NE(r.out.find("not in range"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("1797693134862315"), std::string::npos) << "a 309-digit bound:\n" << r.out;
  }
}

TEST(HardeningMessages, ResumingWithAnotherEpochsLrOrDataWarns) {
  const fs::path d = temp_dir();
  const std::string ck = (d / "ck").string();
  ASSERT_EQ(run("train --data " + tiny_data() + " --epochs 2 --max-steps 3 --batch 32 --lr 0.05 --checkpoint-dir " + ck).code, 0);
  const fs::path other = d / "other.h5";
  fs::copy_file(tiny_data(), other);
  const CliResult r = run("train --data " + other.string() + " --epochs 3 --max-steps 4 --batch 32 --lr 0.02 --checkpoint-dir " +
                          ck + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("written with --epochs 2, resumed with --epochs 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("written with --lr 0.05 --schedule onecycle, resumed with --lr 0.02"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("written with --data " + tiny_data() + ", resumed with --data " + other.string()), std::string::npos)
      << r.out;
  // The same options: no such warning (--max-steps 5 for 4 lengthens the onecycle schedule: that one is said).
  const CliResult same = run("train --data " + other.string() + " --epochs 3 --max-steps 5 --batch 32 --lr 0.02 --checkpoint-dir " +
                             ck + " --resume auto");
  ASSERT_EQ(same.code, 0) << same.out;
  for (const char* opt : {"--epochs", "--lr", "--data"})
    EXPECT_EQ(same.out.find(std::string("written with ") + opt), std::string::npos) << same.out;
  EXPECT_NE(same.out.find("written with --max-steps 4, resumed with --max-steps 5: the learning-rate schedule spans 5 "
                          "steps, not the 4"),
            std::string::npos)
      << same.out;
}
