// Issue 12 on the C++ side: JPEG stores (format 3) written and read back, their corruption checks, older versions
// still read; image decoding's refusals (each naming the input); the pickle reader on malformed input; the loader
// pool. The byte-for-byte comparisons with Pillow, h5py and pickle are in check_image.py and check_importers.py.
#include "io_test_util.h"

#include <renaissance/io/image.h>
#include <renaissance/io/loader_pool.h>
#include <renaissance/io/pickle.h>

#include <gmock/gmock.h>

#include <array>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;
using ::testing::HasSubstr;

/// A smooth image with noise (JPEG-friendly, distinct per seed).
std::vector<std::uint8_t> test_pixels(std::int64_t h, std::int64_t w, int c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(h * w * c));
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        px[static_cast<std::size_t>((y * w + x) * c + k)] =
            static_cast<std::uint8_t>((x * (3 + k) + y * 5 + seed * 17 + rng() % 24) & 0xff);
  return px;
}

struct Sample {
  std::vector<std::uint8_t> jpeg;
  std::int64_t h = 0, w = 0;
  std::int32_t label = 0;
};

/// Writes a JPEG store of n_train + n_val images of assorted sizes; returns them in order.
std::vector<Sample> write_jpeg_store(const std::string& path, int n_train, int n_val, int channels = 3) {
  DatasetWriter w(path, JpegStoreSpec{channels, 90, 0}, 5, {});
  std::vector<Sample> all;
  for (int i = 0; i < n_train + n_val; ++i) {
    Sample s;
    s.h = 8 + (i * 7) % 41;
    s.w = 9 + (i * 11) % 37;
    s.label = (i * 3) % 5;
    const auto px = test_pixels(s.h, s.w, channels, static_cast<std::uint32_t>(i));
    s.jpeg = encode_jpeg(px.data(), s.h, s.w, channels, 90, "test");
    const Image back = decode_image(s.jpeg.data(), s.jpeg.size(), channels, "test");
    w.append_encoded(i < n_train ? Split::train : Split::val, s.jpeg.data(), static_cast<std::int64_t>(s.jpeg.size()),
                     s.h, s.w, s.label, back.pixels.data());
    all.push_back(std::move(s));
  }
  w.finish();
  return all;
}

class JpegStore : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_jpeg_codec()) GTEST_SKIP() << "built without libturbojpeg";
    path = dir.file("store.h5");
    samples = write_jpeg_store(path, 23, 6);
  }
  TempDir dir;
  std::string path;
  std::vector<Sample> samples;
};

TEST_F(JpegStore, RoundTripInAnyOrder) {
  const DatasetFile f(path);
  EXPECT_EQ(f.version(), 3);
  EXPECT_EQ(f.storage(), Storage::jpeg);
  EXPECT_EQ(f.channels(), 3);
  EXPECT_EQ(f.sample_bytes(), 0);
  EXPECT_EQ(f.jpeg_spec().quality, 90);
  const SplitInfo& t = f.info(Split::train);
  EXPECT_EQ(t.count, 23);
  EXPECT_EQ(f.size(Split::val), 6);
  std::int64_t bytes = 0, min_h = 1 << 30, max_w = 0;
  for (int i = 0; i < 23; ++i) {
    bytes += static_cast<std::int64_t>(samples[i].jpeg.size());
    min_h = std::min(min_h, samples[i].h);
    max_w = std::max(max_w, samples[i].w);
  }
  EXPECT_EQ(t.encoded_bytes, bytes);
  EXPECT_EQ(t.min_height, min_h);
  EXPECT_EQ(t.max_width, max_w);
  const std::vector<std::int64_t> idx = {5, 0, 22, 5, 13, 1};
  EncodedBatch b;
  f.read_encoded(Split::train, idx, b);
  ASSERT_EQ(b.count(), 6);
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const Sample& s = samples[static_cast<std::size_t>(idx[k])];
    EXPECT_EQ(std::vector<std::uint8_t>(b.data(k), b.data(k) + b.size(k)), s.jpeg) << "sample " << idx[k];
    EXPECT_EQ(b.heights[k], s.h);
    EXPECT_EQ(b.widths[k], s.w);
    EXPECT_EQ(b.labels[k], s.label);
  }
  f.read_encoded(Split::val, {5}, b);
  EXPECT_EQ(std::vector<std::uint8_t>(b.data(0), b.data(0) + b.size(0)), samples[28].jpeg);
  // Raw reads are refused by name; labels alone work for any store.
  std::vector<std::uint8_t> px(1 << 16);
  EXPECT_THAT(error_of([&] { f.read(Split::train, 0, 1, px.data(), nullptr); }), HasSubstr("JPEG store"));
  std::vector<std::int32_t> labels(23);
  f.read(Split::train, 0, 23, nullptr, labels.data());
  for (int i = 0; i < 23; ++i) EXPECT_EQ(labels[i], samples[i].label);
  EXPECT_NO_THROW(f.verify(Split::train));
  EXPECT_NO_THROW(f.verify(Split::val));
  EXPECT_EQ(f.label_histogram(Split::train)[0], 5);  // labels 0 at i = 0, 5, 10, 15, 20
  EXPECT_THAT(error_of([&] { f.read_encoded(Split::train, {23}, b); }), HasSubstr("idx[0] = 23 out of range"));
}

TEST_F(JpegStore, MeanAndStdAreThoseOfTheDecodedTrainImages) {
  const DatasetFile f(path);
  double s[3] = {0, 0, 0}, q[3] = {0, 0, 0}, n = 0;
  for (int i = 0; i < 23; ++i) {
    const Image img = decode_image(samples[i].jpeg.data(), samples[i].jpeg.size(), 3, "test");
    for (std::int64_t p = 0; p < img.height * img.width; ++p)
      for (int k = 0; k < 3; ++k) {
        const double v = img.pixels[static_cast<std::size_t>(p * 3 + k)];
        s[k] += v;
        q[k] += v * v;
      }
    n += static_cast<double>(img.height * img.width);
  }
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(f.mean()[k], s[k] / n / 255.0, 1e-6);
    EXPECT_NEAR(f.stddev()[k], std::sqrt(q[k] / n - (s[k] / n) * (s[k] / n)) / 255.0, 1e-5);
  }
}

// Shuffled reads go past HDF5 (pread at the chunks' addresses, verified by the content checksums): the bytes equal
// what HDF5 reads (RENAISSANCE_JPEG_DIRECT_READ=0), in any order, and a flipped byte is still named (below).
TEST_F(JpegStore, DirectReadsEqualTheReadsThroughHdf5) {
  // Images of ~20-40 KB, so that many cross the 64 KiB chunks' boundaries.
  const std::string big = dir.file("big.h5");
  {
    DatasetWriter w(big, JpegStoreSpec{3, 95, 0}, 5, {});
    for (int i = 0; i < 30; ++i) {
      const int h = 100 + i % 7, wd = 150 + i % 5;
      const auto px = test_pixels(h, wd, 3, static_cast<std::uint32_t>(i + 100));
      const auto j = encode_jpeg(px.data(), h, wd, 3, 95, "test");
      w.append_encoded(i < 26 ? Split::train : Split::val, j.data(), static_cast<std::int64_t>(j.size()), h, wd, i % 5,
                       px.data());
    }
    w.finish();
  }
  std::vector<std::int64_t> idx;
  for (std::int64_t i = 0; i < 26; ++i) idx.push_back((i * 11 + 3) % 26);
  EncodedBatch direct, hdf5;
  {
    const DatasetFile f(big);
    f.read_encoded(Split::train, idx, direct);
  }
  ::setenv("RENAISSANCE_JPEG_DIRECT_READ", "0", 1);
  {
    const DatasetFile f(big);
    f.read_encoded(Split::train, idx, hdf5);
  }
  ::unsetenv("RENAISSANCE_JPEG_DIRECT_READ");
  ASSERT_GT(direct.bytes.size(), std::size_t(3) << 16) << "the test needs images across several chunks";
  EXPECT_EQ(direct.bytes, hdf5.bytes);
  EXPECT_EQ(direct.offsets, hdf5.offsets);
  EXPECT_EQ(direct.labels, hdf5.labels);
  EXPECT_EQ(direct.heights, hdf5.heights);
}

TEST_F(JpegStore, AFlippedByteIsNamed) {
  corrupt_chunk(path, "/train/jpeg", 0);
  const DatasetFile f(path);
  EXPECT_THAT(error_of([&] { f.verify(Split::train); }), HasSubstr("/train/jpeg"));
}

TEST_F(JpegStore, OffsetsThatDoNotAddUpAreRefused) {
  replace_dataset(path, "/val/offsets", H5T_STD_I64LE, {7});  // all zeros
  EXPECT_THAT(error_of([&] { DatasetFile f(path); }), HasSubstr("/val/offsets"));
}

TEST_F(JpegStore, ShapesOfTheWrongRankAreRefused) {
  replace_dataset(path, "/train/shapes", H5T_STD_I32LE, {23});
  EXPECT_THAT(error_of([&] { DatasetFile f(path); }), HasSubstr("/train/shapes"));
}

TEST_F(JpegStore, AnUnknownStorageIsRefused) {
  set_string_attr(path, "storage", "webp");
  EXPECT_THAT(error_of([&] { DatasetFile f(path); }), HasSubstr("attribute 'storage' is 'webp'"));
}

TEST_F(JpegStore, ImportParametersOutOfRangeAreRefused) {
  // Only descriptive (data inspect shows them), yet a store whose attributes no writer makes is not read as valid.
  set_int_attr(path, "jpeg_quality", 0);
  EXPECT_THAT(error_of([&] { DatasetFile f(path); }), HasSubstr("attribute 'jpeg_quality' = 0"));
  set_int_attr(path, "jpeg_quality", 90);
  set_int_attr(path, "max_side", -5);
  EXPECT_THAT(error_of([&] { DatasetFile f(path); }), HasSubstr("attribute 'max_side' = -5"));
  set_int_attr(path, "max_side", 0);
  EXPECT_NO_THROW(DatasetFile f(path));
}

TEST(DatasetVersions, Version2RawFilesStillRead) {
  TempDir dir;
  const std::string path = dir.file("v2.h5");
  write_small(path);
  {
    const DatasetFile f(path);
    EXPECT_EQ(f.version(), 3);
    EXPECT_EQ(f.storage(), Storage::raw);
  }
  // What a version 2 writer made: no storage attribute.
  set_int_attr(path, "version", 2);
  delete_attr(path, "storage");
  {
    const DatasetFile f(path);
    EXPECT_EQ(f.version(), 2);
    EXPECT_EQ(f.storage(), Storage::raw);
    EXPECT_NO_THROW(f.verify(Split::train));
  }
  // Version 3 says how it stores its images.
  set_int_attr(path, "version", 3);
  EXPECT_THAT(error_of([&] { DatasetFile g(path); }), HasSubstr("missing root attribute 'storage'"));
}

// ---- decoding refusals ---------------------------------------------------------------------------------------------

class Decode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_jpeg_codec() || !have_png_codec()) GTEST_SKIP() << "built without the image codecs";
    px = test_pixels(40, 50, 3, 1);
    jpeg = encode_jpeg(px.data(), 40, 50, 3, 90, "test");
  }
  std::vector<std::uint8_t> px, jpeg;
};

TEST_F(Decode, NotAnImageEmptyAndTruncated) {
  const std::string text = "hello, this is text";
  EXPECT_THAT(error_of([&] { decode_image(reinterpret_cast<const std::uint8_t*>(text.data()), text.size(), 3, "a.jpg"); }),
              HasSubstr("a.jpg: not a JPEG or PNG image"));
  EXPECT_THAT(error_of([&] { decode_image(jpeg.data(), 0, 3, "b.jpg"); }), HasSubstr("b.jpg: the file is empty"));
  EXPECT_THAT(error_of([&] { decode_image(jpeg.data(), jpeg.size() / 2, 3, "c.jpg"); }),
              HasSubstr("c.jpg: the JPEG data ends before the image is complete"));
  // The decoder of this thread still works after the failures (a TurboJPEG handle is replaced after an error).
  const Image ok = decode_image(jpeg.data(), jpeg.size(), 3, "d.jpg");
  EXPECT_EQ(ok.height, 40);
  EXPECT_EQ(ok.width, 50);
  std::vector<std::uint8_t> garbage = jpeg;
  for (std::size_t i = 2; i < 40; ++i) garbage[i] = static_cast<std::uint8_t>(i * 37);
  EXPECT_THAT(error_of([&] { decode_image(garbage.data(), garbage.size(), 3, "e.jpg"); }), HasSubstr("e.jpg"));
  EXPECT_EQ(decode_image(jpeg.data(), jpeg.size(), 1, "f.jpg").channels, 1);
}

TEST_F(Decode, HugeHeadersAreRefusedBeforeDecoding) {
  // A JPEG whose frame header claims 20000 x 20000 (the pixels would take 1.2 GB).
  std::vector<std::uint8_t> bomb = jpeg;
  for (std::size_t i = 2; i + 9 < bomb.size();) {
    const std::uint8_t m = bomb[i + 1];
    const std::size_t len = (bomb[i + 2] << 8) | bomb[i + 3];
    if (m == 0xc0 || m == 0xc2) {
      bomb[i + 5] = 20000 >> 8;
      bomb[i + 6] = 20000 & 0xff;
      bomb[i + 7] = 20000 >> 8;
      bomb[i + 8] = 20000 & 0xff;
      break;
    }
    i += 2 + len;
  }
  EXPECT_THAT(error_of([&] { decode_image(bomb.data(), bomb.size(), 3, "bomb.jpg"); }),
              HasSubstr("bomb.jpg: the JPEG image is 20000x20000 = 400000000 pixels, more than the limit"));
  // A PNG header claiming the same.
  std::vector<std::uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
  for (std::uint32_t v : {20000u, 20000u}) put_be32(png, v);
  for (std::uint8_t b : {8, 2, 0, 0, 0}) png.push_back(b);
  put_be32(png, static_cast<std::uint32_t>(crc32(0, png.data() + 12, 17)));
  EXPECT_THAT(error_of([&] { decode_image(png.data(), png.size(), 3, "bomb.png"); }),
              HasSubstr("bomb.png: the PNG image is 20000x20000"));
  DecodeLimits tight;
  tight.max_pixels = 1000;
  EXPECT_THAT(error_of([&] { decode_image(jpeg.data(), jpeg.size(), 3, "small.jpg", tight); }),
              HasSubstr("2000 pixels, more than the limit of 1000"));
}

TEST_F(Decode, RegionsRefuseBoxesOutsideAndFailOnBadFilesAsTheWholeDecode) {
  // decode_image_region (the loader's random-resized crops): a box outside the image is an error naming the file; a
  // truncated, garbled, empty or foreign file fails as decode_image does, whatever the box; the bomb limit holds.
  for (const auto& [y0, x0, h, w] : std::vector<std::array<std::int64_t, 4>>{
           {0, 0, 41, 50}, {0, 0, 40, 51}, {-1, 0, 5, 5}, {0, -1, 5, 5}, {39, 49, 2, 1}, {0, 0, 0, 5}, {0, 0, 5, 0}})
    EXPECT_THAT(error_of([&] { decode_image_region(jpeg.data(), jpeg.size(), 3, "box.jpg", y0, x0, h, w); }),
                HasSubstr("box.jpg: the region")) << y0 << " " << x0 << " " << h << " " << w;
  EXPECT_THAT(error_of([&] { decode_image_region(jpeg.data(), jpeg.size() / 2, 3, "cut.jpg", 0, 0, 2, 2); }),
              HasSubstr("cut.jpg: the JPEG data ends before the image is complete"));
  std::vector<std::uint8_t> garbage = jpeg;
  for (std::size_t i = 2; i < 40; ++i) garbage[i] = static_cast<std::uint8_t>(i * 37);
  EXPECT_THAT(error_of([&] { decode_image_region(garbage.data(), garbage.size(), 3, "g.jpg", 0, 0, 2, 2); }),
              HasSubstr("g.jpg"));
  EXPECT_THAT(error_of([&] { decode_image_region(jpeg.data(), 0, 3, "e.jpg", 0, 0, 1, 1); }),
              HasSubstr("e.jpg: the file is empty"));
  DecodeLimits tight;
  tight.max_pixels = 1000;
  EXPECT_THAT(error_of([&] { decode_image_region(jpeg.data(), jpeg.size(), 3, "s.jpg", 0, 0, 1, 1, tight); }),
              HasSubstr("2000 pixels, more than the limit of 1000"));
  // After the failures the decoders of this thread still work: the part equals the whole decode there.
  const Image whole = decode_image(jpeg.data(), jpeg.size(), 3, "ok.jpg");
  const ImageRegion r = decode_image_region(jpeg.data(), jpeg.size(), 3, "ok.jpg", 10, 21, 7, 9);
  EXPECT_EQ(r.full_h, 40);
  EXPECT_EQ(r.full_w, 50);
  ASSERT_LE(r.row0, 10);
  ASSERT_LE(r.col0, 21);
  ASSERT_GE(r.row0 + r.image.height, 17);
  ASSERT_GE(r.col0 + r.image.width, 30);
  for (std::int64_t y = 0; y < r.image.height; ++y)
    ASSERT_EQ(0, std::memcmp(r.image.pixels.data() + y * r.image.width * 3,
                             whole.pixels.data() + ((r.row0 + y) * 50 + r.col0) * 3,
                             static_cast<std::size_t>(r.image.width * 3)))
        << "row " << r.row0 + y;
  if (have_region_decode()) {
    EXPECT_LT(r.image.height * r.image.width, 40 * 50);  // really a part
  }
}

// ---- the pickle reader ----------------------------------------------------------------------------------------------

std::string load_error(const std::string& bytes) {
  return error_of([&] { pickle::load(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), "p.pkl"); });
}

TEST(Pickle, ReadsTheOpcodesOfPython2AndPython3) {
  // {'data': 'ab', 'labels': [1, 2, 300]} as Python 2's cPickle (protocol 2) writes it.
  const std::string py2 =
      std::string("\x80\x02}q\x00(U\x04" "dataq\x01U\x02" "abq\x02U\x06labelsq\x03]q\x04(K\x01K\x02M,\x01" "eu.", 44);
  const pickle::Document doc = pickle::load(reinterpret_cast<const std::uint8_t*>(py2.data()), py2.size(), "py2");
  const pickle::Value& v = doc.root();
  ASSERT_TRUE(v.is(pickle::Value::Kind::dict));
  std::string data;
  ASSERT_TRUE(pickle::as_bytes(*v.get("data"), data));
  EXPECT_EQ(data, "ab");
  const pickle::Value* labels = v.get("labels");
  ASSERT_NE(labels, nullptr);
  ASSERT_EQ(labels->items.size(), 3u);
  EXPECT_EQ(labels->items[2]->i, 300);
  // b'\xe9' as Python 3 writes bytes under protocol 2: _codecs.encode('\u00e9', 'latin1').
  const std::string py3 = std::string("\x80\x02" "c_codecs\nencode\nq\x00X\x02\x00\x00\x00\xc3\xa9q\x01X\x06\x00\x00\x00" "latin1q\x02\x86q\x03Rq\x04.", 49);
  const pickle::Document b = pickle::load(reinterpret_cast<const std::uint8_t*>(py3.data()), py3.size(), "py3");
  ASSERT_TRUE(pickle::as_bytes(b.root(), data));
  EXPECT_EQ(data, "\xe9");
  // A list that holds itself (legal: the memo; no leak), and bytes() of nothing (Python 3 pickles b"" so).
  const std::string cycle = std::string("\x80\x02]q\x00h\x00" "a.", 9);
  const pickle::Document c = pickle::load(reinterpret_cast<const std::uint8_t*>(cycle.data()), cycle.size(), "cycle");
  ASSERT_EQ(c.root().items.size(), 1u);
  EXPECT_EQ(c.root().items[0], &c.root());
  const std::string self_arg = std::string("\x80\x02" "c__builtin__\nbytes\nq\x00)Rq\x01.", 28);
  const pickle::Document e = pickle::load(reinterpret_cast<const std::uint8_t*>(self_arg.data()), self_arg.size(), "e");
  ASSERT_TRUE(pickle::as_bytes(e.root(), data));
  EXPECT_EQ(data, "");
}

TEST(Pickle, MalformedInputIsAnErrorWithItsOffset) {
  EXPECT_THAT(load_error(""), HasSubstr("p.pkl: pickle byte offset 0: needs 1 more bytes"));
  EXPECT_THAT(load_error(std::string("\x80\x02T\xff\xff\xff\x7f", 7)), HasSubstr("needs 2147483647 more bytes"));
  EXPECT_THAT(load_error("\x80\x02Z."), HasSubstr("unsupported opcode 0x5a"));
  EXPECT_THAT(load_error("\x80\x02h\x05."), HasSubstr("memo entry 5 was never stored"));
  EXPECT_THAT(load_error("\x80\x02s."), HasSubstr("pop from an empty stack"));
  EXPECT_THAT(load_error("\x80\x02K\x01K\x02."), HasSubstr("STOP with a stack"));
  EXPECT_THAT(load_error("\x80\x02K\x01"), HasSubstr("needs 1 more bytes"));
  // Bytes that only add references: DUPs (a 390 KB tarball of them grew the stack to gigabytes), MARKs, a list
  // appended to itself through the memo. Each is refused at the limit, at its offset.
  const std::size_t over = (std::size_t(1) << 24) + 1;
  EXPECT_THAT(load_error("\x80\x02]" + std::string(over, '2') + "."),
              HasSubstr("pickle byte offset 16777219: more than 16777216 references to values"));
  EXPECT_THAT(load_error("\x80\x02" + std::string(over, '(') + "."), HasSubstr("more than 16777216 references"));
  std::string self_appends = std::string("\x80\x02]q\x00", 5);
  for (std::size_t i = 0; i < over / 2 + 1; ++i) self_appends += std::string("h\x00" "a", 3);
  EXPECT_THAT(load_error(self_appends + "."), HasSubstr("more than 16777216 references"));
  // Random bytes: never a crash, always an Error (or, rarely, a value).
  std::mt19937 rng(4);
  for (int t = 0; t < 2000; ++t) {
    std::string s(static_cast<std::size_t>(rng() % 64), '\0');
    for (char& ch : s) ch = static_cast<char>(rng());
    try {
      pickle::load(reinterpret_cast<const std::uint8_t*>(s.data()), s.size(), "r");
    } catch (const Error&) {
    }
  }
}

// ---- the loader pool ------------------------------------------------------------------------------------------------

TEST(LoaderPool, EveryIndexOnceFromSeveralCallers) {
  LoaderPool pool(3);
  std::vector<std::atomic<int>> hits(5000);
  auto loop = [&](std::int64_t first) {
    pool.parallel_for(2500, [&](std::int64_t i) { hits[static_cast<std::size_t>(first + i)]++; });
  };
  std::thread other([&] { loop(2500); });
  loop(0);
  other.join();
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_GE(available_cpus(), 1);
}

TEST(LoaderPool, TheFirstExceptionReachesTheCaller) {
  for (int threads : {0, 2}) {
    LoaderPool pool(threads);
    std::atomic<int> ran{0};
    EXPECT_THAT(error_of([&] {
                  pool.parallel_for(1000, [&](std::int64_t i) {
                    ++ran;
                    if (i == 10) RN_FAIL("sample {} is broken", i);
                  });
                }),
                HasSubstr("sample 10 is broken"));
    EXPECT_LT(ran.load(), 1000 + 1);
    pool.parallel_for(4, [](std::int64_t) {});  // usable afterwards
  }
}

}  // namespace
}  // namespace renaissance::io

namespace renaissance::io {
namespace {

// A window of the resampling table is the whole table's entries (each depends on its index alone): the resampler
// builds only the window's, so a centre crop of a 1x5000 image at --val-resize 65535 no longer builds 3.3e8 entries
// per sample (the run took minutes). Up- and downsampling, windows at both ends and inside.
TEST(ResampleTable, AWindowHoldsTheWholeTablesEntries) {
  for (const auto& [in, out] : std::vector<std::pair<std::int64_t, std::int64_t>>{{37, 224}, {500, 224}, {5, 5000}}) {
    const ResampleTable whole = resample_table(in, out);
    for (const auto& [first, count] :
         std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 7}, {out / 3, out / 4 + 1}, {out - 9, 9}}) {
      const ResampleTable w = resample_table(in, out, first, count);
      ASSERT_EQ(w.ksize, whole.ksize);
      ASSERT_EQ(w.first, first);
      ASSERT_EQ(w.bounds.size(), static_cast<std::size_t>(count * 2));
      for (std::int64_t i = 0; i < count; ++i) {
        EXPECT_EQ(w.bounds[i * 2], whole.bounds[(first + i) * 2]) << in << "->" << out << " entry " << first + i;
        EXPECT_EQ(w.bounds[i * 2 + 1], whole.bounds[(first + i) * 2 + 1]);
        for (int k = 0; k < w.ksize; ++k)
          EXPECT_EQ(w.coeffs[i * w.ksize + k], whole.coeffs[(first + i) * whole.ksize + k]);
      }
    }
  }
  EXPECT_THROW(resample_table(10, 20, 15, 6), Error);  // past the end
}

}  // namespace
}  // namespace renaissance::io
