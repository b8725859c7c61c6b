// --decode gpu|cpu|auto (runtime/gpu_jpeg.h): the decision, without a GPU; and the loader's undecoded batches
// (LoaderOptions::encoded), which the GPU path decodes with nvJPEG.
#include <renaissance/core/error.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/dataset.h>
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/gpu_jpeg.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/runtime_api.h>
#endif

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <unistd.h>

#include <filesystem>

namespace {

using namespace renaissance;
using runtime::decide_decode;
using runtime::DecodeMode;

TEST(DecodeMode, ParsesAndNames) {
  EXPECT_EQ(runtime::parse_decode("auto"), DecodeMode::automatic);
  EXPECT_EQ(runtime::parse_decode("gpu"), DecodeMode::gpu);
  EXPECT_EQ(runtime::parse_decode("cpu"), DecodeMode::cpu);
  EXPECT_STREQ(runtime::decode_name(DecodeMode::gpu), "gpu");
  try {
    runtime::parse_decode("nvjpeg");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--decode"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nvjpeg"), std::string::npos) << e.what();
  }
}

TEST(DecodeMode, Decision) {
  // auto: the CPU (the GPU path is opt-in until its render test passes on a GPU); gpu needs the CUDA backend, a
  // JPEG store and nvJPEG in the build.
  EXPECT_FALSE(decide_decode(DecodeMode::automatic, true, true, true).gpu);  // opt-in until verified on a GPU
  EXPECT_TRUE(decide_decode(DecodeMode::gpu, true, true, true).gpu);
  EXPECT_FALSE(decide_decode(DecodeMode::automatic, false, true, true).gpu);
  EXPECT_EQ(decide_decode(DecodeMode::automatic, false, true, true).reason, "not the CUDA backend");
  EXPECT_FALSE(decide_decode(DecodeMode::automatic, true, true, false).gpu);
  EXPECT_NE(decide_decode(DecodeMode::automatic, true, true, false).reason.find("no nvJPEG"), std::string::npos);
  EXPECT_FALSE(decide_decode(DecodeMode::cpu, true, true, true).gpu);
  EXPECT_TRUE(decide_decode(DecodeMode::gpu, true, true, true).gpu);
  // Raw stores: nothing to decode, whatever the mode (also gpu: the option concerns JPEG stores).
  EXPECT_FALSE(decide_decode(DecodeMode::gpu, false, false, false).gpu);
  EXPECT_TRUE(decide_decode(DecodeMode::gpu, false, false, false).reason.empty());
  // gpu where it is impossible: an error with the reason.
  for (auto [cuda, nvjpeg, why] :
       {std::tuple{false, true, "not the CUDA backend"}, std::tuple{true, false, "no nvJPEG"}}) {
    try {
      decide_decode(DecodeMode::gpu, cuda, true, nvjpeg);
      ADD_FAILURE() << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--decode gpu"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// The loader hands the JPEG bytes over as stored: every sample's bytes, shape, label and index in the epoch's
// order, batch by batch (the last partial), with nothing decoded (the bytes here are not even JPEGs).
TEST(DecodeMode, LoaderDeliversUndecodedBatches) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("rn_decode_mode_{}", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / "store.h5").string();
  const int n = 23;
  {
    io::DatasetWriter w(path, io::JpegStoreSpec{}, 5);
    for (int i = 0; i < n; ++i) {
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(10 + i), static_cast<std::uint8_t>(i));
      std::vector<std::uint8_t> pixels(static_cast<std::size_t>((4 + i) * (3 + i) * 3));
      for (std::size_t k = 0; k < pixels.size(); ++k) pixels[k] = static_cast<std::uint8_t>(k * 31 + i);
      w.append_encoded(io::Split::train, bytes.data(), static_cast<std::int64_t>(bytes.size()), 4 + i, 3 + i, i % 5,
                       pixels.data());
    }
    w.finish();
  }
  io::DatasetFile f(path);
  const std::vector<std::int64_t> order = runtime::epoch_order(9, 2, n, true);
  io::LoaderOptions lo;
  lo.encoded = true;
  io::BatchLoader loader(f, io::Split::train, 8, order, {}, std::nullopt, lo);
  std::int64_t seen = 0;
  while (auto b = loader.next()) {
    ASSERT_NE(b->encoded, nullptr);
    EXPECT_EQ(b->images, nullptr);
    EXPECT_EQ(b->count, b->index < 2 ? 8 : 7);
    for (std::int64_t i = 0; i < b->count; ++i) {
      const std::int64_t idx = order[static_cast<std::size_t>(b->first_position + i)];
      EXPECT_EQ(b->indices[i], idx);
      EXPECT_EQ(b->labels[i], idx % 5);
      EXPECT_EQ(b->encoded->heights[static_cast<std::size_t>(i)], 4 + idx);
      EXPECT_EQ(b->encoded->widths[static_cast<std::size_t>(i)], 3 + idx);
      ASSERT_EQ(b->encoded->size(i), 10 + idx);
      EXPECT_EQ(b->encoded->data(i)[0], static_cast<std::uint8_t>(idx));
      ++seen;
    }
  }
  EXPECT_EQ(seen, n);
  // take_encoded: each batch's bytes swapped out (no copy) stay the caller's after later next() calls, while the
  // loader keeps reading into the buffers it got in exchange.
  {
    io::BatchLoader taker(f, io::Split::train, 8, order, {}, std::nullopt, lo);
    std::vector<io::EncodedBatch> kept(3);
    std::vector<std::vector<std::int64_t>> kept_indices;
    while (auto b = taker.next()) {
      kept_indices.emplace_back(b->indices, b->indices + b->count);  // before the slot goes back
      taker.take_encoded(kept[static_cast<std::size_t>(b->index)]);
      EXPECT_EQ(kept[static_cast<std::size_t>(b->index)].count(), b->count);
      io::EncodedBatch twice;
      EXPECT_THROW(taker.take_encoded(twice), Error) << "the slot went back with the first take";
    }
    ASSERT_EQ(kept_indices.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k)
      for (std::int64_t i = 0; i < kept[k].count(); ++i) {
        const std::int64_t idx = kept_indices[k][static_cast<std::size_t>(i)];
        EXPECT_EQ(kept[k].labels[static_cast<std::size_t>(i)], idx % 5);
        EXPECT_EQ(kept[k].heights[static_cast<std::size_t>(i)], 4 + idx);
        ASSERT_EQ(kept[k].size(i), 10 + idx);
        EXPECT_EQ(kept[k].data(i)[9], static_cast<std::uint8_t>(idx)) << "batch " << k << " sample " << i;
      }
    // Outside an encoded batch it is an internal error, not a silent swap.
    io::BatchLoader fresh(f, io::Split::train, 8, order, {}, std::nullopt, lo);
    io::EncodedBatch none;
    EXPECT_THROW(fresh.take_encoded(none), Error);
  }
  // Raw stores have nothing to deliver undecoded.
  const std::string raw = (dir / "raw.h5").string();
  {
    io::DatasetWriter w(raw, 4, 4, 1, 2);
    std::vector<std::uint8_t> img(32);
    for (std::size_t k = 0; k < img.size(); ++k) img[k] = static_cast<std::uint8_t>(k * 7);
    const std::int32_t labels[2] = {0, 1};
    w.append(io::Split::train, img.data(), labels, 2);
    w.finish();
  }
  io::DatasetFile rf(raw);
  EXPECT_THROW(io::BatchLoader(rf, io::Split::train, 1, {0}, {}, std::nullopt, lo), Error);
  fs::remove_all(dir);
}

// CUDA spreads a process's streams over CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default); the library sets
// 32 before main() so the JPEG decoders do not queue behind the step (runtime_api.h), unless the environment chose.
// Runs without a GPU: it checks the variable the CUDA context will read, not the driver.
TEST(HardwareQueues, ThirtyTwoBeforeMainUnlessTheEnvironmentChose) {
#ifdef RENAISSANCE_HAVE_CUDA
  bool user = true;
  const int n = cuda::hardware_queues(&user);
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  ASSERT_NE(v, nullptr) << "not set before main()";
  if (user) {  // the user's value is kept; a lower one is warned about, naming it
    EXPECT_EQ(n, std::atoi(v) > 0 ? std::atoi(v) : 8);
    const std::string w = runtime::hardware_queue_warning();
    if (n < cuda::kHardwareQueues)
      EXPECT_NE(w.find(fmt::format("CUDA_DEVICE_MAX_CONNECTIONS={}", n)), std::string::npos) << w;
    else
      EXPECT_EQ(w, "");
    return;
  }
  EXPECT_STREQ(v, "32");
  EXPECT_EQ(n, cuda::kHardwareQueues);
  EXPECT_EQ(runtime::hardware_queue_warning(), "") << "no warning for the library's own setting";
#else
  GTEST_SKIP() << "a build without CUDA sets nothing";
#endif
}

}  // namespace
