// Real Fashion-MNIST: import it and compare with a direct parse of the idx files (written here, independent of
// the library's idx reader).
#include "io_test_util.h"

#include <renaissance/io/batch_loader.h>
#include <renaissance/io/importers.h>

#include <chrono>
#include <cstdio>
#include <numeric>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;

/// The whole decompressed file.
std::vector<std::uint8_t> gunzip(const std::string& path) {
  std::vector<std::uint8_t> out;
  gzFile g = gzopen(path.c_str(), "rb");
  if (!g) return out;
  std::uint8_t buf[1 << 16];
  int r;
  while ((r = gzread(g, buf, sizeof(buf))) > 0) out.insert(out.end(), buf, buf + r);
  gzclose(g);
  return out;
}

std::uint32_t be32(const std::vector<std::uint8_t>& b, size_t at) {
  return (std::uint32_t(b[at]) << 24) | (std::uint32_t(b[at + 1]) << 16) | (std::uint32_t(b[at + 2]) << 8) | b[at + 3];
}

class FashionMnist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz")) return;
    s_dir = std::make_unique<TempDir>();
    s_path = s_dir->file("fashion-mnist.h5");
    import_fashion_mnist(s_path);
  }
  static void TearDownTestSuite() { s_dir.reset(); }
  void SetUp() override {
    if (!s_dir) GTEST_SKIP() << "Fashion-MNIST not found in " << kFashionMnistDir;
  }
  static std::unique_ptr<TempDir> s_dir;
  static std::string s_path;
};
std::unique_ptr<TempDir> FashionMnist::s_dir;
std::string FashionMnist::s_path;

TEST_F(FashionMnist, MatchesTheIdxFilesExactly) {
  const DatasetFile f(s_path);
  EXPECT_EQ(f.num_classes(), 10);
  EXPECT_EQ(f.class_names(), fashion_mnist_class_names());
  EXPECT_EQ(f.class_names().front(), "T-shirt/top");
  EXPECT_EQ(f.class_names().back(), "Ankle boot");
  const struct {
    Split split;
    const char* prefix;
    std::int64_t n;
    std::vector<std::int32_t> first_labels;
  } cases[] = {{Split::train, "train", 60000, {9, 0, 0, 3, 0}}, {Split::val, "t10k", 10000, {9, 2, 1, 1, 6}}};
  for (const auto& c : cases) {
    const auto img_raw = gunzip(fmt::format("{}/{}-images-idx3-ubyte.gz", kFashionMnistDir, c.prefix));
    const auto lab_raw = gunzip(fmt::format("{}/{}-labels-idx1-ubyte.gz", kFashionMnistDir, c.prefix));
    ASSERT_EQ(be32(img_raw, 0), 2051u);
    ASSERT_EQ(be32(lab_raw, 0), 2049u);
    ASSERT_EQ(be32(img_raw, 4), static_cast<std::uint32_t>(c.n));
    ASSERT_EQ(img_raw.size(), 16u + c.n * 784u);
    ASSERT_EQ(lab_raw.size(), 8u + c.n);

    const SplitInfo& info = f.info(c.split);
    ASSERT_EQ(info.count, c.n);
    EXPECT_EQ(info.height, 28);
    EXPECT_EQ(info.width, 28);
    EXPECT_EQ(info.channels, 1);
    EXPECT_TRUE(info.fletcher32);
    std::vector<std::uint8_t> img(static_cast<size_t>(c.n * 784));
    std::vector<std::int32_t> lab(static_cast<size_t>(c.n));
    f.read(c.split, 0, c.n, img.data(), lab.data());
    EXPECT_TRUE(std::equal(img.begin(), img.end(), img_raw.begin() + 16)) << c.prefix << " images differ";
    for (std::int64_t i = 0; i < c.n; ++i) ASSERT_EQ(lab[i], lab_raw[8 + i]) << c.prefix << " label " << i;
    EXPECT_EQ(std::vector<std::int32_t>(lab.begin(), lab.begin() + 5), c.first_labels);
    EXPECT_EQ(f.label_histogram(c.split), std::vector<std::int64_t>(10, c.n / 10));
  }
  // The published statistics of Fashion-MNIST's training set.
  EXPECT_NEAR(f.mean()[0], 0.2860, 1e-4);
  EXPECT_NEAR(f.stddev()[0], 0.3530, 1e-4);
}

TEST_F(FashionMnist, ShuffledEpochThroughTheLoader) {
  const DatasetFile f(s_path);
  const auto img_raw = gunzip(fmt::format("{}/t10k-images-idx3-ubyte.gz", kFashionMnistDir));
  std::vector<std::int64_t> order(10000);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(2024));
  // Two epochs: the first inflates every chunk once, the second is served from the chunk cache.
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    BatchLoader loader(f, Split::val, 256, order);
    std::int64_t n = 0;
    while (auto b = loader.next()) {
      for (std::int64_t k = 0; k < b->count; ++k) {
        const std::int64_t i = order[static_cast<size_t>(b->first_position + k)];
        ASSERT_EQ(0, std::memcmp(b->images + k * 784, img_raw.data() + 16 + i * 784, 784)) << "sample " << i;
      }
      n += b->count;
    }
    EXPECT_EQ(n, 10000);
    EXPECT_EQ(loader.num_batches(), 40);  // 39 full batches + 16
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch %d: %.0f shuffled samples/s\n", epoch, n / s);
  }
}

}  // namespace
}  // namespace renaissance::io
