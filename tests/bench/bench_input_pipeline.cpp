// The CPU input pipeline (issue 12) in images/s: JPEG decoding of ImageNet-like 500x375 quality-90 images, the
// random-resized crop to 224 (Pillow's bilinear), normalisation to FP16 with 8 channels, and whole loader epochs from
// a JPEG store with 1..N loader threads.
//   build/tests/bench/bench_input_pipeline --benchmark_min_time=1
// Results and the machine they came from: docs/input-pipeline.md.
#include <renaissance/io/augment.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/image.h>
#include <renaissance/runtime/data_pipeline.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace renaissance;

/// A photograph-like 500x375 image: smooth colour fields, a wave and noise (JPEGs of ~100 KB at quality 90, like
/// scripts/make_image_folder.py's).
std::vector<std::uint8_t> photo(int h, int w, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 22.0f);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(h * w * 3));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const float v = 120.0f + 40.0f * c + 50.0f * std::sin(0.05f * (x + 2 * y) + c + seed) + noise(rng);
        px[static_cast<std::size_t>((y * w + x) * 3 + c)] = static_cast<std::uint8_t>(std::clamp(v, 0.0f, 255.0f));
      }
  return px;
}

const std::vector<std::uint8_t>& jpeg_500x375() {
  static const std::vector<std::uint8_t> j = [] {
    const auto px = photo(375, 500, 1);
    return io::encode_jpeg(px.data(), 375, 500, 3, 90, "bench");
  }();
  return j;
}

/// The ImageNet training transform: random-resized crop to 224 and a flip.
io::AugmentSpec rrc224() {
  io::AugmentSpec spec;
  spec.out_h = spec.out_w = 224;
  spec.crop = io::CropMode::random_resized;
  spec.horizontal_flip = true;
  return spec;
}

void BM_DecodeJpeg500x375(benchmark::State& state) {
  const auto& j = jpeg_500x375();
  for (auto _ : state) {
    io::Image img = io::decode_image(j.data(), j.size(), 3, "bench");
    benchmark::DoNotOptimize(img.pixels.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["jpeg_KiB"] = static_cast<double>(j.size()) / 1024.0;
}
BENCHMARK(BM_DecodeJpeg500x375)->Unit(benchmark::kMillisecond);

void BM_RandomResizedCrop224(benchmark::State& state) {
  const auto& j = jpeg_500x375();
  const io::Image img = io::decode_image(j.data(), j.size(), 3, "bench");
  const io::AugmentSpec spec = rrc224();
  std::vector<std::uint8_t> out(224 * 224 * 3), scratch;
  std::int64_t sample = 0;
  for (auto _ : state) {
    const io::SampleGeometry g = io::sample_geometry(spec, 0, 0, sample++, img.height, img.width);
    io::render_sample(img.pixels.data(), img.height, img.width, 3, g, spec, out.data(), scratch);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RandomResizedCrop224)->Unit(benchmark::kMillisecond);

/// Decode + random-resized crop to 224 + flip of one 500x375 JPEG, sample keys cycling (boxes of 8-100 % of the
/// image): arg 0 the whole image decoded (decode_image), arg 1 only the crop's box (decode_image_region, the loader's
/// path for random-resized crops; the same output bytes).
void BM_DecodeAndRrc224(benchmark::State& state) {
  const auto& j = jpeg_500x375();
  const bool region = state.range(0) != 0;
  const io::AugmentSpec spec = rrc224();
  std::vector<std::uint8_t> out(224 * 224 * 3), scratch;
  std::int64_t sample = 0;
  for (auto _ : state) {
    io::SampleGeometry g = io::sample_geometry(spec, 0, 0, sample++ % 4096, 375, 500);
    io::ImageRegion r;
    if (region) {
      r = io::decode_image_region(j.data(), j.size(), 3, "bench", g.box_y, g.box_x, g.box_h, g.box_w);
      g.box_y -= static_cast<std::int32_t>(r.row0);
      g.box_x -= static_cast<std::int32_t>(r.col0);
    } else {
      r.image = io::decode_image(j.data(), j.size(), 3, "bench");
    }
    io::render_sample(r.image.pixels.data(), r.image.height, r.image.width, 3, g, spec, out.data(), scratch);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(region ? (io::have_region_decode() ? "box decoded" : "box: whole (no partial decoding)")
                        : "whole image decoded");
}
BENCHMARK(BM_DecodeAndRrc224)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_SampleGeometryRrc(benchmark::State& state) {
  const io::AugmentSpec spec = rrc224();
  std::int64_t sample = 0;
  for (auto _ : state) benchmark::DoNotOptimize(io::sample_geometry(spec, 3, 1, sample++, 375, 500));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SampleGeometryRrc);

void BM_NormalizeFp16x8(benchmark::State& state) {
  const auto px = photo(224, 224, 2);
  std::vector<std::byte> out(224 * 224 * 8 * 2);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
  for (auto _ : state) {
    runtime::normalize_images(px.data(), 1, 224, 224, 3, mean, sd, out.data(), DType::F16, 8);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_NormalizeFp16x8)->Unit(benchmark::kMillisecond);

/// A JPEG store of 256 ImageNet-like images in the temp directory, written once.
const std::string& store() {
  static const std::string path = [] {
    const std::string p = (std::filesystem::temp_directory_path() / "rn_bench_input_pipeline.h5").string();
    io::DatasetWriter w(p, io::JpegStoreSpec{3, 90, 0}, 10, {});
    for (int i = 0; i < 256 + 8; ++i) {
      const int h = i % 5 == 0 ? 500 : 375, wd = i % 5 == 0 ? 375 : 500;
      const auto px = photo(h, wd, static_cast<unsigned>(i));
      const auto j = io::encode_jpeg(px.data(), h, wd, 3, 90, "bench");
      w.append_encoded(i < 256 ? io::Split::train : io::Split::val, j.data(), static_cast<std::int64_t>(j.size()), h,
                       wd, i % 10, px.data());
    }
    w.finish();
    return p;
  }();
  return path;
}

/// One epoch of the JPEG store (256 images, batch 64): read, decode, random-resized crop to 224, flip. Args: loader
/// threads; 1 = each crop's box decoded (the trainer's path), 0 = whole images.
void BM_LoaderEpochJpegStore(benchmark::State& state) {
  const io::DatasetFile f(store());
  const int threads = static_cast<int>(state.range(0));
  const bool region = state.range(1) != 0;
  io::LoaderPool pool(threads - 1);  // the loader's own thread is one of them
  const io::AugmentSpec spec = rrc224();
  std::vector<std::int64_t> order(256);
  std::iota(order.begin(), order.end(), 0);
  std::int64_t epoch = 0;
  for (auto _ : state) {
    io::LoaderOptions o{&pool, 224, 224, runtime::make_render(spec, 0, epoch, nullptr)};
    if (region) o.region = runtime::make_region(spec, 0, epoch, nullptr);
    ++epoch;
    io::BatchLoader loader(f, io::Split::train, 64, order, {}, std::nullopt, o);
    while (auto b = loader.next()) benchmark::DoNotOptimize(b->images);
  }
  state.SetItemsProcessed(state.iterations() * 256);
}
BENCHMARK(BM_LoaderEpochJpegStore)
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

/// A shuffled batch of 256 read from the JPEG store (the loader's read for --decode gpu), cold in the store's block
/// cache (a new DatasetFile each iteration, opened outside the timing; the file itself is in the page cache): past
/// HDF5 at the chunks' addresses (arg 1, the default) or through HDF5 (arg 0, RENAISSANCE_JPEG_DIRECT_READ=0).
/// RN_BENCH_JPEG_STORE=PATH reads a batch from that store instead (e.g. a large one: the cost of finding a chunk
/// must not grow with the store).
void BM_ReadEncodedShuffled(benchmark::State& state) {
  const char* env = std::getenv("RN_BENCH_JPEG_STORE");
  const std::string p = env ? std::string(env) : store();
  if (state.range(0) == 0) ::setenv("RENAISSANCE_JPEG_DIRECT_READ", "0", 1);
  const std::int64_t n = io::DatasetFile(p).size(io::Split::train);
  std::mt19937_64 rng(7);
  io::EncodedBatch b;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<std::int64_t> idx(256);
    for (auto& i : idx) i = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
    auto f = std::make_unique<io::DatasetFile>(p);
    state.ResumeTiming();
    f->read_encoded(io::Split::train, idx, b);
    benchmark::DoNotOptimize(b.bytes.data());
    state.PauseTiming();
    f.reset();
    state.ResumeTiming();
  }
  ::unsetenv("RENAISSANCE_JPEG_DIRECT_READ");
  state.SetItemsProcessed(state.iterations() * 256);
  state.counters["MiB"] = static_cast<double>(b.bytes.size()) / (1 << 20);
}
BENCHMARK(BM_ReadEncodedShuffled)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
