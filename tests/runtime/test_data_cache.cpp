// --data-cache's decision (runtime/gpu_input.h), a pure function: when the device-resident dataset cache is used,
// why not otherwise, and `on` refusing with the reason.
#include <renaissance/core/error.h>
#include <renaissance/runtime/gpu_input.h>

#include <gtest/gtest.h>

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
