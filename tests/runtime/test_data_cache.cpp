// --data-cache's decision (runtime/gpu_input.h), a pure function: when the device-resident dataset cache is used,
// why not otherwise, and `on` refusing with the reason.
#include <renaissance/core/error.h>
#include <renaissance/io/dataset.h>
#include <renaissance/runtime/gpu_input.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

namespace {

using namespace renaissance;
using runtime::DataCacheMode;

constexpr std::int64_t GiB = std::int64_t(1) << 30;

runtime::DataCacheRequest usable() {
  runtime::DataCacheRequest r;
  r.gpu = true;
  r.raw_store = true;
  r.bytes = 60 * (std::int64_t(1) << 20);
  r.free_bytes = 100 * GiB;
  r.total_bytes = 140 * GiB;
  return r;
}

TEST(DataCache, AutoUsesItWhenItFits) { EXPECT_TRUE(runtime::decide_data_cache(usable()).use); }

TEST(DataCache, AutoFallsBackWithAReason) {
  auto expect_no = [](runtime::DataCacheRequest r, const std::string& word) {
    const runtime::DataCacheDecision d = runtime::decide_data_cache(r);
    EXPECT_FALSE(d.use) << word;
    EXPECT_NE(d.reason.find(word), std::string::npos) << d.reason;
  };
  runtime::DataCacheRequest r = usable();
  r.mode = DataCacheMode::off;
  expect_no(r, "off");
  r = usable();
  r.gpu = false;
  expect_no(r, "CUDA");
  r = usable();
  r.raw_store = false;
  expect_no(r, "JPEG");
  r = usable();
  r.progressive = true;
  expect_no(r, "progressive");
  r = usable();
  r.bytes = 36 * GiB;  // over 25 % of 140 GiB (35 GiB), though free memory would hold it
  expect_no(r, "25 %");
  r = usable();
  r.bytes = 30 * GiB;
  r.free_bytes = 30 * GiB;  // under the share, but no headroom left
  expect_no(r, "free");
  r = usable();
  r.bytes = 35 * GiB;  // exactly the share: used
  EXPECT_TRUE(runtime::decide_data_cache(r).use);
}

TEST(DataCache, AJpegStoreIsCachedWhenTheGpuDecodesIt) {
  runtime::DataCacheRequest r = usable();
  r.raw_store = false;
  r.jpeg_on_gpu = true;  // --decode gpu: decoded once into the cache
  EXPECT_TRUE(runtime::decide_data_cache(r).use);
  r.bytes = 36 * GiB;  // the decoded images over the share (ImageNet's ~1.28 M images are ~180 GiB decoded)
  EXPECT_FALSE(runtime::decide_data_cache(r).use);
  r = usable();
  r.raw_store = false;
  r.jpeg_on_gpu = false;  // decoded by the CPU: nothing to cache
  const runtime::DataCacheDecision d = runtime::decide_data_cache(r);
  EXPECT_FALSE(d.use);
  EXPECT_NE(d.reason.find("--decode gpu"), std::string::npos) << d.reason;
}

// What the cache of a JPEG store takes on the device: every image of both splits at its own size, each 256-aligned
// (the layout nvJPEG's batched decode writes a batch in), from the store's shapes alone.
TEST(DataCache, AJpegStoresDecodedBytesComeFromItsShapes) {
  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() / ("rn_data_cache_" + std::to_string(::getpid()) + ".h5");
  const std::vector<std::uint8_t> bytes(100, 7);  // the writer does not decode: any bytes
  const std::int64_t shapes[3][2] = {{375, 500}, {33, 45}, {224, 224}};
  {
    io::DatasetWriter w(path.string(), io::JpegStoreSpec{}, 2);
    for (int i = 0; i < 3; ++i) {
      std::vector<std::uint8_t> px(static_cast<std::size_t>(shapes[i][0] * shapes[i][1] * 3));  // the statistics
      for (std::size_t q = 0; q < px.size(); ++q) px[q] = static_cast<std::uint8_t>(q * 7);
      w.append_encoded(i < 2 ? io::Split::train : io::Split::val, bytes.data(), 100, shapes[i][0], shapes[i][1], i % 2,
                       px.data());
    }
    w.finish();
  }
  const io::DatasetFile f(path.string());
  EXPECT_EQ(f.jpeg_shapes(io::Split::train), (std::vector<std::int32_t>{375, 500, 33, 45}));
  EXPECT_EQ(f.jpeg_shapes(io::Split::val), (std::vector<std::int32_t>{224, 224}));
  auto aligned = [](std::int64_t b) { return (b + 255) / 256 * 256; };
  EXPECT_EQ(runtime::GpuDataCache::jpeg_image_bytes(f),
            aligned(375 * 500 * 3) + aligned(33 * 45 * 3) + aligned(224 * 224 * 3));
  fs::remove(path);
}

TEST(DataCache, OnRefusesWithTheReason) {
  runtime::DataCacheRequest r = usable();
  r.mode = DataCacheMode::on;
  EXPECT_TRUE(runtime::decide_data_cache(r).use);
  r.raw_store = false;
  try {
    runtime::decide_data_cache(r);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--data-cache on"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("JPEG"), std::string::npos) << e.what();
  }
}

TEST(DataCache, ParsesItsValues) {
  EXPECT_EQ(runtime::parse_data_cache("auto"), DataCacheMode::automatic);
  EXPECT_EQ(runtime::parse_data_cache("off"), DataCacheMode::off);
  EXPECT_EQ(runtime::parse_data_cache("on"), DataCacheMode::on);
  EXPECT_THROW(runtime::parse_data_cache("yes"), Error);
}

}  // namespace
