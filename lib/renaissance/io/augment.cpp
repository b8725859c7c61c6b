#include <renaissance/io/augment.h>

#include <renaissance/core/error.h>
#include <renaissance/core/philox.h>
#include <renaissance/io/image.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace renaissance::io {

namespace {

Philox::Block block(std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::uint32_t purpose) {
  return Philox::generate(seed, {static_cast<std::uint32_t>(sample), static_cast<std::uint32_t>(sample >> 32),
                                 static_cast<std::uint32_t>(epoch), purpose});
}

/// Uniform integer in [0, n) by multiply-shift (PhiloxStream::below).
std::int64_t below(std::uint32_t r, std::int64_t n) {
  return static_cast<std::int64_t>((static_cast<std::uint64_t>(r) * static_cast<std::uint64_t>(n)) >> 32);
}

std::int64_t round_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

}  // namespace

const char* crop_mode_name(CropMode m) {
  switch (m) {
    case CropMode::random_resized: return "random-resized";
    case CropMode::center: return "center";
    default: return "none";
  }
}

CropMode parse_crop_mode(const std::string& s) {
  if (s == "none") return CropMode::none;
  if (s == "random-resized" || s == "rrc") return CropMode::random_resized;
  if (s == "center" || s == "centre") return CropMode::center;
  RN_FAIL_CTX("--crop", "unknown crop '{}' (known: none, random-resized, center)", s);
}

bool SampleGeometry::operator==(const SampleGeometry& o) const {
  return box_y == o.box_y && box_x == o.box_x && box_h == o.box_h && box_w == o.box_w && virt_h == o.virt_h &&
         virt_w == o.virt_w && top == o.top && left == o.left && shift_y == o.shift_y && shift_x == o.shift_x &&
         flip == o.flip;
}

SampleGeometry sample_geometry(const AugmentSpec& a, std::uint64_t seed, std::int64_t epoch, std::int64_t sample,
                               std::int64_t src_h, std::int64_t src_w) {
  RN_CHECK(src_h > 0 && src_w > 0 && a.out_h > 0 && a.out_w > 0, "augmentation of a {}x{} image to {}x{}", src_w,
           src_h, a.out_w, a.out_h);
  SampleGeometry g;
  g.box_h = static_cast<std::int32_t>(src_h);
  g.box_w = static_cast<std::int32_t>(src_w);
  g.virt_h = static_cast<std::int32_t>(a.out_h);
  g.virt_w = static_cast<std::int32_t>(a.out_w);
  if (a.crop == CropMode::center) {
    const std::int64_t short_side =
        a.resize_short > 0 ? a.resize_short
                           : round_even(static_cast<double>(std::max(a.out_h, a.out_w)) / 0.875);
    const ResizeCrop rc = resize_short_center_crop(src_h, src_w, short_side, a.out_h, a.out_w);
    // A very elongated image at a large short side passes 2^31 pixels on its long side (it wrapped to a negative size).
    RN_CHECK(rc.resized_h <= std::numeric_limits<std::int32_t>::max() &&
                 rc.resized_w <= std::numeric_limits<std::int32_t>::max(),
             "sample {}: a {}x{} image resized to a short side of {} would be {}x{} pixels, past 2^31 on a side (a "
             "smaller --val-resize, or crop the image)",
             sample, src_w, src_h, short_side, rc.resized_w, rc.resized_h);
    g.virt_h = static_cast<std::int32_t>(rc.resized_h);
    g.virt_w = static_cast<std::int32_t>(rc.resized_w);
    g.top = static_cast<std::int32_t>(rc.top);
    g.left = static_cast<std::int32_t>(rc.left);
  } else if (a.crop == CropMode::random_resized) {
    RN_CHECK(a.scale_min > 0 && a.scale_min <= a.scale_max && a.ratio_min > 0 && a.ratio_min <= a.ratio_max,
             "random-resized crop: scale ({}, {}) and ratio ({}, {}) must be positive and ordered", a.scale_min,
             a.scale_max, a.ratio_min, a.ratio_max);
    const double area = static_cast<double>(src_h) * static_cast<double>(src_w);
    const double log_min = std::log(a.ratio_min), log_max = std::log(a.ratio_max);
    bool found = false;
    for (int attempt = 0; attempt < a.attempts && !found; ++attempt) {
      const Philox::Block r = block(seed, epoch, sample, kPurposeResizedCrop + static_cast<std::uint32_t>(attempt));
      const double u0 = static_cast<double>(Philox::to_unit(r[0])), u1 = static_cast<double>(Philox::to_unit(r[1]));
      const double target = area * (a.scale_min + (a.scale_max - a.scale_min) * u0);
      const double aspect = std::exp(log_min + (log_max - log_min) * u1);
      const std::int64_t w = round_even(std::sqrt(target * aspect));
      const std::int64_t h = round_even(std::sqrt(target / aspect));
      if (0 < w && w <= src_w && 0 < h && h <= src_h) {
        g.box_y = static_cast<std::int32_t>(below(r[2], src_h - h + 1));
        g.box_x = static_cast<std::int32_t>(below(r[3], src_w - w + 1));
        g.box_h = static_cast<std::int32_t>(h);
        g.box_w = static_cast<std::int32_t>(w);
        found = true;
      }
    }
    if (!found) {  // torchvision's fallback: a centre crop within the ratio range
      const double in_ratio = static_cast<double>(src_w) / static_cast<double>(src_h);
      std::int64_t w = src_w, h = src_h;
      if (in_ratio < a.ratio_min) {
        h = round_even(static_cast<double>(w) / a.ratio_min);
      } else if (in_ratio > a.ratio_max) {
        w = round_even(static_cast<double>(h) * a.ratio_max);
      }
      h = std::clamp<std::int64_t>(h, 1, src_h);
      w = std::clamp<std::int64_t>(w, 1, src_w);
      g.box_y = static_cast<std::int32_t>((src_h - h) / 2);
      g.box_x = static_cast<std::int32_t>((src_w - w) / 2);
      g.box_h = static_cast<std::int32_t>(h);
      g.box_w = static_cast<std::int32_t>(w);
    }
  }
  if (a.crop_padding > 0 || a.horizontal_flip) {
    const Philox::Block r = block(seed, epoch, sample, kPurposeAugment);
    const std::int64_t p = a.crop_padding;
    if (p > 0) {
      g.shift_y = static_cast<std::int32_t>(static_cast<std::int64_t>(r[0] % static_cast<std::uint32_t>(2 * p + 1)) - p);
      g.shift_x = static_cast<std::int32_t>(static_cast<std::int64_t>(r[1] % static_cast<std::uint32_t>(2 * p + 1)) - p);
    }
    g.flip = a.horizontal_flip && (r[2] & 1u) ? 1 : 0;
  }
  return g;
}

void render_sample(const std::uint8_t* src, std::int64_t src_h, std::int64_t src_w, std::int64_t c,
                   const SampleGeometry& g, const AugmentSpec& a, std::uint8_t* out,
                   std::vector<std::uint8_t>& scratch) {
  const std::int64_t oh = a.out_h, ow = a.out_w;
  const bool moved = g.shift_y != 0 || g.shift_x != 0 || g.flip;
  // Step 1 into `out` directly, or into a staging image when step 2 moves pixels. The resampler's own temporary
  // lives at the scratch's end.
  const std::size_t image = static_cast<std::size_t>(oh * ow * c);
  if (scratch.size() < image) scratch.resize(image);
  std::uint8_t* stage = moved ? scratch.data() : out;
  thread_local std::vector<std::uint8_t> rows;
  resample_window(src, src_h, src_w, c, g.box_y, g.box_x, g.box_h, g.box_w, g.virt_h, g.virt_w, g.top, g.left, stage,
                  oh, ow, rows);
  if (!moved) return;
  for (std::int64_t y = 0; y < oh; ++y)
    for (std::int64_t x = 0; x < ow; ++x) {
      const std::int64_t sx = (g.flip ? ow - 1 - x : x) + g.shift_x, sy = y + g.shift_y;
      std::uint8_t* d = out + (y * ow + x) * c;
      if (sy < 0 || sy >= oh || sx < 0 || sx >= ow)
        std::memset(d, 0, static_cast<std::size_t>(c));
      else
        std::memcpy(d, stage + (sy * ow + sx) * c, static_cast<std::size_t>(c));
    }
}

}  // namespace renaissance::io
