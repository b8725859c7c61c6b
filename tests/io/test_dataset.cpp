// DatasetWriter / DatasetFile: round trips, and every way a file can be wrong giving an Error that names it.
#include "io_test_util.h"

#include <renaissance/io/dataset.h>
#include <renaissance/io/hdf5_util.h>

#include <gmock/gmock.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;
using ::testing::HasSubstr;

void expect_sample(const std::uint8_t* img, std::int32_t label, Split s, std::int64_t i, const SmallSpec& spec) {
  const std::int64_t sb = spec.h * spec.w * spec.c;
  for (std::int64_t p = 0; p < sb; ++p) ASSERT_EQ(img[p], pixel_of(s, i, p)) << "sample " << i << " pixel " << p;
  ASSERT_EQ(label, label_of(s, i, spec.classes)) << "sample " << i;
}

TEST(Dataset, RoundTripContiguous) {
  TempDir dir;
  const std::string path = dir.file("small.h5");
  const SmallSpec spec;
  write_small(path, spec);
  const DatasetFile f(path);
  EXPECT_EQ(f.version(), 3);  // format 3: the storage attribute; content checksums per block since 2
  EXPECT_EQ(f.storage(), Storage::raw);
  EXPECT_EQ(f.num_classes(), spec.classes);
  ASSERT_EQ(f.class_names().size(), 10u);
  EXPECT_EQ(f.class_names()[3], "class 3");
  EXPECT_EQ(f.sample_bytes(), spec.h * spec.w * spec.c);
  for (Split s : kAllSplits) {
    const SplitInfo& info = f.info(s);
    EXPECT_EQ(info.count, s == Split::train ? spec.n_train : spec.n_val);
    EXPECT_EQ(info.height, spec.h);
    EXPECT_EQ(info.width, spec.w);
    EXPECT_EQ(info.channels, spec.c);
    EXPECT_EQ(info.chunk_samples, 7);
    EXPECT_EQ(info.deflate_level, 2);
    EXPECT_TRUE(info.fletcher32);

    const std::int64_t n = info.count, sb = f.sample_bytes();
    std::vector<std::uint8_t> img(static_cast<size_t>(n * sb));
    std::vector<std::int32_t> lab(static_cast<size_t>(n));
    f.read(s, 0, n, img.data(), lab.data());
    for (std::int64_t i = 0; i < n; ++i) expect_sample(img.data() + i * sb, lab[i], s, i, spec);

    // A shard in the middle, straddling chunk boundaries; images only, then labels only.
    std::fill(img.begin(), img.end(), 0);
    f.read(s, 5, 8, img.data(), nullptr);
    f.read(s, 5, 8, nullptr, lab.data());
    for (std::int64_t i = 0; i < 8; ++i) expect_sample(img.data() + i * sb, lab[i], s, 5 + i, spec);
  }

  // mean/std over the train split in [0,1] units, population std.
  const std::int64_t sb = f.sample_bytes();
  for (std::int64_t ch = 0; ch < spec.c; ++ch) {
    double sum = 0, sumsq = 0, n = 0;
    for (std::int64_t i = 0; i < spec.n_train; ++i)
      for (std::int64_t p = ch; p < sb; p += spec.c) {
        const double v = pixel_of(Split::train, i, p) / 255.0;
        sum += v;
        sumsq += v * v;
        n += 1;
      }
    const double mean = sum / n;
    EXPECT_NEAR(f.mean()[ch], mean, 1e-6);
    EXPECT_NEAR(f.stddev()[ch], std::sqrt(sumsq / n - mean * mean), 1e-6);
  }
  EXPECT_NO_THROW(f.validate_labels());
  EXPECT_NO_THROW(f.verify(Split::train));
  const auto hist = f.label_histogram(Split::train);
  EXPECT_EQ(std::accumulate(hist.begin(), hist.end(), std::int64_t(0)), spec.n_train);
}

TEST(Dataset, RoundTripByIndices) {
  TempDir dir;
  const std::string path = dir.file("small.h5");
  const SmallSpec spec;
  write_small(path, spec);
  const DatasetFile f(path);
  const std::int64_t sb = f.sample_bytes();

  std::vector<std::int64_t> perm(static_cast<size_t>(spec.n_train));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(42);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<std::vector<std::int64_t>> cases = {
      perm,                            // shuffled: runs of length 1 mostly
      {3, 4, 5, 6, 7, 8, 20, 21, 22},  // runs in order: read in place
      {22, 21, 20, 9, 8, 7, 6},        // runs in reverse: staged and scattered
      {5, 5, 6, 5, 49, 0, 49},         // duplicates and both ends
      {10},
  };
  for (const auto& idx : cases) {
    std::vector<std::uint8_t> img(idx.size() * sb, 0);
    std::vector<std::int32_t> lab(idx.size(), -1);
    f.read_indices(Split::train, idx, img.data(), lab.data());
    for (size_t k = 0; k < idx.size(); ++k) expect_sample(img.data() + k * sb, lab[k], Split::train, idx[k], spec);
    // Labels only.
    std::vector<std::int32_t> lab2(idx.size(), -1);
    f.read_indices(Split::train, idx, nullptr, lab2.data());
    EXPECT_EQ(lab, lab2);
  }
  std::vector<std::uint8_t> img(4 * sb);
  std::vector<std::int32_t> lab(4);
  f.read_indices(Split::val, {12, 0, 1, 11}, img.data(), lab.data());
  expect_sample(img.data(), lab[0], Split::val, 12, spec);
  expect_sample(img.data() + 3 * sb, lab[3], Split::val, 11, spec);
}

TEST(Dataset, AutoChunkingKeepsChunksNearOneMiB) {
  TempDir dir;
  const std::string path = dir.file("big.h5");
  SmallSpec spec;
  spec.h = 224;
  spec.w = 224;
  spec.c = 3;
  spec.n_train = 9;
  spec.n_val = 2;
  spec.options = {};
  write_small(path, spec);
  const DatasetFile f(path);
  EXPECT_EQ(f.info(Split::train).chunk_samples, (1 << 20) / (224 * 224 * 3));
  std::vector<std::uint8_t> img(3 * f.sample_bytes());
  std::vector<std::int32_t> lab(3);
  f.read_indices(Split::train, {8, 0, 7}, img.data(), lab.data());
  expect_sample(img.data(), lab[0], Split::train, 8, spec);
}

TEST(Dataset, OutOfRangeReadsNameFileDatasetAndIndex) {
  TempDir dir;
  const std::string path = dir.file("small.h5");
  write_small(path);
  const DatasetFile f(path);
  std::vector<std::uint8_t> img(100 * f.sample_bytes());
  std::vector<std::int32_t> lab(100);
  std::string msg = error_of([&] { f.read(Split::val, 10, 5, img.data(), lab.data()); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("/val/images"));
  EXPECT_THAT(msg, HasSubstr("[10, 15)"));
  msg = error_of([&] { f.read_indices(Split::train, {1, 2, 50}, img.data(), lab.data()); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("/train/images"));
  EXPECT_THAT(msg, HasSubstr("idx[2] = 50"));
}

TEST(DatasetWriter, WritesATempFileAndRenamesOnFinish) {
  TempDir dir;
  const std::string path = dir.file("out.h5");
  {
    DatasetWriter w(path, 2, 2, 1, 3);
    const std::uint8_t img[4] = {1, 2, 3, 4};
    const std::int32_t lab[1] = {2};
    w.append(Split::train, img, lab, 1);
    EXPECT_FALSE(fs::exists(path)) << "the target must only appear complete";
    EXPECT_EQ(dir.entries().size(), 1u);
    w.finish();
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.h5"});
  const DatasetFile f(path);
  EXPECT_EQ(f.size(Split::train), 1);
  EXPECT_EQ(f.size(Split::val), 0);
  EXPECT_TRUE(f.class_names().empty());
}

TEST(DatasetWriter, AbandonedWriteLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("out.h5");
  {
    DatasetWriter w(path, 2, 2, 1, 3);
    const std::uint8_t img[4] = {1, 2, 3, 4};
    const std::int32_t lab[1] = {1};
    w.append(Split::train, img, lab, 1);
  }  // no finish(): as if the import threw
  EXPECT_TRUE(dir.entries().empty());
}

TEST(DatasetWriter, AStaleTemporaryOfAKilledWriterIsRemovedALiveOnesIsKept) {
  // An import killed before its rename (SIGKILL, a node lost) left out.h5.tmp-<host>-<pid> behind for good (292 MB
  // after an interrupted `data synthetic`); the next writer of out.h5 removes it, never a live writer's.
  TempDir dir;
  const std::string path = dir.file("out.h5");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // its PID now names no process (until reused)
  const std::string mine = temporary_name(path);   // "<path>.tmp-<host>-<this pid>"
  const std::string dead = mine.substr(0, mine.rfind('-') + 1) + std::to_string(child);
  const std::string live = mine.substr(0, mine.rfind('-') + 1) + "1";  // init: alive
  const std::string other_host = path + ".tmp-another-host-" + std::to_string(child);
  for (const std::string& f : {dead, live, other_host}) std::ofstream(f) << "partial";
  {
    DatasetWriter w(path, 2, 2, 1, 3);
    const std::uint8_t img[4] = {1, 2, 3, 4};
    const std::int32_t lab[1] = {2};
    w.append(Split::train, img, lab, 1);
    w.finish();
  }
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other_host));
  EXPECT_TRUE(fs::exists(path));
}

// Found by a hostile-input hunt: blank (constant) images were written with a std of 0, which every reader refuses,
// and the rename replaced the file already at `path` with it.
TEST(DatasetWriter, ConstantImagesAreAnErrorAndTheFileAtThePathStays) {
  TempDir dir;
  const std::string path = dir.file("out.h5");
  std::ofstream(path) << "an earlier import";
  {
    DatasetWriter w(path, 2, 2, 1, 3);
    const std::uint8_t img[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    const std::int32_t lab[2] = {0, 2};
    w.append(Split::train, img, lab, 2);
    std::string msg;
    try {
      w.finish();
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("channel 0 has a standard deviation of 0 (every pixel 7)"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.h5"});
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "an earlier import");
}

TEST(DatasetWriter, RejectsBadLabelsAndEmptyTrain) {
  TempDir dir;
  const std::string path = dir.file("out.h5");
  DatasetWriter w(path, 1, 1, 1, 3);
  const std::uint8_t img[3] = {1, 2, 3};
  const std::int32_t lab[3] = {0, 1, 3};
  const std::string msg = error_of([&] { w.append(Split::val, img, lab, 3); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("/val/labels"));
  EXPECT_THAT(msg, HasSubstr("sample 2"));
  EXPECT_THAT(error_of([&] { w.finish(); }), HasSubstr("train split is empty"));
  EXPECT_THAT(error_of([&] { DatasetWriter(dir.file("nodir/x.h5"), 1, 1, 1, 3); }), HasSubstr("does not exist"));
}

TEST(DatasetWriter, RefusesChunksReadersWouldRefuse) {
  TempDir dir;
  // 100 samples of 3 MiB: 300 MiB chunks, over the 256 MiB a reader accepts (HDF5 allocates whole chunks).
  const std::string msg = error_of([&] { DatasetWriter(dir.file("big.h5"), 1024, 1024, 3, 2, {100, 0}); });
  EXPECT_THAT(msg, HasSubstr(dir.file("big.h5")));
  EXPECT_THAT(msg, HasSubstr("chunks of 100 samples of 3145728 bytes exceed 256 MiB"));
  // One sample per chunk is always allowed, however large; so are 85 samples of 3 MiB (255 MiB).
  EXPECT_NO_THROW(DatasetWriter(dir.file("one.h5"), 1024, 1024, 3, 2, {1, 0}));
  EXPECT_NO_THROW(DatasetWriter(dir.file("ok.h5"), 1024, 1024, 3, 2, {85, 0}));
}

// ---- bad files -------------------------------------------------------------------------------------------------

class BadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path = dir.file("data.h5");
    write_small(path);
  }
  /// Opening (and, if it opens, validating and reading everything) must fail; HDF5 must print nothing itself.
  std::string open_error() {
    ::testing::internal::CaptureStderr();
    const std::string msg = error_of([&] {
      const DatasetFile f(path);
      for (Split s : kAllSplits) f.verify(s);
    });
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, "") << "HDF5 printed its own error stack";
    EXPECT_THAT(msg, HasSubstr(path));
    EXPECT_THAT(msg, HasSubstr("(hint: "));
    return msg;
  }
  TempDir dir;
  std::string path;
};

TEST_F(BadFile, MissingFile) {
  path = dir.file("nope.h5");
  EXPECT_THAT(open_error(), HasSubstr("not found"));
}

TEST_F(BadFile, NotHdf5) {
  std::ofstream(path, std::ios::trunc) << "label,pixel0\n1,0\n";
  EXPECT_THAT(open_error(), HasSubstr("not an HDF5 file"));
}

TEST_F(BadFile, WrongFormatAttribute) {
  set_string_attr(path, "format", "imagenet-tfrecord");
  const std::string msg = open_error();
  EXPECT_THAT(msg, HasSubstr("format attribute is 'imagenet-tfrecord'"));
}

TEST_F(BadFile, FixedLengthFormatStringIsAccepted) {
  set_string_attr(path, "format", "renaissance-dataset");
  EXPECT_NO_THROW(DatasetFile{path});
}

TEST_F(BadFile, MissingFormatAttribute) {
  delete_attr(path, "format");
  EXPECT_THAT(open_error(), HasSubstr("missing root attribute 'format'"));
}

TEST_F(BadFile, UnsupportedVersion) {
  set_int_attr(path, "version", 7);
  EXPECT_THAT(open_error(), HasSubstr("unsupported dataset version 7"));
}

TEST_F(BadFile, MissingGroup) {
  delete_link(path, "/val");
  EXPECT_THAT(open_error(), HasSubstr("missing group '/val'"));
}

TEST_F(BadFile, MissingDataset) {
  delete_link(path, "/train/labels");
  EXPECT_THAT(open_error(), HasSubstr("missing dataset '/train/labels'"));
}

TEST_F(BadFile, WrongImagesType) {
  replace_dataset(path, "/val/images", H5T_IEEE_F32LE, {13, 5, 4, 3});
  const std::string msg = open_error();
  EXPECT_THAT(msg, HasSubstr("/val/images"));
  EXPECT_THAT(msg, HasSubstr("float32, expected uint8"));
}

TEST_F(BadFile, WrongImagesRank) {
  replace_dataset(path, "/train/images", H5T_STD_U8LE, {50, 60});
  EXPECT_THAT(open_error(), HasSubstr("rank 2, expected 4"));
}

TEST_F(BadFile, LabelCountMismatch) {
  replace_dataset(path, "/train/labels", H5T_STD_I32LE, {49});
  const std::string msg = open_error();
  EXPECT_THAT(msg, HasSubstr("/train/labels"));
  EXPECT_THAT(msg, HasSubstr("49 labels for 50 images"));
}

TEST_F(BadFile, LabelOutOfRange) {
  set_int_attr(path, "num_classes", 4);  // labels go up to 9
  delete_attr(path, "class_names");      // else the 10 names are the first complaint
  const std::string msg = open_error();
  EXPECT_THAT(msg, HasSubstr("/train/labels"));
  // label_of(train, i) = 7i mod 10: index 0 → 0, 1 → 7 (the first >= 4)
  EXPECT_THAT(msg, HasSubstr("label 7 at index 1"));
}

TEST_F(BadFile, Truncated) {
  truncate_file(path, 0.6);
  const std::string msg = open_error();
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST_F(BadFile, ChecksumFailureNamesDatasetAndChunk) {
  corrupt_chunk(path, "/train/images", 3);  // samples [21, 28)
  const DatasetFile f(path);                // metadata is intact: opening works
  std::vector<std::uint8_t> img(50 * f.sample_bytes());
  std::vector<std::int32_t> lab(50);
  EXPECT_NO_THROW(f.read(Split::train, 0, 21, img.data(), lab.data()));  // chunks 0-2 are fine
  ::testing::internal::CaptureStderr();
  const std::string msg = error_of([&] { f.read(Split::train, 14, 20, img.data(), lab.data()); });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("/train/images"));
  EXPECT_THAT(msg, HasSubstr("samples [14, 34) (chunks 2..4)"));
  EXPECT_THAT(msg, ::testing::ContainsRegex("[Cc]hecksum|Fletcher32"));
  EXPECT_THAT(msg, HasSubstr("corrupted"));
  // By index: the failing run names the sample.
  const std::string msg2 = error_of([&] { f.read_indices(Split::train, {40, 23, 2}, img.data(), lab.data()); });
  EXPECT_THAT(msg2, HasSubstr("sample 23 (chunk 3)"));
  EXPECT_THAT(open_error(), HasSubstr("/train/images': reading samples [21, 28) (chunk 3)"));
}

TEST_F(BadFile, ChecksumFailureInLabels) {
  corrupt_chunk(path, "/val/labels", 0);
  const std::string msg = open_error();
  EXPECT_THAT(msg, HasSubstr("/val/labels"));
  EXPECT_THAT(msg, ::testing::ContainsRegex("[Cc]hecksum|Fletcher32"));
}

}  // namespace
}  // namespace renaissance::io
