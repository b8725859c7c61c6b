// The loader threads (issue 12): JPEG stores decoded and rendered into fixed-size batches, the same bytes for any
// thread count, decode failures named by sample; the augmentation reference keeps the pad-crop/flip of before (the old
// code is kept below as the reference) and the random-resized crop's documented geometry.
#include "io_test_util.h"

#include <renaissance/core/philox.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/image.h>
#include <renaissance/runtime/data_pipeline.h>

#include <gmock/gmock.h>

#include <cstring>
#include <numeric>
#include <random>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;
using ::testing::HasSubstr;

std::vector<std::uint8_t> pixels(std::int64_t h, std::int64_t w, int c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(h * w * c));
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>((i * 7 + seed * 13 + rng() % 32) & 0xff);
  return px;
}

/// A JPEG store of n train and 3 val images of assorted sizes; `bad` (if >= 0) gets bytes that are no JPEG.
void write_store(const std::string& path, int n, int bad = -1) {
  DatasetWriter w(path, JpegStoreSpec{3, 90, 0}, 4, {});
  for (int i = 0; i < n + 3; ++i) {
    const std::int64_t h = 20 + (i * 13) % 30, wd = 18 + (i * 7) % 40;
    const auto px = pixels(h, wd, 3, static_cast<std::uint32_t>(i));
    std::vector<std::uint8_t> jpeg = encode_jpeg(px.data(), h, wd, 3, 90, "t");
    if (i == bad) std::fill(jpeg.begin() + 2, jpeg.end(), std::uint8_t(0x5a));
    w.append_encoded(i < n ? Split::train : Split::val, jpeg.data(), static_cast<std::int64_t>(jpeg.size()), h, wd,
                     i % 4, px.data());
  }
  w.finish();
}

class Render : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_jpeg_codec()) GTEST_SKIP() << "built without libturbojpeg";
  }
  TempDir dir;
};

/// Every batch of an epoch, concatenated. `region`: each JPEG decoded only where its render reads (make_region).
std::vector<std::uint8_t> epoch_bytes(const DatasetFile& f, const AugmentSpec& spec, LoaderPool* pool,
                                      const std::vector<std::int64_t>& order, std::vector<std::int32_t>* labels,
                                      bool region = false) {
  LoaderOptions o;
  o.pool = pool;
  o.out_h = spec.out_h;
  o.out_w = spec.out_w;
  o.render = runtime::make_render(spec, 5, 2, nullptr);
  if (region) o.region = runtime::make_region(spec, 5, 2, nullptr);
  BatchLoader loader(f, Split::train, 7, order, {}, std::nullopt, o);
  std::vector<std::uint8_t> all;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->height, spec.out_h);
    EXPECT_EQ(b->width, spec.out_w);
    all.insert(all.end(), b->images, b->images + b->count * spec.out_h * spec.out_w * 3);
    if (labels) labels->insert(labels->end(), b->labels, b->labels + b->count);
  }
  return all;
}

TEST_F(Render, AJpegStoreDecodedAndRenderedAsTheReferenceDoesItForAnyThreadCount) {
  const std::string path = dir.file("s.h5");
  write_store(path, 40);
  const DatasetFile f(path);
  std::vector<std::int64_t> order(40);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  AugmentSpec spec;
  spec.out_h = 16;
  spec.out_w = 12;
  spec.crop = CropMode::random_resized;
  spec.horizontal_flip = true;
  spec.crop_padding = 1;
  std::vector<std::int32_t> labels;
  const std::vector<std::uint8_t> one = epoch_bytes(f, spec, nullptr, order, &labels);
  for (int threads : {1, 3}) {
    LoaderPool pool(threads);
    EXPECT_EQ(epoch_bytes(f, spec, &pool, order, nullptr), one) << threads << " pool threads";
    // Decoding only each random-resized crop's box (partial JPEG decoding where the build has it) changes no byte.
    EXPECT_EQ(epoch_bytes(f, spec, &pool, order, nullptr, true), one) << threads << " pool threads, boxes decoded";
  }
  EXPECT_EQ(static_cast<bool>(runtime::make_region(spec, 5, 2, nullptr)), have_region_decode());
  AugmentSpec centre = spec;
  centre.crop = CropMode::center;  // reads the whole image: nothing to gain
  EXPECT_FALSE(runtime::make_region(centre, 5, 2, nullptr));
  // Sample by sample: decode the stored JPEG, take its geometry for its position, render.
  EncodedBatch enc;
  f.read_encoded(Split::train, order, enc);
  std::vector<std::uint8_t> scratch, out(16 * 12 * 3);
  for (std::size_t p = 0; p < order.size(); ++p) {
    const Image img = decode_image(enc.data(static_cast<std::int64_t>(p)), static_cast<std::size_t>(enc.size(static_cast<std::int64_t>(p))), 3, "t");
    const SampleGeometry g = sample_geometry(spec, 5, 2, static_cast<std::int64_t>(p), img.height, img.width);
    render_sample(img.pixels.data(), img.height, img.width, 3, g, spec, out.data(), scratch);
    ASSERT_EQ(0, std::memcmp(out.data(), one.data() + p * out.size(), out.size())) << "position " << p;
    EXPECT_EQ(labels[p], static_cast<std::int32_t>(order[p] % 4));
  }
}

TEST_F(Render, AnUndecodableJpegIsNamedBySample) {
  const std::string path = dir.file("bad.h5");
  write_store(path, 10, /*bad=*/6);
  const DatasetFile f(path);
  LoaderPool pool(2);
  LoaderOptions o;
  o.pool = &pool;
  o.out_h = o.out_w = 8;
  AugmentSpec spec;
  spec.out_h = spec.out_w = 8;
  spec.crop = CropMode::center;
  o.render = runtime::make_render(spec, 0, 0, nullptr);
  BatchLoader loader(f, Split::train, 4, {0, 1, 2, 3, 4, 5, 6, 7}, {}, std::nullopt, o);
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_THAT(error_of([&] { loader.next(); }), HasSubstr("/train/jpeg sample 6"));
}

TEST_F(Render, AJpegStoreNeedsARenderAndASize) {
  const std::string path = dir.file("s.h5");
  write_store(path, 4);
  const DatasetFile f(path);
  EXPECT_THAT(error_of([&] { BatchLoader(f, Split::train, 2, {0, 1}); }), HasSubstr("needs a render"));
}

TEST(RenderRaw, RawStoresRenderedThroughThePool) {
  TempDir dir;
  SmallSpec s;
  s.n_train = 30;
  s.h = 9;
  s.w = 11;
  const std::string path = dir.file("raw.h5");
  write_small(path, s);
  const DatasetFile f(path);
  AugmentSpec spec;
  spec.out_h = 6;
  spec.out_w = 5;
  spec.crop = CropMode::center;
  LoaderPool pool(2);
  LoaderOptions o{&pool, 6, 5, runtime::make_render(spec, 0, 0, nullptr)};
  std::vector<std::int64_t> order(30);
  std::iota(order.begin(), order.end(), 0);
  BatchLoader loader(f, Split::train, 8, order, {}, std::nullopt, o);
  std::vector<std::uint8_t> stored(static_cast<std::size_t>(9 * 11 * 3)), want(6 * 5 * 3), scratch;
  while (auto b = loader.next())
    for (std::int64_t k = 0; k < b->count; ++k) {
      f.read(Split::train, b->first_position + k, 1, stored.data(), nullptr);
      const SampleGeometry g = sample_geometry(spec, 0, 0, 0, 9, 11);
      render_sample(stored.data(), 9, 11, 3, g, spec, want.data(), scratch);
      ASSERT_EQ(0, std::memcmp(want.data(), b->images + k * 90, 90));
    }
}

// ---- the augmentation of before, kept as the reference ----------------------------------------------------------------

/// runtime::augment_image as it was before issue 12 (pad-crop and flip, one Philox block), verbatim.
void old_augment(std::uint8_t* image, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t pad, bool hflip,
                 std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::vector<std::uint8_t>& scratch) {
  if (!(pad > 0 || hflip)) return;
  const Philox::Block r = Philox::generate(
      seed, {static_cast<std::uint32_t>(sample), static_cast<std::uint32_t>(sample >> 32),
             static_cast<std::uint32_t>(epoch), 0x41554721});
  const std::int64_t p = pad;
  const std::int64_t dy = p > 0 ? static_cast<std::int64_t>(r[0] % static_cast<std::uint32_t>(2 * p + 1)) - p : 0;
  const std::int64_t dx = p > 0 ? static_cast<std::int64_t>(r[1] % static_cast<std::uint32_t>(2 * p + 1)) - p : 0;
  const bool flip = hflip && (r[2] & 1u);
  if (dy == 0 && dx == 0 && !flip) return;
  const std::size_t bytes = static_cast<std::size_t>(h * w * c);
  scratch.assign(image, image + bytes);
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x) {
      const std::int64_t sx = (flip ? w - 1 - x : x) + dx, sy = y + dy;
      std::uint8_t* dst = image + (y * w + x) * c;
      if (sy < 0 || sy >= h || sx < 0 || sx >= w)
        std::memset(dst, 0, static_cast<std::size_t>(c));
      else
        std::memcpy(dst, scratch.data() + (sy * w + sx) * c, static_cast<std::size_t>(c));
    }
}

TEST(AugmentCompat, PadCropAndFlipAreTheBitsOfBefore) {
  std::vector<std::uint8_t> s1, s2;
  for (const auto& [h, w, c, pad, flip] : std::vector<std::tuple<int, int, int, int, bool>>{
           {28, 28, 1, 2, true}, {32, 32, 3, 4, true}, {7, 9, 3, 0, true}, {5, 6, 1, 3, false}}) {
    for (std::int64_t sample : {0LL, 1LL, 17LL, 4096LL, (1LL << 33) + 5}) {
      const auto src = pixels(h, w, c, static_cast<std::uint32_t>(sample));
      std::vector<std::uint8_t> a = src, b = src;
      old_augment(a.data(), h, w, c, pad, flip, 99, 3, sample, s1);
      runtime::Augmentation aug;
      aug.crop_padding = pad;
      aug.horizontal_flip = flip;
      runtime::augment_image(b.data(), h, w, c, aug, 99, 3, sample, s2);
      ASSERT_EQ(a, b) << h << "x" << w << "x" << c << " pad " << pad << " sample " << sample;
      // And through the loader's render (what training uses now).
      std::vector<std::uint8_t> out(src.size());
      runtime::make_render(runtime::train_spec(aug, h, w), 99, 3, nullptr)(
          SampleSource{src.data(), h, w, c}, sample, out.data());
      ASSERT_EQ(out, a);
    }
  }
}

TEST(AugmentGeometry, RandomResizedCropFallsBackToTheCentreCropOfTorchvision) {
  AugmentSpec s;
  s.out_h = s.out_w = 8;
  s.crop = CropMode::random_resized;
  s.scale_min = 1.5;  // never fits: every attempt fails
  s.scale_max = 2.0;
  // Wider than 4/3: h = 10, w = rint(10 * 4/3) = 13, centred.
  SampleGeometry g = sample_geometry(s, 1, 0, 0, 10, 100);
  EXPECT_EQ(g.box_h, 10);
  EXPECT_EQ(g.box_w, 13);
  EXPECT_EQ(g.box_x, (100 - 13) / 2);
  EXPECT_EQ(g.box_y, 0);
  // Narrower than 3/4: w = 10, h = rint(10 / 0.75) = 13.
  g = sample_geometry(s, 1, 0, 0, 100, 10);
  EXPECT_EQ(g.box_w, 10);
  EXPECT_EQ(g.box_h, 13);
  EXPECT_EQ(g.box_y, 43);
  // Within the range: the whole image.
  g = sample_geometry(s, 1, 0, 0, 30, 35);
  EXPECT_EQ(g.box_h, 30);
  EXPECT_EQ(g.box_w, 35);
  EXPECT_EQ(g.virt_h, 8);
}

// Found by a hostile-input hunt: a 60000x1 image at --val-resize 65535 is 3.9e9 pixels wide; the int32 geometry
// wrapped, and the error said "resize to -362867296x65535" without the sample.
TEST(AugmentGeometry, AResizePast2To31PixelsIsAnErrorNamingTheSample) {
  AugmentSpec s;
  s.out_h = s.out_w = 28;
  s.crop = CropMode::center;
  s.resize_short = 65535;
  std::string msg;
  try {
    (void)sample_geometry(s, 1, 0, 17, 1, 60000);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("sample 17: a 60000x1 image resized to a short side of 65535 would be 3932100000x65535"),
            std::string::npos)
      << msg;
  s.resize_short = 256;  // 15,360,000 wide: fits
  EXPECT_EQ(sample_geometry(s, 1, 0, 17, 1, 60000).virt_w, 15360000);
}

TEST(AugmentGeometry, BoxesLieInsideAndDependOnlyOnTheKey) {
  AugmentSpec s;
  s.out_h = s.out_w = 32;
  s.crop = CropMode::random_resized;
  s.horizontal_flip = true;
  int flips = 0;
  for (std::int64_t i = 0; i < 5000; ++i) {
    const SampleGeometry g = sample_geometry(s, 7, 1, i, 375, 500);
    ASSERT_GE(g.box_y, 0);
    ASSERT_GE(g.box_x, 0);
    ASSERT_LE(g.box_y + g.box_h, 375);
    ASSERT_LE(g.box_x + g.box_w, 500);
    const double area = double(g.box_h) * g.box_w / (375.0 * 500.0), ratio = double(g.box_w) / g.box_h;
    ASSERT_GE(area, 0.07);
    ASSERT_GE(ratio, 0.74);
    ASSERT_LE(ratio, 1.35);
    flips += g.flip;
    ASSERT_TRUE(g == sample_geometry(s, 7, 1, i, 375, 500));
  }
  EXPECT_NEAR(flips, 2500, 200);
  EXPECT_FALSE(sample_geometry(s, 7, 1, 0, 375, 500) == sample_geometry(s, 7, 2, 0, 375, 500));
  EXPECT_FALSE(sample_geometry(s, 7, 1, 0, 375, 500) == sample_geometry(s, 8, 1, 0, 375, 500));
}

}  // namespace
}  // namespace renaissance::io
