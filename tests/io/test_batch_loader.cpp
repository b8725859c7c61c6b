// BatchLoader: every sample exactly once in the caller's order, partial last batch, errors from the thread.
#include "io_test_util.h"

#include <renaissance/io/batch_loader.h>

#include <gmock/gmock.h>

#include <atomic>
#include <chrono>
#include <numeric>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;
using ::testing::HasSubstr;

class Loader : public ::testing::Test {
 protected:
  void SetUp() override {
    spec.n_train = 103;
    path = dir.file("data.h5");
    write_small(path, spec);
    file = std::make_unique<DatasetFile>(path);
    order.resize(static_cast<size_t>(spec.n_train));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(7);
    std::shuffle(order.begin(), order.end(), rng);
  }
  void expect_batch(const Batch& b, const std::vector<std::int64_t>& ord, std::int64_t bs) {
    const std::int64_t sb = file->sample_bytes();
    for (std::int64_t k = 0; k < b.count; ++k) {
      const std::int64_t i = ord[static_cast<size_t>(b.first_position + k)];
      ASSERT_EQ(b.labels[k], label_of(Split::train, i, spec.classes));
      for (std::int64_t p = 0; p < sb; ++p) ASSERT_EQ(b.images[k * sb + p], pixel_of(Split::train, i, p));
    }
    EXPECT_EQ(b.first_position, b.index * bs);
  }
  TempDir dir;
  SmallSpec spec;
  std::string path;
  std::unique_ptr<DatasetFile> file;
  std::vector<std::int64_t> order;
};

TEST_F(Loader, EverySampleOnceInOrderWithPartialLastBatch) {
  BatchLoader loader(*file, Split::train, 10, order);
  EXPECT_EQ(loader.num_batches(), 11);
  std::vector<std::int64_t> seen;
  std::int64_t expected_index = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->index, expected_index++);
    EXPECT_EQ(b->count, b->index == 10 ? 3 : 10);
    expect_batch(*b, order, 10);
    for (std::int64_t k = 0; k < b->count; ++k) seen.push_back(order[static_cast<size_t>(b->first_position + k)]);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the loader run ahead into the other buffer
  }
  EXPECT_EQ(seen, order);
  EXPECT_FALSE(loader.next().has_value());  // stays finished
}

TEST_F(Loader, BatchLargerThanSplitAndEmptyOrder) {
  {
    BatchLoader loader(*file, Split::train, 500, order);
    auto b = loader.next();
    ASSERT_TRUE(b);
    EXPECT_EQ(b->count, 103);
    expect_batch(*b, order, 500);
    EXPECT_FALSE(loader.next());
  }
  BatchLoader empty(*file, Split::train, 8, {});
  EXPECT_EQ(empty.num_batches(), 0);
  EXPECT_FALSE(empty.next());
}

TEST_F(Loader, TransformRunsWithPositionsAndItsChangesArrive) {
  std::vector<std::int64_t> positions;
  std::mutex mu;
  BatchTransform t = [&](std::uint8_t* images, std::int32_t* labels, std::int64_t count, std::int64_t first) {
    std::lock_guard<std::mutex> lock(mu);
    positions.push_back(first);
    for (std::int64_t k = 0; k < count; ++k) labels[k] += 1000;
    images[0] = 0xAB;
  };
  BatchLoader loader(*file, Split::train, 16, order, t);
  while (auto b = loader.next()) {
    EXPECT_EQ(b->images[0], 0xAB);
    for (std::int64_t k = 0; k < b->count; ++k)
      EXPECT_EQ(b->labels[k],
                1000 + label_of(Split::train, order[static_cast<size_t>(b->first_position + k)], spec.classes));
  }
  EXPECT_EQ(positions, (std::vector<std::int64_t>{0, 16, 32, 48, 64, 80, 96}));
}

TEST_F(Loader, ErrorInThreadReachesNextAtTheRightBatch) {
  BatchTransform t = [](std::uint8_t*, std::int32_t*, std::int64_t, std::int64_t first) {
    if (first == 30) RN_FAIL("augmentation failed at position {}", first);
  };
  BatchLoader loader(*file, Split::train, 10, order, t);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(loader.next());
  EXPECT_THAT(error_of([&] { loader.next(); }), HasSubstr("augmentation failed at position 30"));
  EXPECT_THAT(error_of([&] { loader.next(); }), HasSubstr("position 30"));  // sticky
}

TEST_F(Loader, CorruptChunkErrorNamesFileAndDataset) {
  corrupt_chunk(path, "/train/images", 2);  // samples [14, 21)
  file = std::make_unique<DatasetFile>(path);
  std::vector<std::int64_t> seq(static_cast<size_t>(spec.n_train));
  std::iota(seq.begin(), seq.end(), 0);
  ::testing::internal::CaptureStderr();
  BatchLoader loader(*file, Split::train, 10, seq);
  ASSERT_TRUE(loader.next());  // [0, 10)
  const std::string msg = error_of([&] { loader.next(); });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "HDF5 printed from the loader thread";
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("/train/images"));
  EXPECT_THAT(msg, ::testing::ContainsRegex("[Cc]hecksum|Fletcher32"));
}

TEST_F(Loader, DestructionMidEpochJoins) {
  for (int consumed = 0; consumed < 3; ++consumed) {
    BatchLoader loader(*file, Split::train, 4, order);
    for (int k = 0; k < consumed; ++k) ASSERT_TRUE(loader.next());
  }  // destructor must stop a thread blocked on a full A/B pair
  SUCCEED();
}

TEST_F(Loader, CallerBuffers) {
  const std::int64_t bs = 32, sb = file->sample_bytes();
  std::vector<std::uint8_t> a(bs * sb), b(bs * sb);
  std::vector<std::int32_t> la(bs), lb(bs);
  BatchBuffers buffers;
  buffers.images[0] = a.data();
  buffers.images[1] = b.data();
  buffers.labels[0] = la.data();
  buffers.labels[1] = lb.data();
  BatchLoader loader(*file, Split::train, bs, order, {}, buffers);
  std::int64_t total = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->images, batch->index % 2 ? b.data() : a.data());
    expect_batch(*batch, order, bs);
    total += batch->count;
  }
  EXPECT_EQ(total, 103);
}

TEST_F(Loader, RejectsBadArguments) {
  EXPECT_THAT(error_of([&] { BatchLoader(*file, Split::train, 0, order); }), HasSubstr("batch size"));
  EXPECT_THAT(error_of([&] { BatchLoader(*file, Split::val, 4, {0, 1, 13}); }), HasSubstr("order[2] = 13"));
}

}  // namespace
}  // namespace renaissance::io
