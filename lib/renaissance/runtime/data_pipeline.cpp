#include <renaissance/core/error.h>
#include <renaissance/core/philox.h>
#include <renaissance/runtime/data_pipeline.h>

#include <kernels/cpu/half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace renaissance::runtime {

namespace {
// Philox "purpose" words keep the streams of different uses apart.
constexpr std::uint32_t kPurposeOrder = 0x4f524452;    // "ORDR"
constexpr std::uint32_t kPurposeAugment = 0x41554721;  // "AUG!"
}  // namespace

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
  const Philox::Block r = Philox::generate(
      seed, {static_cast<std::uint32_t>(sample), static_cast<std::uint32_t>(sample >> 32),
             static_cast<std::uint32_t>(epoch), kPurposeAugment});
  const std::int64_t p = a.crop_padding;
  const std::int64_t dy = p > 0 ? static_cast<std::int64_t>(r[0] % static_cast<std::uint32_t>(2 * p + 1)) - p : 0;
  const std::int64_t dx = p > 0 ? static_cast<std::int64_t>(r[1] % static_cast<std::uint32_t>(2 * p + 1)) - p : 0;
  const bool flip = a.horizontal_flip && (r[2] & 1u);
  if (dy == 0 && dx == 0 && !flip) return;
  const std::size_t bytes = static_cast<std::size_t>(h * w * c);
  scratch.assign(image, image + bytes);
  // out(y, x) = in(y + dy, x' + dx) with x' the (possibly mirrored) column; outside the image reads 0.
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
