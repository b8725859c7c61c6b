// JPEG stores decoded on the GPU (issue 12, runtime/gpu_jpeg.h, kernels/cuda/jpeg_decode.h). The reference decoder
// is Pillow (libjpeg-turbo, accurate integer IDCT, fancy upsampling): tests/gpu_runtime/make_jpeg_cases.py writes
// the JPEGs and Pillow's decodes, so these tests need no libturbojpeg (the GPU machine has none); without python3 +
// Pillow, nvJPEG or a GPU they skip, saying which.
//
// Tolerances (docs/input-pipeline.md): nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's, so decoded
// pixels may differ by a few levels: mean |diff| <= 2 levels and the 99th percentile <= 24 levels per image (hard
// colour edges in 4:2:0 chroma differ most; the maximum is printed, not bounded). A wrong decode (channels swapped,
// a wrong pitch, another image) is off by tens of levels on average. First guesses: tighten them with the figures
// the tests print on the GPU. Given the same decoded pixels the GPU render equals the CPU's
// io::render_sample + normalize_images bit for bit (checked here on the decoded batch itself).
#include "gpu_models.h"

#include <renaissance/core/error.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/image.h>
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/gpu_input.h>
#include <renaissance/runtime/gpu_jpeg.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>
#include <kernels/cuda/runtime_api.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using namespace renaissance;
namespace fs = std::filesystem;

fs::path work_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("rn_gpu_jpeg_{}_{}", ::getpid(), name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Case {
  std::string name, kind;
  std::int64_t h = 0, w = 0, c = 0;
  std::vector<std::uint8_t> jpeg, ref;  // the file, Pillow's decode
};

/// Runs make_jpeg_cases.py with the first python3 that has Pillow; empty when there is none.
std::vector<Case> make_cases(const fs::path& dir) {
  const std::string script = std::string(RENAISSANCE_SOURCE_DIR) + "/tests/gpu_runtime/make_jpeg_cases.py";
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string probe = fmt::format("{} -c 'import PIL' >/dev/null 2>&1", py);
    if (std::system(probe.c_str()) != 0) continue;
    if (std::system(fmt::format("{} {} {}", py, script, dir.string()).c_str()) != 0) return {};
    std::vector<Case> out;
    std::ifstream m(dir / "manifest.txt");
    Case k;
    while (m >> k.name >> k.h >> k.w >> k.c >> k.kind) {
      k.jpeg = slurp(dir / (k.name + ".jpg"));
      k.ref = slurp(dir / (k.name + ".raw"));
      out.push_back(k);
    }
    return out;
  }
  return {};
}

class GpuJpeg : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests run on the GPU machine";
    if (!runtime::nvjpeg_in_build()) GTEST_SKIP() << "this build has no nvJPEG (RENAISSANCE_NVJPEG)";
    dir = work_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    cases = make_cases(dir);
    if (cases.empty()) GTEST_SKIP() << "no python3 with Pillow: the reference decoder of these tests";
  }
  void TearDown() override {
    if (!dir.empty()) fs::remove_all(dir);
  }
  /// The RGB images nvJPEG decodes (baseline and progressive), the cases most tests run.
  std::vector<const Case*> rgb_cases() const {
    std::vector<const Case*> out;
    for (const Case& k : cases)
      if (k.c == 3 && (k.kind == "ok" || k.kind == "progressive")) out.push_back(&k);
    return out;
  }
  const Case& get(const std::string& name) const {
    for (const Case& k : cases)
      if (k.name == name) return k;
    throw std::runtime_error("no case " + name);
  }
  fs::path dir;
  std::vector<Case> cases;
};

/// A batch of the given cases, as DatasetFile::read_encoded delivers it.
io::EncodedBatch batch_of(const std::vector<const Case*>& ks) {
  io::EncodedBatch b;
  b.offsets.push_back(0);
  for (const Case* k : ks) {
    b.bytes.insert(b.bytes.end(), k->jpeg.begin(), k->jpeg.end());
    b.offsets.push_back(static_cast<std::int64_t>(b.bytes.size()));
    b.heights.push_back(static_cast<std::int32_t>(k->h));
    b.widths.push_back(static_cast<std::int32_t>(k->w));
    b.labels.push_back(static_cast<std::int32_t>(b.labels.size()));
  }
  return b;
}

struct Diff {
  double mean = 0;
  int p99 = 0, max = 0;
};
Diff diff(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  std::vector<int> hist(256, 0);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int d = std::abs(int(a[i]) - int(b[i]));
    ++hist[static_cast<std::size_t>(d)];
    sum += d;
  }
  Diff r;
  r.mean = sum / static_cast<double>(std::max<std::size_t>(n, 1));
  std::size_t seen = 0;
  bool found = false;
  for (int d = 0; d < 256; ++d) {
    seen += static_cast<std::size_t>(hist[static_cast<std::size_t>(d)]);
    if (hist[static_cast<std::size_t>(d)]) r.max = d;
    if (!found && static_cast<double>(seen) >= 0.99 * static_cast<double>(n)) {
      r.p99 = d;
      found = true;
    }
  }
  return r;
}

void expect_close_to_pillow(const Case& k, const std::uint8_t* got) {
  const Diff d = diff(got, k.ref.data(), k.ref.size());
  // Below 64 pixels a side the 4:2:0 chroma edges are much of the image (45x33 on the H200: mean 4.6, 99% 48 with
  // both nvJPEG backends, against 0.0-0.8 and <= 9 for the larger images).
  const bool small = k.h < 64 || k.w < 64;
  EXPECT_LE(d.mean, small ? 6.0 : 2.0) << k.name;
  EXPECT_LE(d.p99, small ? 64 : 24) << k.name;
  std::printf("[ decode ] %-22s %4lldx%-4lld x%lld: mean |nvJPEG - Pillow| %.3f levels, 99%% <= %d, max %d\n",
              k.name.c_str(), static_cast<long long>(k.w), static_cast<long long>(k.h), static_cast<long long>(k.c),
              d.mean, d.p99, d.max);
}

std::vector<std::uint8_t> download_decoded(const runtime::GpuJpegInput& in, std::size_t i, std::int64_t bytes) {
  std::vector<std::uint8_t> got(static_cast<std::size_t>(bytes));
  cuda::copy_d2h(got.data(), in.decoded() + in.offsets()[i], bytes);
  return got;
}

// nvJPEG's batched decode of baseline 4:2:0, 4:4:4, 4:2:2, odd sizes and a progressive JPEG (which the hardware
// engines refuse: the default backend takes it) against Pillow's decode, within the tolerance above.
TEST_F(GpuJpeg, BatchedDecodeMatchesPillow) {
  const std::vector<const Case*> rgb = rgb_cases();
  ASSERT_GE(rgb.size(), 5u);
  runtime::GpuJpegInput in(3, "cases");
  std::printf("[ decode ] nvJPEG backend: %s\n", in.backend());
  void* stream = cuda::stream_create();
  for (int round = 0; round < 2; ++round) {  // the second: a state initialised by the first
    in.decode(batch_of(rgb), io::Split::train, nullptr, stream);
    cuda::stream_synchronize(stream);
    for (std::size_t i = 0; i < rgb.size(); ++i)
      expect_close_to_pillow(*rgb[i], download_decoded(in, i, rgb[i]->h * rgb[i]->w * 3).data());
  }
  EXPECT_EQ(in.cpu_fallbacks(), 0);
  EXPECT_EQ(in.hardware_images() + in.default_images(), 2 * static_cast<std::int64_t>(rgb.size()));
  if (std::string(in.backend()).rfind("hardware", 0) == 0) {
    EXPECT_GE(in.default_images(), 2) << "the progressive JPEG";
  }
  {  // the same images through the default backend alone (diagnostic figures: which backend differs from Pillow)
    runtime::GpuJpegInput soft(3, "cases", false);
    std::printf("[ decode ] nvJPEG backend: %s\n", soft.backend());
    soft.decode(batch_of(rgb), io::Split::train, nullptr, stream);
    cuda::stream_synchronize(stream);
    for (std::size_t i = 0; i < rgb.size(); ++i)
      expect_close_to_pillow(*rgb[i], download_decoded(soft, i, rgb[i]->h * rgb[i]->w * 3).data());
  }
  // Grey: a one-component JPEG decoded to its luma.
  runtime::GpuJpegInput grey(1, "cases");
  const Case& g = get("grey_q90");
  grey.decode(batch_of({&g}), io::Split::train, nullptr, stream);
  cuda::stream_synchronize(stream);
  expect_close_to_pillow(g, download_decoded(grey, 0, g.h * g.w).data());
  cuda::stream_destroy(stream);
}

// The whole GPU path on one batch: decode + random-resized / centre crop + flip + normalise (FP16, 8 channels and
// FP32) equals the CPU path applied to the pixels nvJPEG decoded, bit for bit, and the CPU path applied to Pillow's
// pixels within the decoders' tolerance.
TEST_F(GpuJpeg, DecodeAndRenderMatchTheCpuPath) {
  const std::vector<const Case*> rgb = rgb_cases();
  const io::EncodedBatch b = batch_of(rgb);
  const std::int64_t n = b.count();
  void* stream = cuda::stream_create();
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stddev[3] = {0.229f, 0.224f, 0.225f};
  for (bool hardware : {true, false}) {
    runtime::GpuJpegInput in(3, "cases", hardware);
    std::printf("[ render ] nvJPEG backend: %s\n", in.backend());
    for (io::CropMode crop : {io::CropMode::random_resized, io::CropMode::center})
      for (DType dt : {DType::F16, DType::F32}) {
        const std::int64_t out = 64, out_c = dt == DType::F16 ? 8 : 3, el = dt == DType::F16 ? 2 : 4;
        io::AugmentSpec spec;
        spec.out_h = spec.out_w = out;
        spec.crop = crop;
        spec.horizontal_flip = true;
        spec.resize_short = crop == io::CropMode::center ? 73 : 0;
        std::vector<io::SampleGeometry> geom(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i)
          geom[static_cast<std::size_t>(i)] = io::sample_geometry(
              spec, 5, 1, i + 17, b.heights[static_cast<std::size_t>(i)], b.widths[static_cast<std::size_t>(i)]);
        const std::int64_t sample = out * out * out_c * el;
        auto* d_data = static_cast<std::byte*>(cuda::device_alloc(n * sample, "test"));
        auto* d_labels = static_cast<std::byte*>(cuda::device_alloc(n * 4, "test"));
        runtime::GpuJpegInput::Dest d{d_labels, d_data, dt, out_c, out, out};
        in.decode_render(b, io::Split::train, nullptr, geom, d, mean, stddev, 0, stream);
        cuda::stream_synchronize(stream);
        std::vector<std::byte> got(static_cast<std::size_t>(n * sample));
        cuda::copy_d2h(got.data(), d_data, n * sample);
        std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
        cuda::copy_d2h(labels.data(), d_labels, n * 4);
        std::vector<std::uint8_t> scratch, rendered(static_cast<std::size_t>(out * out * 3)),
            pil_rendered(rendered.size());
        for (std::int64_t i = 0; i < n; ++i) {
          const Case& k = *rgb[static_cast<std::size_t>(i)];
          EXPECT_EQ(labels[static_cast<std::size_t>(i)], b.labels[static_cast<std::size_t>(i)])
              << "sample " << i << " " << k.name << " " << io::crop_mode_name(crop)
              << (dt == DType::F16 ? " f16" : " f32") << (hardware ? " hw" : " nohw");
          const std::vector<std::uint8_t> dec = download_decoded(in, static_cast<std::size_t>(i), k.h * k.w * 3);
          io::render_sample(dec.data(), k.h, k.w, 3, geom[static_cast<std::size_t>(i)], spec, rendered.data(), scratch);
          std::vector<std::byte> want(static_cast<std::size_t>(sample));
          runtime::normalize_images(rendered.data(), 1, out, out, 3, mean, stddev, want.data(), dt, out_c);
          std::int64_t differ = 0, first = -1;
          for (std::int64_t q = 0; q < sample; ++q)
            if (got[static_cast<std::size_t>(i * sample + q)] != want[static_cast<std::size_t>(q)]) {
              if (first < 0) first = q;
              ++differ;
            }
          const io::SampleGeometry& g = geom[static_cast<std::size_t>(i)];
          EXPECT_EQ(differ, 0) << k.name << " " << io::crop_mode_name(crop) << (dt == DType::F16 ? " f16" : " f32")
                               << (hardware ? " hw" : " nohw") << ": the GPU render of nvJPEG's pixels differs from "
                               << "io::render_sample of the same pixels in " << differ << " of " << sample
                               << " bytes, the first at pixel " << (first < 0 ? -1 : first / (out_c * el)) << " box "
                               << g.box_h << "x" << g.box_w << "@" << g.box_y << "," << g.box_x << " virt " << g.virt_h
                               << "x" << g.virt_w << " top/left " << g.top << "," << g.left << " shift " << g.shift_y
                               << "," << g.shift_x << " flip " << g.flip;
          // Against the CPU path on Pillow's pixels (what --decode cpu gives): the decoders' tolerance.
          io::render_sample(k.ref.data(), k.h, k.w, 3, geom[static_cast<std::size_t>(i)], spec, pil_rendered.data(),
                            scratch);
          const Diff dd = diff(rendered.data(), pil_rendered.data(), rendered.size());
          const bool small = k.h < 64 || k.w < 64;  // as in expect_close_to_pillow (H200: mean 3.0, 99% 28)
          EXPECT_LE(dd.mean, small ? 6.0 : 2.0) << k.name;
          EXPECT_LE(dd.p99, small ? 64 : 24) << k.name;
        }
        cuda::device_free(d_data);
        cuda::device_free(d_labels);
      }
  }
  cuda::stream_destroy(stream);
}

// A corrupt JPEG in a store: a clear error naming the store, the split and the sample (the CPU decoder, where the
// build has one, refuses it too); a CMYK JPEG: decoded on the CPU and counted where the build has libjpeg-turbo,
// else an error naming it.
TEST_F(GpuJpeg, BadImagesInAStoreAreNamedOrFallBack) {
  const Case& ok = get("rgb420_q90");
  const Case& bad = get("rgb420_corrupt");
  const Case& cmyk = get("cmyk_q90");
  runtime::GpuJpegInput in(3, "store.h5");
  void* stream = cuda::stream_create();
  const std::int64_t idx[3] = {10, 11, 12};
  try {
    in.decode(batch_of({&ok, &bad, &ok}), io::Split::train, idx, stream);
    cuda::stream_synchronize(stream);
    ADD_FAILURE() << "a corrupt JPEG decoded without an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("store.h5: /train/jpeg sample 11"), std::string::npos) << what;
  }
  if (io::have_jpeg_codec()) {
    in.decode(batch_of({&ok, &cmyk}), io::Split::val, idx, stream);
    cuda::stream_synchronize(stream);
    EXPECT_EQ(in.cpu_fallbacks(), 1);
    EXPECT_NE(in.first_fallback().find("/val/jpeg sample 11"), std::string::npos) << in.first_fallback();
    const std::vector<std::uint8_t> got = download_decoded(in, 1, cmyk.h * cmyk.w * 3);
    EXPECT_EQ(got, cmyk.ref) << "the CPU fallback decodes as Pillow does";
  } else {
    try {
      in.decode(batch_of({&ok, &cmyk}), io::Split::val, idx, stream);
      ADD_FAILURE() << "a CMYK JPEG without a CPU decoder to fall back on";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("/val/jpeg sample 11"), std::string::npos) << what;
      EXPECT_NE(what.find("libturbojpeg"), std::string::npos) << what;
    }
  }
  cuda::stream_destroy(stream);
}

/// Writes the cases `ks` (cycled, `count` samples, labels i % 4) into a JPEG store of train split only.
std::string write_store(const fs::path& dir, const std::vector<const Case*>& ks, std::int64_t count) {
  const std::string path = (dir / "cases.h5").string();
  io::DatasetWriter w(path, io::JpegStoreSpec{}, 4);
  for (std::int64_t i = 0; i < count; ++i) {
    const Case& k = *ks[static_cast<std::size_t>(i) % ks.size()];
    w.append_encoded(io::Split::train, k.jpeg.data(), static_cast<std::int64_t>(k.jpeg.size()), k.h, k.w,
                     static_cast<std::int32_t>(i % 4), k.ref.data());
  }
  w.finish();
  return path;
}

// The decode-ahead (begin/next/render_current/end, what training runs) against the synchronous decode_render of
// the same batches with 1 to 3 decoder threads, both nvJPEG backends, a partial last batch, a pass ended after two
// batches and begun again: bit for bit (the JPEG engines with several threads: within 0.25 levels, see below); a
// corrupt image is rethrown by next() for its own batch, naming the sample, after the batches before it were delivered.
TEST_F(GpuJpeg, DecodeAheadEqualsTheSynchronousPath) {
  const std::vector<const Case*> rgb = rgb_cases();
  const std::int64_t count = 23, batch = 4, out = 48, out_c = 8, sample = out * out * out_c * 2;  // 23: prime (order)
  const std::string path = write_store(dir, rgb, count);
  const io::DatasetFile file(path);
  void* stream = cuda::stream_create();
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stddev[3] = {0.229f, 0.224f, 0.225f};
  io::AugmentSpec spec;
  spec.out_h = spec.out_w = out;
  spec.crop = io::CropMode::random_resized;
  spec.horizontal_flip = true;
  auto* d_data = static_cast<std::byte*>(cuda::device_alloc(batch * sample, "test"));
  auto* d_labels = static_cast<std::byte*>(cuda::device_alloc(batch * 4, "test"));
  const runtime::GpuJpegInput::Dest d{d_labels, d_data, DType::F16, out_c, out, out};
  auto geometry = [&](const io::Batch& b) {
    std::vector<io::SampleGeometry> g(static_cast<std::size_t>(b.count));
    for (std::int64_t i = 0; i < b.count; ++i)
      g[static_cast<std::size_t>(i)] =
          io::sample_geometry(spec, 9, 2, b.first_position + i, b.encoded->heights[static_cast<std::size_t>(i)],
                              b.encoded->widths[static_cast<std::size_t>(i)]);
    return g;
  };
  auto result = [&](const io::Batch& b) {  // labels then pixels, downloaded
    cuda::stream_synchronize(stream);
    std::vector<std::byte> r(static_cast<std::size_t>(b.count * (4 + sample)));
    cuda::copy_d2h(r.data(), d_labels, b.count * 4);
    cuda::copy_d2h(r.data() + b.count * 4, d_data, b.count * sample);
    return r;
  };
  io::LoaderOptions lo;
  lo.encoded = true;
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) order[static_cast<std::size_t>(i)] = (i * 7) % count;  // shuffled
  // Each image's decoded bytes, downloaded (h x w x 3 at its offset).
  auto images = [&](const std::uint8_t* base, const std::vector<std::int64_t>& offsets, const io::Batch& b) {
    cuda::stream_synchronize(stream);
    std::vector<std::vector<std::uint8_t>> r;
    for (std::int64_t i = 0; i < b.count; ++i) {
      std::vector<std::uint8_t> px(static_cast<std::size_t>(b.encoded->heights[static_cast<std::size_t>(i)]) *
                                   static_cast<std::size_t>(b.encoded->widths[static_cast<std::size_t>(i)]) * 3);
      cuda::copy_d2h(px.data(), base + offsets[static_cast<std::size_t>(i)], static_cast<std::int64_t>(px.size()));
      r.push_back(std::move(px));
    }
    return r;
  };
  for (bool hardware : {true, false}) {
    // The reference: the synchronous path, batch by batch.
    std::vector<std::vector<std::byte>> want;
    std::vector<std::vector<std::int32_t>> want_labels;
    std::vector<std::vector<std::vector<std::uint8_t>>> want_images;
    {
      runtime::GpuJpegInput in(3, path, hardware);
      io::BatchLoader loader(file, io::Split::train, batch, order, {}, std::nullopt, lo);
      while (auto b = loader.next()) {
        in.decode_render(*b->encoded, io::Split::train, b->indices, geometry(*b), d, mean, stddev,
                         static_cast<int>(b->index % 2), stream);
        want.push_back(result(*b));
        want_labels.emplace_back(b->labels, b->labels + b->count);
        want_images.push_back(images(in.decoded(), in.offsets(), *b));
      }
    }
    ASSERT_EQ(want.size(), static_cast<std::size_t>((count + batch - 1) / batch));
    runtime::GpuJpegInput in(3, path, hardware);
    for (int decoders : {1, 2, 3}) {
      for (int pass = 0; pass < 2; ++pass) {  // pass 0 ends after two batches, pass 1 runs to the end
        io::BatchLoader loader(file, io::Split::train, batch, order, {}, std::nullopt, lo);
        in.begin(loader, io::Split::train, decoders);
        std::size_t k = 0;
        while (auto b = in.next()) {
          ASSERT_LT(k, want.size());
          const std::string what =
              fmt::format("{}, {} decoders, pass {}, batch {}", hardware ? "hw" : "no hw", decoders, pass, k);
          EXPECT_EQ(b->index, static_cast<std::int64_t>(k)) << what;
          EXPECT_EQ(std::vector<std::int32_t>(b->labels, b->labels + b->count), want_labels[k]) << what;
          in.render_current(geometry(*b), d, mean, stddev, static_cast<int>(b->index % 2), stream);
          // Bit for bit, except the JPEG engines with several decoder threads: measured on the H200, a decoder
          // thread other than the first decodes the engines' images with ~2.5 % of the bytes different (the same
          // bytes every time, not a race: serialising the decodes changes nothing), so they are held to the same
          // image: mean |diff| <= 0.25 levels.
          const bool exact = !hardware || decoders == 1;
          if (exact) {
            EXPECT_TRUE(result(*b) == want[k]) << what << ": the decode-ahead's render differs from decode_render";
          }
          const runtime::GpuJpegInput::Decoded* dec = in.current_decoded();
          ASSERT_NE(dec, nullptr);
          const auto got = images(dec->images, dec->offsets, *b);
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (got[i] == want_images[k][i]) continue;
            std::size_t first = 0, last = 0, n = 0;
            for (std::size_t q = 0; q < got[i].size(); ++q)
              if (got[i][q] != want_images[k][i][q]) {
                if (n++ == 0) first = q;
                last = q;
              }
            const Diff dd = diff(got[i].data(), want_images[k][i].data(), got[i].size());
            const std::size_t row = static_cast<std::size_t>(b->encoded->widths[i]) * 3;
            const std::string msg = fmt::format(
                "{}: image {} (sample {}, {}x{}) decoded differently in {} of {} bytes, rows {} to {}: mean |diff| "
                "{:.4f}, 99% <= {}, max {}",
                what, i, b->indices[i], b->encoded->widths[i], b->encoded->heights[i], n, got[i].size(), first / row,
                last / row, dd.mean, dd.p99, dd.max);
            std::printf("[ ahead  ] %s\n", msg.c_str());
            if (exact) {
              ADD_FAILURE() << msg;
            }
            EXPECT_LE(dd.mean, 0.25) << msg;
          }
          ++k;
          if (pass == 0 && k == 2) break;
        }
        in.end();
        EXPECT_EQ(k, pass == 0 ? 2u : want.size()) << decoders << " decoders";
      }
    }
    EXPECT_GT(in.ahead_stats().batches, 0);
  }
  // A corrupt image in batch 2 (samples 8..11 in stored order): batches 0 and 1 arrive, next() throws for batch 2.
  {
    const fs::path bad_dir = dir / "bad";
    fs::create_directories(bad_dir);
    const Case& bad = get("rgb420_corrupt");
    const std::string bad_path = (bad_dir / "bad.h5").string();
    {
      io::DatasetWriter w(bad_path, io::JpegStoreSpec{}, 4);
      for (std::int64_t i = 0; i < 16; ++i) {
        const Case& k = i == 9 ? bad : *rgb[static_cast<std::size_t>(i) % rgb.size()];
        std::vector<std::uint8_t> px(static_cast<std::size_t>(k.h * k.w * 3));  // statistics only: not all equal
        for (std::size_t q = 0; q < px.size(); ++q) px[q] = static_cast<std::uint8_t>(q * 7);
        w.append_encoded(io::Split::train, k.jpeg.data(), static_cast<std::int64_t>(k.jpeg.size()), k.h, k.w,
                         static_cast<std::int32_t>(i % 4), px.data());
      }
      w.finish();
    }
    const io::DatasetFile bf(bad_path);
    std::vector<std::int64_t> seq(16);
    for (std::int64_t i = 0; i < 16; ++i) seq[static_cast<std::size_t>(i)] = i;
    runtime::GpuJpegInput bin(3, bad_path);
    io::BatchLoader loader(bf, io::Split::train, batch, seq, {}, std::nullopt, lo);
    bin.begin(loader, io::Split::train, 2);
    std::int64_t delivered = 0;
    try {
      while (auto b = bin.next()) {
        bin.render_current(geometry(*b), d, mean, stddev, static_cast<int>(b->index % 2), stream);
        ++delivered;
      }
      ADD_FAILURE() << "a corrupt JPEG decoded ahead without an error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("/train/jpeg sample 9"), std::string::npos) << what;
    }
    bin.end();
    EXPECT_EQ(delivered, 2);
  }
  cuda::stream_synchronize(stream);
  cuda::device_free(d_data);
  cuda::device_free(d_labels);
  cuda::stream_destroy(stream);
}

// The device cache of a JPEG store (--decode gpu with --data-cache): every image decoded once at start-up, in
// batches of 4 (so 12, the last partial), each kept at its own size. 47 images, so that many batches mix the JPEG
// engines' images with a progressive one GPU-hybrid decodes after them on the same stream: with 23 (6 batches) one
// such image came out ~38 levels off on an H100 on 2026-12-05, beside other test processes; the cause is not
// established (kernels/cuda/jpeg_decode.cpp, Fence; docs/input-pipeline.md). Each cached image equals the same backend's
// synchronous decode of it (the default backend bit for bit; the JPEG engines within 0.25 levels, as above) and
// Pillow's within the decoders' tolerance; and the cache's captured gathers of a shuffled pass (random-resized crops,
// flips, FP16 into 8 channels, a partial last batch) equal io::render_sample + normalize_images of the cached pixels
// bit for bit, labels included.
TEST_F(GpuJpeg, TheDeviceCacheHoldsTheDecodedStore) {
  const std::vector<const Case*> rgb = rgb_cases();
  const std::int64_t count = 47, batch = 4, out = 48, out_c = 8, sample = out * out * out_c * 2;  // 47: prime (order)
  const std::string path = write_store(dir, rgb, count);
  const io::DatasetFile file(path);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stddev[3] = {0.229f, 0.224f, 0.225f};
  void* stream = cuda::stream_create();
  for (bool hardware : {false, true}) {
    const std::string what = hardware ? "the JPEG engines" : "the default backend";
    // The reference decode: every image in one synchronous batch.
    runtime::GpuJpegInput ref(3, path, hardware);
    std::vector<std::int64_t> all(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) all[static_cast<std::size_t>(i)] = i;
    io::EncodedBatch enc;
    file.read_encoded(io::Split::train, all, enc);
    ref.decode(enc, io::Split::train, all.data(), stream);
    cuda::stream_synchronize(stream);
    runtime::GpuJpegInput dec(3, path, hardware);
    runtime::GpuDataCache cache(file, 4, dec, nullptr, 1, batch);
    EXPECT_TRUE(cache.jpeg());
    EXPECT_EQ(dec.cpu_fallbacks(), 0) << what;
    for (std::int64_t i = 0; i < count; ++i) {
      const Case& k = *rgb[static_cast<std::size_t>(i) % rgb.size()];
      ASSERT_EQ(cache.sample_height(io::Split::train, i), k.h) << i;
      ASSERT_EQ(cache.sample_width(io::Split::train, i), k.w) << i;
      const std::vector<std::uint8_t> got = cache.image(io::Split::train, i);
      const std::vector<std::uint8_t> want = download_decoded(ref, static_cast<std::size_t>(i), k.h * k.w * 3);
      const Diff dd = diff(got.data(), want.data(), got.size());
      if (!hardware) {
        EXPECT_TRUE(got == want) << what << ": cached image " << i << " (" << k.name
                                 << ") differs from the synchronous "
                                 << "decode: mean |diff| " << dd.mean << ", max " << dd.max;
      } else if (got != want) {
        std::printf("[ cache ] %s: image %lld (%s) differs from the synchronous decode: mean %.4f, max %d\n",
                    what.c_str(), static_cast<long long>(i), k.name.c_str(), dd.mean, dd.max);
        EXPECT_LE(dd.mean, 0.25) << what << " image " << i;
      }
      expect_close_to_pillow(k, got.data());
    }
    // A shuffled pass through the captured gathers (slot 0 and 1 alternate, as training does).
    auto* d_data = static_cast<std::byte*>(cuda::device_alloc(2 * batch * sample, "test"));
    auto* d_labels = static_cast<std::byte*>(cuda::device_alloc(2 * batch * 4, "test"));
    for (int s = 0; s < 2; ++s)
      for (std::int64_t n : {batch, count % batch}) {
        runtime::GpuDataCache::Dest dst{d_labels + s * batch * 4, d_data + s * batch * sample, DType::F16, out_c};
        cache.prepare(io::Split::train, s, batch, n, dst, mean, stddev, out, out, true);
      }
    io::AugmentSpec spec;
    spec.out_h = spec.out_w = out;
    spec.crop = io::CropMode::random_resized;
    spec.horizontal_flip = true;
    std::vector<std::int64_t> order(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) order[static_cast<std::size_t>(i)] = (i * 7) % count;
    std::vector<io::SampleGeometry> geom(static_cast<std::size_t>(count));
    for (std::int64_t p = 0; p < count; ++p) {
      const std::int64_t j = order[static_cast<std::size_t>(p)];
      geom[static_cast<std::size_t>(p)] = io::sample_geometry(spec, 9, 2, p, cache.sample_height(io::Split::train, j),
                                                              cache.sample_width(io::Split::train, j));
    }
    cache.begin_pass(io::Split::train, order, &geom);
    std::vector<std::uint8_t> scratch, rendered(static_cast<std::size_t>(out * out * 3));
    for (std::int64_t b = 0; b * batch < count; ++b) {
      const std::int64_t n = std::min(batch, count - b * batch);
      const int s = static_cast<int>(b % 2);
      cache.launch(io::Split::train, s, n, stream);
      cuda::stream_synchronize(stream);
      std::vector<std::byte> got(static_cast<std::size_t>(n * sample));
      std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
      cuda::copy_d2h(got.data(), d_data + s * batch * sample, n * sample);
      cuda::copy_d2h(labels.data(), d_labels + s * batch * 4, n * 4);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = b * batch + i, j = order[static_cast<std::size_t>(p)];
        EXPECT_EQ(labels[static_cast<std::size_t>(i)], j % 4) << what << " position " << p;
        const std::vector<std::uint8_t> px = cache.image(io::Split::train, j);
        io::render_sample(px.data(), cache.sample_height(io::Split::train, j), cache.sample_width(io::Split::train, j),
                          3, geom[static_cast<std::size_t>(p)], spec, rendered.data(), scratch);
        std::vector<std::byte> want(static_cast<std::size_t>(sample));
        runtime::normalize_images(rendered.data(), 1, out, out, 3, mean, stddev, want.data(), DType::F16, out_c);
        EXPECT_EQ(std::memcmp(got.data() + i * sample, want.data(), static_cast<std::size_t>(sample)), 0)
            << what << ": the cache's gather of position " << p << " (sample " << j << ") differs from the CPU render";
      }
    }
    cuda::device_free(d_data);
    cuda::device_free(d_labels);
  }
  cuda::stream_destroy(stream);
}

// The path a user takes: `renaissance train --decode gpu` from a JPEG store (the pictures' classes are learnable:
// the class sets the picture's colour cast), AMP, random-resized crops to 32x32 and centre-crop validation; it
// trains (the loss falls, accuracy far above chance) and --decode gpu on the CPU backend is refused.
TEST_F(GpuJpeg, TrainsFromAJpegStore) {
  // Pictures made here in C++ would need an encoder (the GPU machine has no libturbojpeg): the python script's
  // pictures, each tinted per class, are written by a second call with a class argument.
  const std::string script = std::string(RENAISSANCE_SOURCE_DIR) + "/tests/gpu_runtime/make_jpeg_cases.py";
  std::string py;
  for (const char* p : {"python3", "/usr/bin/python3"})
    if (std::system(fmt::format("{} -c 'import PIL' >/dev/null 2>&1", p).c_str()) == 0) {
      py = p;
      break;
    }
  ASSERT_FALSE(py.empty());
  const fs::path sd = dir / "tinted";
  ASSERT_EQ(std::system(fmt::format("{} {} --tinted {} 4 400 100", py, script, sd.string()).c_str()), 0);
  const std::string data = (dir / "tinted.h5").string();
  {
    io::DatasetWriter w(data, io::JpegStoreSpec{}, 4);
    std::ifstream list(sd / "tinted.txt");
    std::string split;
    std::int64_t i = 0, h = 0, wd = 0;
    std::int32_t label = 0;
    while (list >> split >> i >> h >> wd >> label) {
      const std::vector<std::uint8_t> jpg = slurp(sd / fmt::format("{}_{}.jpg", split, i));
      const std::vector<std::uint8_t> raw = slurp(sd / fmt::format("{}_{}.raw", split, i));
      w.append_encoded(split == "train" ? io::Split::train : io::Split::val, jpg.data(),
                       static_cast<std::int64_t>(jpg.size()), h, wd, label, raw.data());
    }
    w.finish();
  }
  runtime::TrainOptions o;
  o.data_path = data;
  o.backend = runtime::Backend::CUDA;
  o.amp = true;
  o.batch = 64;
  o.epochs = 4;
  o.lr = 0.05;
  o.optimizer = plan::OptimizerKind::NESTEROV;
  o.seed = 3;
  o.augmentation.crop = io::CropMode::random_resized;
  o.augmentation.scale_min = 0.35;
  o.augmentation.horizontal_flip = true;
  o.val_batch = 50;
  o.decode = runtime::DecodeMode::gpu;
  o.data_cache = runtime::DataCacheMode::off;  // batch by batch; the device cache is trained below
  blueprint::BluePrint m = test::realistic_residual_model();
  m.root = blueprint::seq(blueprint::cbr(32, 3, 1, 1), blueprint::block(32, 64, blueprint::BlockKind::RESNET_3_3, 2),
                          blueprint::gap_fc(4), blueprint::softmax_ce(4));
  // One training, its per-step losses into *losses. The trainer is destroyed before the next run: measured on the
  // H200, a hardware nvJPEG decoder made while two others exist in the process decodes ~2.5 % of the bytes
  // differently (by <= 3 levels), so two trainers alive at once would not be one run repeated (a second process,
  // or a later run in this one, is).
  auto train = [&](const runtime::TrainOptions& opts, std::vector<double>* losses) {
    runtime::Trainer t(m, opts);
    runtime::TrainObserver obs;
    obs.on_step_loss = [&](std::int64_t, std::int64_t, double loss) { losses->push_back(loss); };
    return t.run(obs);
  };
  std::vector<double> losses;
  const std::vector<runtime::EpochMetrics> h = train(o, &losses);
  ASSERT_EQ(h.size(), 4u);
  for (const auto& e : h)
    std::printf("[ train ] epoch %lld: train loss %.4f, val loss %.4f, val top-1 %.3f, %.0f img/s\n",
                static_cast<long long>(e.epoch), e.train_loss, e.val_loss, e.val_top1, e.images_per_s);
  EXPECT_LT(h.back().train_loss, 0.8 * h.front().train_loss);
  EXPECT_GT(h.back().val_top1, 0.6) << "4 classes: chance is 0.25";
  // Reproducible: the same run again gives the same losses bit for bit (one decoder thread, the default); with
  // three decoder threads it trains as well (not bit for bit with the JPEG engines: see DecodeAhead above).
  for (int decoders : {1, 3}) {
    runtime::TrainOptions o2 = o;
    o2.gpu_decoders = decoders;
    std::vector<double> again;
    const std::vector<runtime::EpochMetrics> h2 = train(o2, &again);
    ASSERT_EQ(h2.size(), h.size());
    std::printf("[ train ] %d decoder thread(s): final train loss %.6f, val loss %.6f (first run %.6f, %.6f)\n",
                decoders, h2.back().train_loss, h2.back().val_loss, h.back().train_loss, h.back().val_loss);
    if (decoders == 1) {
      EXPECT_EQ(again, losses) << "the same run twice";
      EXPECT_EQ(h2.back().val_loss, h.back().val_loss);
    } else {
      EXPECT_LT(h2.back().train_loss, 0.8 * h2.front().train_loss);
      EXPECT_GT(h2.back().val_top1, 0.6);
    }
  }
  // The device cache (--data-cache on): the store decoded once at start-up, each batch rendered by the same kernel
  // from the cached images. Trained twice: the same losses bit for bit; and it trains as the batch-by-batch decode
  // does (the same losses where nvJPEG decoded the same pixels both ways: printed).
  {
    runtime::TrainOptions oc = o;
    oc.data_cache = runtime::DataCacheMode::on;
    std::vector<double> c1, c2;
    const std::vector<runtime::EpochMetrics> hc1 = train(oc, &c1);
    const std::vector<runtime::EpochMetrics> hc2 = train(oc, &c2);
    ASSERT_EQ(hc1.size(), h.size());
    std::printf(
        "[ train ] device cache: final train loss %.6f, val loss %.6f, val top-1 %.3f, %.0f img/s; "
        "per-step losses %s the batch-by-batch decode's\n",
        hc1.back().train_loss, hc1.back().val_loss, hc1.back().val_top1, hc1.back().images_per_s,
        c1 == losses ? "equal to" : "not equal to");
    EXPECT_EQ(c1, c2) << "the device cache's run twice";
    EXPECT_EQ(hc1.back().val_loss, hc2.back().val_loss);
    EXPECT_LT(hc1.back().train_loss, 0.8 * hc1.front().train_loss);
    EXPECT_GT(hc1.back().val_top1, 0.6);
  }
  // The CPU backend cannot decode on the GPU: refused, naming the option.
  o.backend = runtime::Backend::CPU;
  try {
    runtime::Trainer cpu(m, o);
    ADD_FAILURE() << "--decode gpu on the CPU backend was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--decode gpu"), std::string::npos) << e.what();
  }
}

}  // namespace
