// Issue 13, class 5: run.yaml semantics. The command line wins for every key, including --model against a
// model-file in the file (and --model-file against a model); model and model-file together in the file are an
// error, as on the command line; a key set twice is an error naming both lines.
#include "hardening_util.h"

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
