// Issue 13, class 2: corruption that checksums missed. Fletcher32 accepts an all-zero chunk, and HDF5 returns the
// fill value for chunks never written or lying past a truncated end. Checkpoints and weights (format 2) carry a
// checksum header (the whole file and each tensor's stored bytes), datasets (format 2) a CRC-32 per block of
// samples; every dataset's chunks are counted against its extent and the file size is watched while a run reads
// it. Each case names the file, the tensor or dataset and the samples, and nothing prints "verified" for it.
#include "hardening_util.h"

#include <renaissance/core/error.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/weights.h>

#include <functional>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

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

std::string dataset(const fs::path& dir, std::int64_t train = 2000, const char* name = "data.h5") {
  const fs::path p = dir / name;
  renaissance::io::make_synthetic(p.string(), train, 300, 28, 28, 1, 10, 7);  // chunks (blocks) of 256 samples
  return p.string();
}

/// Rewrites the byte count the chunk index records for the chunk of `link` (rank `rank`) whose first sample is
/// `first`, as a corrupt or hostile file would. The index is a v1 B-tree, which has no checksum (HDF5 1.10 writes it
/// even with checksummed object headers); a key is u32 chunk bytes, u32 filter mask, u64 offset per dimension and one
/// for the element, followed by the child: the chunk's address.
void claim_chunk_bytes(const fs::path& p, const std::string& link, int rank, hsize_t first, std::uint32_t bytes) {
  const auto [addr, size] = chunk_at(p, link, first);
  ASSERT_GT(size, 0u);
  std::string key;
  const auto le = [&](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) key += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  le(size, 4);
  le(0, 4);  // no filter skipped
  le(first, 8);
  for (int i = 0; i < rank; ++i) le(0, 8);
  le(addr, 8);
  const std::string file = read_text(p);
  const auto at = file.find(key);
  ASSERT_NE(at, std::string::npos) << "no B-tree key for the chunk at " << addr;
  ASSERT_EQ(file.find(key, at + 1), std::string::npos) << "not unique";
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  std::string b;
  for (int i = 0; i < 4; ++i) b += static_cast<char>((bytes >> (8 * i)) & 0xff);
  f.write(b.data(), 4);
}

/// Replaces `link` by a dataset of `type` and `dims` in chunks of `cdims` (Fletcher32, plus `filter` if not 0, as an
/// optional filter, which HDF5 skips where it has no such filter) holding `data` (nothing written if null).
void replace_chunked(const fs::path& p, const std::string& link, hid_t type, const std::vector<hsize_t>& dims,
                     const std::vector<hsize_t>& cdims, H5Z_filter_t filter, const void* data) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << p;
  ASSERT_GE(H5Ldelete(f, link.c_str(), H5P_DEFAULT), 0) << link;
  std::vector<hsize_t> maxdims = dims;
  maxdims[0] = H5S_UNLIMITED;
  const hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data());
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  EXPECT_GE(H5Pset_chunk(dcpl, static_cast<int>(cdims.size()), cdims.data()), 0);
  if (filter) {
    EXPECT_GE(H5Pset_filter(dcpl, filter, H5Z_FLAG_OPTIONAL, 0, nullptr), 0);
  }
  EXPECT_GE(H5Pset_fletcher32(dcpl), 0);
  const hid_t d = H5Dcreate2(f, link.c_str(), type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  EXPECT_GE(d, 0) << link;
  if (data) {
    EXPECT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
  H5Fclose(f);
}

/// Replaces a root attribute of a format 1 file (no checksum header) with a 64-bit integer or a string.
void set_root_attr(const std::string& file, const char* name, long long value, const char* text = nullptr) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  if (H5Aexists(f, name) > 0) H5Adelete(f, name);
  const hid_t space = H5Screate(H5S_SCALAR);
  hid_t type = H5Tcopy(text ? H5T_C_S1 : H5T_STD_I64LE);
  if (text) H5Tset_size(type, std::strlen(text) + 1);
  const hid_t a = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  if (text)
    H5Awrite(a, type, text);
  else
    H5Awrite(a, H5T_NATIVE_LLONG, &value);
  H5Aclose(a);
  H5Tclose(type);
  H5Sclose(space);
  H5Fclose(f);
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

TEST(HardeningCorruption, AnEmptyTrainSplitIsNotCalledValid) {
  // A file cut down to no train samples: inspect called it valid, and the job that trusted that failed at start.
  const fs::path d = temp_dir();
  const std::string data = dataset(d);
  for (const char* link : {"/train/images", "/train/labels", "/train/checksums"}) claim_extent(data, link, 0);
  const CliResult inspect = run("data inspect " + data);
  EXPECT_CLEAN_ERROR(inspect, data + ": the train split is empty");
  EXPECT_EQ(inspect.out.find("labels valid"), std::string::npos) << inspect.out;
  const CliResult json = run("data inspect --json " + data);
  EXPECT_NE(json.out.find("\"valid\": false"), std::string::npos) << json.out;
  const CliResult train = run("train --data " + data + " --epochs 1 --batch 64");
  EXPECT_CLEAN_ERROR(train, data + ": the train split is empty");
}

TEST(HardeningCorruption, AChunkIndexClaimingAHugeChunkIsRefusedBeforeHdf5ReadsIt) {
  // Found by the CI run of fuzz_dataset: a chunk index claiming 4,244,701,188 stored bytes for a 64 KiB chunk of a
  // 160 KB file, and H5Dread allocated them (HDF5 reads a filtered chunk whole before the filters run).
  const fs::path d = temp_dir();
  const std::string data = dataset(d);
  claim_chunk_bytes(data, "/train/images", 4, 256, 0xFD000000u | 200708u);  // samples [256, 512): 200,704 B + 4
  const CliResult inspect = run("data inspect " + data, 60);
  EXPECT_CLEAN_ERROR(inspect, data + ": dataset '/train/images'", "stored bytes, more than the whole file has",
                     "a corrupt chunk index");
  const CliResult train = run("train --data " + data + " --epochs 1 --batch 64", 60);
  EXPECT_CLEAN_ERROR(train, data + ": dataset '/train/images'", "a corrupt chunk index");
  EXPECT_EQ(train.out.find("epoch 1/"), std::string::npos) << "refused before training:\n" << train.out;
}

TEST(HardeningCorruption, AHugeChunkShapeOrAForeignFilterIsRefusedAtOpen) {
  const fs::path d = temp_dir();
  // Chunks of 2^20 samples (822 MB; HDF5 allows up to 4 GiB, and allocates a whole chunk to read one sample of it).
  const std::string huge = dataset(d, 2000, "huge.h5");
  replace_chunked(huge, "/train/images", H5T_STD_U8LE, {2000, 28, 28, 1}, {hsize_t{1} << 20, 28, 28, 1}, 0, nullptr);
  const CliResult a = run("data inspect " + huge, 60);
  EXPECT_CLEAN_ERROR(a, huge + ": dataset '/train/images'", "has chunks of 1048576x28x28x1 (822083584 bytes)",
                     "over the limit of 256 MiB");
  // A filter no writer of ours uses (32000, h5py's LZF): HDF5 would look for a plugin to read it. Optional, so HDF5
  // writes the labels without it and, without the check, reads them back as if it were not there.
  const std::string lzf = dataset(d, 2000, "lzf.h5");
  std::vector<std::int32_t> labels(300);
  {
    const renaissance::io::DatasetFile f(lzf);
    f.read(renaissance::io::Split::val, 0, 300, nullptr, labels.data());
  }
  replace_chunked(lzf, "/val/labels", H5T_STD_I32LE, {300}, {300}, 32000, labels.data());
  const CliResult b = run("data inspect " + lzf, 60);
  EXPECT_CLEAN_ERROR(b, lzf + ": dataset '/val/labels'", "has id 32000, not one Renaissance reads");
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

// A dataset rewritten in place (`cp other.h5 data.h5`, the same size) while a run reads it: the blocks not yet cached
// failed inside HDF5 ("inflate() failed", Fletcher32) or their content checksum, with nothing saying why.
TEST(HardeningCorruption, ADatasetRewrittenInPlaceWhileReadSaysSo) {
  const fs::path d = temp_dir();
  const std::string data = dataset(d);
  const fs::path other = d / "other.h5";
  renaissance::io::make_synthetic(other.string(), 2000, 300, 28, 28, 1, 10, 8);  // another seed, the same layout
  ASSERT_EQ(fs::file_size(data), fs::file_size(other));
  renaissance::io::DatasetFile f(data, /*cache_budget=*/1 << 20);
  std::vector<std::uint8_t> images(28 * 28 * 4);
  std::vector<std::int32_t> labels(4);
  f.read(renaissance::io::Split::train, 0, 4, images.data(), labels.data());  // block 0 cached
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a later modification time, whatever its resolution
  {
    std::ifstream in(other, std::ios::binary);
    std::ofstream out(data, std::ios::binary | std::ios::in | std::ios::out);  // in place: the same inode
    out << in.rdbuf();
  }
  try {
    f.read(renaissance::io::Split::train, 1500, 4, images.data(), labels.data());  // a block not read before
    FAIL() << "a block of the rewritten file was read without an error";
  } catch (const renaissance::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(data), std::string::npos) << what;
    EXPECT_NE(what.find("the file changed while samples ["), std::string::npos) << what;
    EXPECT_NE(what.find("written after the run opened it"), std::string::npos) << what;
  }
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

// Found by a hostile-input hunt on format 1 files (no checksums, so edits go unnoticed): a seed attribute that is
// text ended every command with "error: stoull"; a step near 2^63 wrapped to negative steps, negative checkpoint
// names and a rotation that kept every file.
TEST(HardeningCorruption, CheckpointAttributesOutOfRangeAreErrorsNamingThem) {
  const fs::path d = temp_dir();
  const fs::path corpus = fs::path(RENAISSANCE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  const std::string src = (corpus / "fuzz_checkpoint" / "tiny_adam.h5").string();
  struct Case {
    const char* attr;
    long long value;
    const char* text;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"seed", 0, "abc", "attribute 'seed' = 'abc' is not a seed"},
           {"seed", 0, "-1", "attribute 'seed' = '-1' is not a seed"},
           {"step", 9223372036854775806LL, nullptr, "attribute 'step' = 9223372036854775806 is out of range"},
           {"batch", 1LL << 40, nullptr, "attribute 'batch' = 1099511627776 is out of range"}}) {
    const std::string ck = (d / (std::string(c.attr) + ".h5")).string();
    fs::copy_file(src, ck, fs::copy_options::overwrite_existing);
    set_root_attr(ck, c.attr, c.value, c.text);
    const CliResult r = run("checkpoint inspect " + ck);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("stoull"), std::string::npos) << r.out;
  }
}

namespace {

/// A copy of a format 1 seed (no checksum header: HDF5 edits are not caught by a whole-file checksum).
fs::path format1_copy(const std::string& seed_dir, const std::string& seed, const std::string& name) {
  const fs::path corpus = fs::path(RENAISSANCE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  const fs::path out = temp_dir() / name;
  fs::copy_file(corpus / seed_dir / seed, out, fs::copy_options::overwrite_existing);
  return out;
}

/// Replaces `link` of a {1,1,1,k} tensor by a FP32 dataset in chunks of k-1 values with only its last (edge) chunk
/// written: 4(k-1) + 4 stored bytes, as many as the k values need, one chunk never written.
void edge_chunk_only(const fs::path& p, const std::string& link, hsize_t k) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << p;
  ASSERT_GE(H5Ldelete(f, link.c_str(), H5P_DEFAULT), 0) << link;
  const hsize_t dims[4] = {1, 1, 1, k}, cdims[4] = {1, 1, 1, k - 1};
  const hid_t sp = H5Screate_simple(4, dims, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 4, cdims);
  H5Pset_fletcher32(dcpl);
  const float fill = 0.5f;
  H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &fill);
  const hid_t d = H5Dcreate2(f, link.c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  const hsize_t start[4] = {0, 0, 0, k - 1}, count[4] = {1, 1, 1, 1};
  H5Sselect_hyperslab(sp, H5S_SELECT_SET, start, nullptr, count, nullptr);
  const hsize_t one = 1;
  const hid_t mem = H5Screate_simple(1, &one, nullptr);
  const float v = 1.0f;
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, mem, sp, H5P_DEFAULT, &v), 0);
  H5Sclose(mem);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
  H5Fclose(f);
}

/// `link` replaced by a soft link to `target`, a second hard name of it, or an int32 dataset of `n` values.
void relink(const fs::path& p, const std::string& link, const std::string& target, H5L_type_t type) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << p;
  ASSERT_GE(H5Ldelete(f, link.c_str(), H5P_DEFAULT), 0) << link;
  if (type == H5L_TYPE_SOFT)
    EXPECT_GE(H5Lcreate_soft(target.c_str(), f, link.c_str(), H5P_DEFAULT, H5P_DEFAULT), 0);
  else
    EXPECT_GE(H5Lcreate_hard(f, target.c_str(), f, link.c_str(), H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
}

}  // namespace

// Format 1 files have no checksum header, so HDF5 edits reach the readers: a tensor that is a soft link or a second
// name of another tensor loaded the other's values (inspect said valid); an edge chunk written alone passed the
// stored-bytes count while a chunk was never written (its values read as the fill value); an int32 tensor in a
// weights file was converted silently. Each is now an error naming the tensor, for checkpoints and weights.
TEST(HardeningCorruption, Format1TensorsThatAreLinksUnstoredChunksOrIntegersAreRefused) {
  struct Case {
    const char* what;
    std::function<void(const fs::path&)> edit;
    const char* must;
  };
  const std::vector<Case> checkpoint_cases = {
      {"soft", [](const fs::path& p) { relink(p, "/params/fc1.b", "/optimizer/fc1.b.m", H5L_TYPE_SOFT); },
       "a soft link, not a tensor of its own"},
      {"hard", [](const fs::path& p) { relink(p, "/params/fc1.b", "/optimizer/fc1.b.m", H5L_TYPE_HARD); },
       "the same dataset as another name of the file"},
      {"edge", [](const fs::path& p) { edge_chunk_only(p, "/params/fc1.b", 3); }, "only 1 of its 2 chunks are stored"},
  };
  for (const Case& c : checkpoint_cases) {
    const fs::path ck = format1_copy("fuzz_checkpoint", "tiny_adam.h5", std::string("ck_") + c.what + ".h5");
    c.edit(ck);
    const CliResult r = run("checkpoint inspect " + ck.string());
    EXPECT_NE(r.code, 0) << c.what << "\n" << r.out;
    EXPECT_NE(r.out.find("/params/fc1.b"), std::string::npos) << c.what << "\n" << r.out;
    EXPECT_NE(r.out.find(c.must), std::string::npos) << c.what << "\n" << r.out;
  }
  const std::vector<Case> weights_cases = {
      {"soft", [](const fs::path& p) { relink(p, "/params/fc1.b", "/bn/bn2d1.running_mean", H5L_TYPE_SOFT); },
       "a soft link"},
      {"edge", [](const fs::path& p) { edge_chunk_only(p, "/params/fc1.b", 3); }, "only 1 of its 2 chunks"},
      {"int",
       [](const fs::path& p) {
         std::vector<std::int32_t> v(3, 7);
         replace_chunked(p, "/params/fc1.b", H5T_STD_I32LE, {1, 1, 1, 3}, {1, 1, 1, 3}, 0, v.data());
       },
       "not floating point"},
  };
  for (const Case& c : weights_cases) {
    const fs::path w = format1_copy("fuzz_weights", "tiny_weights.h5", std::string("w_") + c.what + ".h5");
    c.edit(w);
    try {
      (void)renaissance::io::read_weights(w.string());
      ADD_FAILURE() << c.what << ": read";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("/params/fc1.b"), std::string::npos) << c.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.must), std::string::npos) << c.what << ": " << e.what();
    }
  }
  // /state and the metric attributes by what they mean: a loss scale of 0 (every AMP step NaN), an accuracy of 7.5.
  const fs::path scale = format1_copy("fuzz_checkpoint", "tiny_adam.h5", "scale.h5");
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const hid_t f = H5Fopen(scale.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hid_t d = H5Dopen2(f, "/state/loss_scale", H5P_DEFAULT);
    float v[4] = {0, 0, 0, 0};
    ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
    v[0] = 0.0f;
    EXPECT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
    H5Dclose(d);
    H5Fclose(f);
  }
  const CliResult sr = run("checkpoint inspect " + scale.string());
  EXPECT_NE(sr.code, 0) << sr.out;
  EXPECT_NE(sr.out.find("/state/loss_scale: loss scale 0"), std::string::npos) << sr.out;
  const fs::path top1 = format1_copy("fuzz_checkpoint", "tiny_adam.h5", "top1.h5");
  set_root_attr(top1.string(), "val_top1", 0, "7.5");
  const CliResult tr = run("checkpoint inspect " + top1.string());
  EXPECT_NE(tr.code, 0) << tr.out;
  EXPECT_NE(tr.out.find("attribute 'val_top1' = '7.5': an accuracy is a fraction"), std::string::npos) << tr.out;
  // The seeds themselves still read.
  EXPECT_EQ(run("checkpoint inspect " + format1_copy("fuzz_checkpoint", "tiny_adam.h5", "ok.h5").string()).code, 0);
}

// An integer attribute stored as an array (step = [0x4141..., ...]) was read into one integer: a stack overwrite
// (the parse child crashed, reported as "HDF5 crashed"), or with small values a file called valid and resumed.
TEST(HardeningCorruption, Format1IntegerAttributesThatAreArraysAreRefused) {
  for (const hsize_t n : {hsize_t{2}, hsize_t{4}, hsize_t{4096}}) {
    SCOPED_TRACE(n);
    const fs::path ck = format1_copy("fuzz_checkpoint", "tiny_adam.h5", "int_array_" + std::to_string(n) + ".h5");
    {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      const hid_t f = H5Fopen(ck.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      ASSERT_GE(f, 0);
      ASSERT_GE(H5Adelete(f, "step"), 0);
      const hid_t space = H5Screate_simple(1, &n, nullptr);
      const hid_t a = H5Acreate2(f, "step", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(a, 0);
      const std::vector<long long> v(n, n == 2 ? 0 : 0x4141414141414141LL);
      EXPECT_GE(H5Awrite(a, H5T_NATIVE_LLONG, v.data()), 0);
      H5Aclose(a);
      H5Sclose(space);
      H5Fclose(f);
    }
    const CliResult r = run("checkpoint inspect " + ck.string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("attribute 'step' is not one integer (" + std::to_string(n) + " elements)"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("crashed"), std::string::npos) << r.out;
    const CliResult e = run("eval --data " + tiny_data() + " --checkpoint " + ck.string());
    EXPECT_CLEAN_ERROR(e, "attribute 'step' is not one integer");
  }
}
