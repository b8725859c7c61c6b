// idx import (gzip and raw, every malformed input) and the deterministic synthetic generator.
#include "io_test_util.h"

#include <renaissance/io/importers.h>

#include <gmock/gmock.h>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;
using ::testing::HasSubstr;

class Idx : public ::testing::Test {
 protected:
  void write_set(bool gzip) {
    const std::string ext = gzip ? ".gz" : "";
    train = {dir.file("tr-img" + ext), dir.file("tr-lab" + ext)};
    val = {dir.file("va-img" + ext), dir.file("va-lab" + ext)};
    write_bytes(train.images, idx_images_bytes(21, 6, 5, 1), gzip);
    write_bytes(train.labels, idx_labels_bytes(21, 4, 0), gzip);
    write_bytes(val.images, idx_images_bytes(9, 6, 5, 2), gzip);
    write_bytes(val.labels, idx_labels_bytes(9, 4, 1), gzip);
  }
  void expect_imported(const std::string& out) {
    const DatasetFile f(out);
    EXPECT_EQ(f.num_classes(), 4);
    for (Split s : kAllSplits) {
      const IdxPair& src = s == Split::train ? train : val;
      const IdxImages ref = read_idx_images(src.images);
      const std::vector<std::int32_t> ref_labels = read_idx_labels(src.labels);
      ASSERT_EQ(f.size(s), ref.count);
      EXPECT_EQ(f.info(s).height, 6);
      EXPECT_EQ(f.info(s).width, 5);
      EXPECT_EQ(f.info(s).channels, 1);
      std::vector<std::uint8_t> img(ref.pixels.size());
      std::vector<std::int32_t> lab(ref_labels.size());
      f.read(s, 0, ref.count, img.data(), lab.data());
      EXPECT_EQ(img, ref.pixels);
      EXPECT_EQ(lab, ref_labels);
    }
    EXPECT_EQ(dir.entries().size(), 5u) << "a temporary file was left behind";
  }
  /// The import must fail with a message naming `bad_file`, and leave no output or temporary file.
  std::string import_error(const std::string& bad_file, size_t inputs = 4) {
    const std::string out = dir.file("out.h5");
    const std::string msg = error_of([&] { import_idx(out, train, val, 4); });
    EXPECT_THAT(msg, HasSubstr(bad_file));
    EXPECT_THAT(msg, HasSubstr("(hint: "));
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(dir.entries().size(), inputs) << "a temporary file was left behind";
    return msg;
  }
  TempDir dir;
  IdxPair train, val;
};

TEST_F(Idx, ImportsGzip) {
  write_set(true);
  import_idx(dir.file("out.h5"), train, val, 4, {"a", "b", "c", "d"});
  expect_imported(dir.file("out.h5"));
  EXPECT_EQ(DatasetFile(dir.file("out.h5")).class_names()[2], "c");
}

TEST_F(Idx, ImportsUncompressed) {
  write_set(false);
  import_idx(dir.file("out.h5"), train, val, 4);
  expect_imported(dir.file("out.h5"));
}

TEST_F(Idx, SwappedFilesHaveBadMagic) {
  write_set(true);
  std::swap(val.images, val.labels);
  const std::string msg = import_error(val.images);
  EXPECT_THAT(msg, HasSubstr("bad magic number 2049"));
}

TEST_F(Idx, TruncatedGzipNamesByteOffset) {
  write_set(true);
  std::vector<std::uint8_t> full = idx_images_bytes(9, 6, 5, 2);
  full.resize(16 + 4 * 30 + 17);  // header, 4 images and part of the 5th
  write_bytes(val.images, full, true);
  const std::string msg = import_error(val.images);
  EXPECT_THAT(msg, HasSubstr("truncated at byte offset 153"));
}

TEST_F(Idx, TruncatedGzipStream) {
  write_set(true);
  fs::resize_file(train.labels, fs::file_size(train.labels) - 12);  // cut the deflate stream and its trailer
  const std::string msg = import_error(train.labels);
  EXPECT_THAT(msg, HasSubstr("byte offset"));
}

TEST_F(Idx, TruncatedRawHeader) {
  write_set(false);
  write_bytes(train.labels, {0, 0, 8, 1, 0, 0}, false);
  EXPECT_THAT(import_error(train.labels), HasSubstr("truncated at byte offset 6"));
}

TEST_F(Idx, AHeaderClaimingHugeImagesIsReadAsTruncatedNotAllocated) {
  // 16 bytes whose header claims 8192 images of 30000x30000: the first block's buffer was sized from the header
  // (8192 x 900 MB, std::bad_alloc); blocks are now at most 64 MiB (one image here), and the read finds the end.
  write_set(false);
  write_bytes(train.images, {0, 0, 8, 3, 0, 0, 0x20, 0, 0, 0, 0x75, 0x30, 0, 0, 0x75, 0x30}, false);
  write_bytes(train.labels, idx_labels_bytes(8192, 4, 0), false);
  EXPECT_THAT(import_error(train.images), HasSubstr("truncated at byte offset 16"));
}

TEST_F(Idx, CountMismatch) {
  write_set(true);
  write_bytes(val.labels, idx_labels_bytes(8, 4, 1), true);
  EXPECT_THAT(import_error(val.labels), HasSubstr("8 labels for 9 images"));
}

// A count damaged downwards (9 images and labels written, 7 in both headers): the two files still agree, and the
// import dropped the last samples without a word.
TEST_F(Idx, BytesAfterTheCountedItemsAreAnError) {
  for (const bool gz : {true, false}) {
    write_set(gz);
    std::vector<std::uint8_t> images = idx_images_bytes(9, 6, 5, 2), labels = idx_labels_bytes(9, 4, 1);
    images[7] = 7;  // the big-endian count's low byte
    labels[7] = 7;
    write_bytes(val.images, images, gz);
    write_bytes(val.labels, labels, gz);
    const std::string out = dir.file("out.h5");
    const std::string msg = error_of([&] { import_idx(out, train, val, 4); });
    EXPECT_THAT(msg, HasSubstr(val.images));
    EXPECT_THAT(msg, HasSubstr("60 more byte(s) after the 7 images the header counts"));
    EXPECT_FALSE(fs::exists(out));
    EXPECT_THAT(error_of([&] { (void)read_idx_labels(val.labels); }),
                HasSubstr("2 more byte(s) after the 7 labels the header counts"));
  }
}

TEST_F(Idx, ImageSizeMismatch) {
  write_set(true);
  write_bytes(val.images, idx_images_bytes(9, 5, 6, 2), true);
  EXPECT_THAT(import_error(val.images), HasSubstr("5x6"));
}

TEST_F(Idx, LabelOutOfRange) {
  write_set(true);
  const std::string out = dir.file("out.h5");
  const std::string msg = error_of([&] { import_idx(out, train, val, 3); });  // labels reach 3
  EXPECT_THAT(msg, HasSubstr(train.labels));
  EXPECT_THAT(msg, HasSubstr("label 3 at index 1"));
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Idx, MissingFile) {
  write_set(true);
  fs::remove(val.labels);
  EXPECT_THAT(import_error(val.labels, 3), HasSubstr("not found"));
}

TEST(FashionMnistImport, MissingSourceDirectory) {
  TempDir dir;
  const std::string msg = error_of([&] { import_fashion_mnist(dir.file("o.h5"), dir.file("no-such-dir")); });
  EXPECT_THAT(msg, HasSubstr("no-such-dir"));
  EXPECT_THAT(msg, HasSubstr("--src"));
}

TEST(Synthetic, DeterministicAndInRange) {
  TempDir dir;
  make_synthetic(dir.file("a.h5"), 40, 10, 9, 7, 3, 5, 1234);
  make_synthetic(dir.file("b.h5"), 40, 10, 9, 7, 3, 5, 1234);
  make_synthetic(dir.file("c.h5"), 40, 10, 9, 7, 3, 5, 99);
  const DatasetFile a(dir.file("a.h5")), b(dir.file("b.h5")), c(dir.file("c.h5"));
  EXPECT_EQ(a.size(Split::train), 40);
  EXPECT_EQ(a.size(Split::val), 10);
  EXPECT_EQ(a.info(Split::train).deflate_level, 0);
  EXPECT_NO_THROW(a.validate_labels());
  auto all = [](const DatasetFile& f, Split s) {
    std::vector<std::uint8_t> img(f.size(s) * f.sample_bytes());
    std::vector<std::int32_t> lab(f.size(s));
    f.read(s, 0, f.size(s), img.data(), lab.data());
    return std::make_pair(img, lab);
  };
  for (Split s : kAllSplits) {
    EXPECT_EQ(all(a, s), all(b, s));
    EXPECT_NE(all(a, s).first, all(c, s).first);
  }
  EXPECT_EQ(a.mean(), b.mean());
  const auto hist = a.label_histogram(Split::train);
  EXPECT_EQ(std::count(hist.begin(), hist.end(), 0), 0) << "40 samples should hit all 5 classes";
}

}  // namespace
}  // namespace renaissance::io
