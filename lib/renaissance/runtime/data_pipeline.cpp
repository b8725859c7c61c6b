#include <renaissance/core/error.h>
#include <renaissance/core/philox.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/image.h>
#include <renaissance/io/loader_pool.h>
#include <renaissance/runtime/data_pipeline.h>

#include <kernels/cpu/half.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

namespace renaissance::runtime {

namespace {
// Philox "purpose" words keep the streams of different uses apart (augmentation: io/augment.h).
constexpr std::uint32_t kPurposeOrder = 0x4f524452;  // "ORDR"
}  // namespace

io::AugmentSpec train_spec(const Augmentation& a, std::int64_t out_h, std::int64_t out_w) {
  io::AugmentSpec s;
  s.out_h = out_h;
  s.out_w = out_w;
  s.crop = a.crop;
  s.scale_min = a.scale_min;
  s.scale_max = a.scale_max;
  s.ratio_min = a.ratio_min;
  s.ratio_max = a.ratio_max;
  s.resize_short = a.val_resize;
  s.crop_padding = a.crop_padding;
  s.horizontal_flip = a.horizontal_flip;
  return s;
}

io::AugmentSpec val_spec(const Augmentation& a, std::int64_t out_h, std::int64_t out_w, bool same_size) {
  io::AugmentSpec s;
  s.out_h = out_h;
  s.out_w = out_w;
  s.crop = same_size ? io::CropMode::none : io::CropMode::center;
  s.resize_short = a.val_resize;
  return s;
}

io::SampleRender make_render(const io::AugmentSpec& spec, std::uint64_t seed, std::int64_t epoch,
                             const std::vector<std::int64_t>* positions) {
  return [spec, seed, epoch, positions](const io::SampleSource& src, std::int64_t p, std::uint8_t* out) {
    thread_local std::vector<std::uint8_t> scratch;
    const std::int64_t key = positions ? (*positions)[static_cast<std::size_t>(p)] : p;
    // The geometry of the whole image; a decoded part of it (LoaderOptions::region) holds the box at an offset.
    const bool part = src.full_h > 0;
    io::SampleGeometry g = io::sample_geometry(spec, seed, epoch, key, part ? src.full_h : src.height,
                                               part ? src.full_w : src.width);
    if (part) {
      RN_CHECK(g.box_y >= src.row0 && g.box_x >= src.col0 && g.box_y + g.box_h <= src.row0 + src.height &&
                   g.box_x + g.box_w <= src.col0 + src.width,
               "internal: the decoded part {}x{} at ({}, {}) does not hold the sample's box {}x{} at ({}, {})",
               src.width, src.height, src.col0, src.row0, g.box_w, g.box_h, g.box_x, g.box_y);
      g.box_y -= static_cast<std::int32_t>(src.row0);
      g.box_x -= static_cast<std::int32_t>(src.col0);
    }
    io::render_sample(src.pixels, src.height, src.width, src.channels, g, spec, out, scratch);
  };
}

io::SampleRegion make_region(const io::AugmentSpec& spec, std::uint64_t seed, std::int64_t epoch,
                             const std::vector<std::int64_t>* positions) {
  if (spec.crop != io::CropMode::random_resized || !io::have_region_decode()) return {};
  return [spec, seed, epoch, positions](std::int64_t h, std::int64_t w, std::int64_t p) {
    const std::int64_t key = positions ? (*positions)[static_cast<std::size_t>(p)] : p;
    const io::SampleGeometry g = io::sample_geometry(spec, seed, epoch, key, h, w);
    return io::SourceBox{g.box_y, g.box_x, g.box_h, g.box_w};
  };
}

CpuDecodeBench bench_cpu_decode(const io::DatasetFile& data, std::int64_t images, std::int64_t batch,
                                std::int64_t size, io::CropMode crop, int threads, int passes) {
  RN_CHECK_CTX(data.storage() == io::Storage::jpeg, data.path(), "bench-decode needs a JPEG store (--store jpeg)");
  RN_CHECK_CTX(batch >= 1 && size >= 1 && passes >= 1 && threads >= 1, "bench-decode",
               "batch, size, passes and threads must be >= 1");
  const std::int64_t all = data.size(io::Split::train);
  const std::int64_t n = images > 0 ? std::min(images, all) : all;
  RN_CHECK_CTX(n > 0, data.path(), "the train split is empty");
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  io::LoaderPool pool(threads - 1);  // the loader's own thread is one of them
  Augmentation aug;
  aug.crop = crop;
  aug.horizontal_flip = true;
  const io::AugmentSpec spec = train_spec(aug, size, size);
  CpuDecodeBench r;
  r.images = n;
  // kind 0: read only; 1: + decode whole + render; 2: + decode the box + render. Pass 0 of each is a warm-up; each
  // pass is another epoch (other crops).
  for (int kind = 0; kind < 3; ++kind) {
    if (kind == 2 && !make_region(spec, 0, 0, nullptr)) break;  // centre crops, or no partial decoding
    double best = 0;
    for (int pass = 0; pass <= passes; ++pass) {
      io::LoaderOptions lo;
      lo.pool = &pool;
      if (kind == 0) {
        lo.encoded = true;
      } else {
        lo.out_h = lo.out_w = size;
        lo.render = make_render(spec, 0, pass, nullptr);
        if (kind == 2) lo.region = make_region(spec, 0, pass, nullptr);
      }
      const auto t0 = std::chrono::steady_clock::now();
      io::BatchLoader loader(data, io::Split::train, batch, order, {}, std::nullopt, lo);
      while (loader.next()) {
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (pass > 0) best = std::max(best, static_cast<double>(n) / s);
    }
    (kind == 0 ? r.read_per_s : kind == 1 ? r.whole_per_s : r.box_per_s) = best;
  }
  return r;
}

std::vector<std::int64_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::int64_t n, bool shuffle) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  PhiloxStream rng(seed, static_cast<std::uint64_t>(epoch), kPurposeOrder);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng.below(static_cast<std::uint32_t>(i + 1)));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

void augment_image(std::uint8_t* image, std::int64_t h, std::int64_t w, std::int64_t c, const Augmentation& a,
                   std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::vector<std::uint8_t>& scratch) {
  if (!a.enabled()) return;
  // One definition of the pixel work (io/augment.h), in place: the image is copied aside and rendered back.
  const io::AugmentSpec spec = train_spec(a, h, w);
  const io::SampleGeometry g = io::sample_geometry(spec, seed, epoch, sample, h, w);
  const std::size_t bytes = static_cast<std::size_t>(h * w * c);
  std::vector<std::uint8_t> copy(image, image + bytes);
  io::render_sample(copy.data(), h, w, c, g, spec, image, scratch);
}

void normalize_images(const std::uint8_t* src, std::int64_t count, std::int64_t h, std::int64_t w, std::int64_t c,
                      const float* mean, const float* stddev, std::byte* dst, DType dst_dtype, std::int64_t dst_c) {
  RN_CHECK(dst_c >= c, "data buffer has {} channels but the images have {}", dst_c, c);
  RN_CHECK(dst_dtype == DType::F32 || dst_dtype == DType::F16, "data buffer must be f32 or f16");
  float scale[16], bias[16];
  RN_CHECK(c <= 16, "at most 16 image channels are supported, got {}", c);
  for (std::int64_t k = 0; k < c; ++k) {
    scale[k] = 1.0f / (255.0f * stddev[k]);
    bias[k] = -mean[k] / stddev[k];
  }
  const std::int64_t pixels = count * h * w;
  if (dst_dtype == DType::F32) {
    float* out = reinterpret_cast<float*>(dst);
    for (std::int64_t i = 0; i < pixels; ++i) {
      for (std::int64_t k = 0; k < c; ++k) out[i * dst_c + k] = static_cast<float>(src[i * c + k]) * scale[k] + bias[k];
      for (std::int64_t k = c; k < dst_c; ++k) out[i * dst_c + k] = 0.0f;
    }
  } else {
    auto* out = reinterpret_cast<std::uint16_t*>(dst);
    for (std::int64_t i = 0; i < pixels; ++i) {
      for (std::int64_t k = 0; k < c; ++k)
        out[i * dst_c + k] = cpu::float_to_half(static_cast<float>(src[i * c + k]) * scale[k] + bias[k]);
      for (std::int64_t k = c; k < dst_c; ++k) out[i * dst_c + k] = 0;
    }
  }
}

void normalize_images(io::LoaderPool* pool, const std::uint8_t* src, std::int64_t count, std::int64_t h,
                      std::int64_t w, std::int64_t c, const float* mean, const float* stddev, std::byte* dst,
                      DType dst_dtype, std::int64_t dst_c) {
  const int workers = pool ? pool->threads() + 1 : 1;
  if (workers <= 1 || count < 2) {
    normalize_images(src, count, h, w, c, mean, stddev, dst, dst_dtype, dst_c);
    return;
  }
  const std::int64_t pieces = std::min<std::int64_t>(count, 4 * workers);
  const std::int64_t in_bytes = h * w * c;
  const std::int64_t out_bytes = h * w * dst_c * static_cast<std::int64_t>(dtype_size(dst_dtype));
  pool->parallel_for(pieces, [&](std::int64_t k) {
    const std::int64_t a = count * k / pieces, b = count * (k + 1) / pieces;
    normalize_images(src + a * in_bytes, b - a, h, w, c, mean, stddev, dst + a * out_bytes, dst_dtype, dst_c);
  });
}

void resize_images(const std::uint8_t* src, std::int64_t count, std::int64_t h, std::int64_t w, std::int64_t c,
                   std::uint8_t* dst, std::int64_t oh, std::int64_t ow) {
  RN_CHECK(oh > 0 && ow > 0 && h > 0 && w > 0, "resize from {}x{} to {}x{}", h, w, oh, ow);
  const float sy = static_cast<float>(h) / static_cast<float>(oh), sx = static_cast<float>(w) / static_cast<float>(ow);
  for (std::int64_t n = 0; n < count; ++n) {
    const std::uint8_t* in = src + n * h * w * c;
    std::uint8_t* out = dst + n * oh * ow * c;
    for (std::int64_t y = 0; y < oh; ++y) {
      const float fy = std::max(0.0f, (static_cast<float>(y) + 0.5f) * sy - 0.5f);
      const std::int64_t y0 = std::min(static_cast<std::int64_t>(fy), h - 1), y1 = std::min(y0 + 1, h - 1);
      const float ty = fy - static_cast<float>(y0);
      for (std::int64_t x = 0; x < ow; ++x) {
        const float fx = std::max(0.0f, (static_cast<float>(x) + 0.5f) * sx - 0.5f);
        const std::int64_t x0 = std::min(static_cast<std::int64_t>(fx), w - 1), x1 = std::min(x0 + 1, w - 1);
        const float tx = fx - static_cast<float>(x0);
        for (std::int64_t k = 0; k < c; ++k) {
          auto at = [&](std::int64_t yy, std::int64_t xx) { return static_cast<float>(in[(yy * w + xx) * c + k]); };
          const float v = (1 - ty) * ((1 - tx) * at(y0, x0) + tx * at(y0, x1)) + ty * ((1 - tx) * at(y1, x0) + tx * at(y1, x1));
          out[(y * ow + x) * c + k] = static_cast<std::uint8_t>(std::lround(std::clamp(v, 0.0f, 255.0f)));
        }
      }
    }
  }
}

}  // namespace renaissance::runtime
