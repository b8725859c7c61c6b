// Issue 13, class 2: corruption that checksums missed. Fletcher32 accepts an all-zero chunk, and HDF5 returns the
// fill value for chunks never written or lying past a truncated end. Checkpoints and weights (format 2) carry a
// checksum header (the whole file and each tensor's stored bytes), datasets (format 2) a CRC-32 per block of
// samples; every dataset's chunks are counted against its extent and the file size is watched while a run reads
// it. Each case names the file, the tensor or dataset and the samples, and nothing prints "verified" for it.
#include "hardening_util.h"

#include <renaissance/io/checkpoint.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/weights.h>

namespace {

using namespace hardening;

/// The first /params tensor with at least 64 values, located in the file by its values.
std::pair<std::string, std::uint64_t> a_tensor(const std::vector<renaissance::io::NamedTensor>& ts, const fs::path& file,
                                               std::uint64_t* bytes) {
  for (const auto& t : ts)
    if (t.group == "params" && t.values.size() >= 64) {
      *bytes = t.values.size() * sizeof(float) + 4;  // the stored chunk: the values and their Fletcher32 checksum
      return {"/params/" + t.name, find_bytes(file, t.values.data(), 64 * sizeof(float))};
    }
  ADD_FAILURE() << "no tensor";
  return {};
}

std::string dataset(const fs::path& dir, std::int64_t train = 2000) {
  const fs::path p = dir / "data.h5";
  renaissance::io::make_synthetic(p.string(), train, 300, 28, 28, 1, 10, 7);  // chunks (blocks) of 256 samples
  return p.string();
}

}  // namespace

TEST(HardeningCorruption, ZeroedTensorInACheckpointIsNamedNotVerifiedAndSkippedByResumeAuto) {
  const fs::path d = temp_dir();
  const std::string ck = (d / "ck").string();
  const CliResult train = run("train --data " + tiny_data() + " --epochs 1 --batch 32 --checkpoint-every 3 --checkpoint-dir " + ck);
  ASSERT_EQ(train.code, 0) << train.out;
  const fs::path latest = fs::canonical(fs::path(ck) / "latest.h5");  // step 7 (200 samples, batch 32)
  std::uint64_t n = 0;
  const auto [name, at] = a_tensor(renaissance::io::read_checkpoint(latest.string()).tensors, latest, &n);
  zero_bytes(latest, at, n);

  const CliResult inspect = run("checkpoint inspect " + latest.string());
  EXPECT_CLEAN_ERROR(inspect, "INVALID", latest.string() + ": " + name, "all zero", "BAD");
  EXPECT_EQ(inspect.out.find("checksum verified"), std::string::npos) << inspect.out;
  const CliResult resume = run("train --data " + tiny_data() + " --epochs 2 --batch 32 --resume " + latest.string());
  EXPECT_CLEAN_ERROR(resume, latest.string() + ": " + name, "content checksum");
  // --resume auto skips it, says why, and resumes from the previous checkpoint.
  const CliResult autor = run("train --data " + tiny_data() + " --epochs 1 --batch 32 --checkpoint-every 3 --checkpoint-dir " +
                              ck + " --resume auto");
  EXPECT_EQ(autor.code, 0) << autor.out;
  EXPECT_NE(autor.out.find("skipping"), std::string::npos) << autor.out;
  EXPECT_NE(autor.out.find("resumed from " + ck + "/ckpt-step00000006.h5"), std::string::npos) << autor.out;
}

TEST(HardeningCorruption, ZeroedTensorInWeightsIsNamed) {
  const fs::path d = temp_dir();
  const fs::path w = d / "w.h5";
  const CliResult train = run("train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32 --save " + w.string());
  ASSERT_EQ(train.code, 0) << train.out;
  std::uint64_t n = 0;
  const auto [name, at] = a_tensor(renaissance::io::read_weights(w.string()).tensors, w, &n);
  zero_bytes(w, at, n);
  const CliResult eval = run("eval --data " + tiny_data() + " --weights " + w.string());
  EXPECT_CLEAN_ERROR(eval, w.string() + ": " + name, "content checksum", "all zero");
}

TEST(HardeningCorruption, ZeroedDatasetChunkIsNamedWithItsSamples) {
  const fs::path d = temp_dir();
  const std::string data = dataset(d);
  const auto [addr, size] = chunk_at(data, "/train/images", 768);  // the chunk of samples [768, 1024)
  ASSERT_GT(size, 0u);
  zero_bytes(data, addr, size);  // Fletcher32 of all zeros is zero: HDF5 itself reads it without complaint
  const CliResult inspect = run("data inspect " + data);
  EXPECT_CLEAN_ERROR(inspect, data + ": dataset '/train/images'", "samples [768, 1024)", "content checksum", "all zero");
  EXPECT_EQ(inspect.out.find("verified"), std::string::npos) << inspect.out;
  const CliResult train = run("train --data " + data + " --epochs 1 --batch 64");
  EXPECT_CLEAN_ERROR(train, data + ": dataset '/train/images'", "samples [768, 1024)", "content checksum");
}

TEST(HardeningCorruption, AnExtentClaimingUnstoredSamplesIsRefusedAtOnce) {
  const fs::path d = temp_dir();
  const std::string data = dataset(d);
  claim_extent(data, "/train/images", 1000000000);  // 10^9 samples claimed, 2,000 stored
  claim_extent(data, "/train/labels", 1000000000);
  const CliResult inspect = run("data inspect " + data, 60);
  EXPECT_CLEAN_ERROR(inspect, data + ": dataset '/train/images'", "samples [2048, 2304) were never written",
                     "claims 1000000000 samples");
  EXPECT_LT(inspect.seconds, 10.0);  // it used to read 10^9 samples of fill value
  const CliResult train = run("train --data " + data + " --epochs 1 --batch 64", 60);
  EXPECT_CLEAN_ERROR(train, "samples [2048, 2304) were never written");
  EXPECT_EQ(train.out.find("epoch 1/"), std::string::npos) << "refused before training:\n" << train.out;
}

TEST(HardeningCorruption, ADatasetTruncatedWhileARunReadsItStopsTheRun) {
  const fs::path d = temp_dir();
  const std::string data = dataset(d);
  // No decoded-block cache (so reads keep going to the file) and slow steps, so the truncation lands mid-run.
  const CliResult r = run_shell("RENAISSANCE_DATASET_CACHE_MB=0 RENAISSANCE_TEST_STEP_DELAY_MS=200 " + cli() +
                                    " train --data " + data + " --epochs 3 --batch 64 & pid=$!; sleep 3; truncate -s $(( $(stat -c %s " + data +
                                    ") * 4 / 10 )) " + data + "; wait $pid",
                                120);
  EXPECT_CLEAN_ERROR(r, data + ": dataset '/train/images'", "the file shrank from");
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
}

TEST(HardeningCorruption, Format1FilesStayReadable) {
  // Files written before format 2 (no checksum header, no content checksums): the seeds of tests/fuzz.
  const fs::path corpus = fs::path(RENAISSANCE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  const std::string ck = (corpus / "fuzz_checkpoint" / "tiny_adam.h5").string();
  const CliResult inspect = run("checkpoint inspect " + ck);
  EXPECT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("valid ("), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("version       1"), std::string::npos) << inspect.out;
  EXPECT_NO_THROW(renaissance::io::read_weights((corpus / "fuzz_weights" / "tiny_weights.h5").string()));
  const std::string data = (corpus / "fuzz_dataset" / "synthetic_4x4x1.h5").string();
  const CliResult di = run("data inspect " + data);
  EXPECT_EQ(di.code, 0) << di.out;
  EXPECT_NE(di.out.find("version 1"), std::string::npos) << di.out;
  EXPECT_NE(di.out.find("Fletcher32 only"), std::string::npos) << di.out;
}

TEST(HardeningCorruption, FilesThatCrashHdf5ItselfAreErrorsNotCrashes) {
  // Found by tests/fuzz: format 1 files whose corrupt metadata makes HDF5 1.10 crash inside its own code (a SEGV in
  // H5A__close under H5Aget_name_by_idx; an invalid free under H5Lget_name_by_idx, seen by ASan). Format 1 files are
  // parsed in a child process first, so the command exits 1 with a message.
  const fs::path corpus = fs::path(RENAISSANCE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  const std::string segv = (corpus / "fuzz_weights" / "regression-hdf5-segv-v1.h5").string();
  const std::string free_ = (corpus / "fuzz_checkpoint" / "regression-hdf5-invalid-free-v1.h5").string();
  const CliResult w = run("eval --data " + tiny_data() + " --weights " + segv);
  EXPECT_CLEAN_ERROR(w, segv + ": HDF5 crashed reading this file (signal 11)");
  for (const std::string& f : {segv, free_}) {
    const CliResult r = run("checkpoint inspect " + f);
    EXPECT_CLEAN_ERROR(r, "INVALID", f);
  }
}
