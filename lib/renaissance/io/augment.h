// The input pipeline's pixel work on the CPU, the reference the GPU's kernels are tested against (DESIGN §8,
// issue 12): where each sample's crop comes from and whether it is mirrored (sample_geometry, a pure function of
// (seed, epoch, sample) through Philox, so of no rank count or thread), and how its pixels are made
// (render_sample: integer arithmetic only, image.h's resampling). Normalisation, the FP16 cast and channel padding
// follow in runtime::normalize_images.
//
// Per sample, in this order:
//   1. a source box of the stored (or decoded) image — the whole image, a random-resized crop, or the whole image
//      for a centre crop — is resampled (image.h, Pillow's BILINEAR) to a "virtual" size R_h x R_w, of which the
//      out_h x out_w window at (top, left) is kept (zeros outside the virtual image). Random-resized crop:
//      R = out, window at 0. Centre crop (validation): R = the image with its short side resized to resize_short,
//      window at the centre. None: R = out (a copy when the image already has that size).
//   2. a pad-crop shift (dy, dx) in [-p, p] with zero fill, and a horizontal flip, of that out_h x out_w image:
//      out(y, x) = img(y + dy, x' + dx), x' = flip ? out_w - 1 - x : x (0 outside the image).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::io {

enum class CropMode {
  none,            ///< the image as it is (resampled to the output size when it differs)
  random_resized,  ///< torchvision's RandomResizedCrop (scale, ratio, 10 attempts, centre-crop fallback)
  center,          ///< torchvision's Resize(resize_short) + CenterCrop(out): the validation transform
};
const char* crop_mode_name(CropMode m);  // "none", "random-resized", "center"
CropMode parse_crop_mode(const std::string& s);

/// What to do with each sample. One spec for the training split and one for validation (the trainer makes both).
struct AugmentSpec {
  std::int64_t out_h = 0, out_w = 0;  ///< the rendered size: the plan's input of the variant being fed
  CropMode crop = CropMode::none;
  double scale_min = 0.08, scale_max = 1.0;        ///< random_resized: area fraction of the source
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  ///< random_resized: aspect ratio w/h, log-uniform
  int attempts = 10;                               ///< random_resized: tries before the centre-crop fallback
  std::int64_t resize_short = 0;  ///< center: the short side before the crop; 0: round(max(out_h, out_w) / 0.875)
  std::int64_t crop_padding = 0;  ///< pad-crop shift range p (0: none)
  bool horizontal_flip = false;
  bool random() const { return crop == CropMode::random_resized || crop_padding > 0 || horizontal_flip; }
};

/// Everything random about one sample, and where its pixels come from. Plain integers: the GPU side computes these
/// on the host with this function (or reads them from an array filled by it) and its kernel renders from them.
struct SampleGeometry {
  std::int32_t box_y = 0, box_x = 0, box_h = 0, box_w = 0;  ///< the source region, inside the source image
  std::int32_t virt_h = 0, virt_w = 0;                      ///< the size that region is resampled to
  std::int32_t top = 0, left = 0;                           ///< the out_h x out_w window kept of it
  std::int32_t shift_y = 0, shift_x = 0;                    ///< pad-crop shift (dy, dx)
  std::int32_t flip = 0;                                    ///< 1: mirrored horizontally
  bool operator==(const SampleGeometry& o) const;
};

/// Philox purpose words (the counter's 4th word; words 0-2 are sample lo, sample hi, epoch). The pad-crop shift
/// and the flip come from the one block of kPurposeAugment (r0, r1, r2), as they always have; attempt a of a
/// random-resized crop from the block of kPurposeResizedCrop + a.
inline constexpr std::uint32_t kPurposeAugment = 0x41554721;      // "AUG!"
inline constexpr std::uint32_t kPurposeResizedCrop = 0x52524300;  // "RRC" + attempt

/// The geometry of sample `sample` (its position in the epoch's global order) of epoch `epoch` for a source image of
/// src_h x src_w. Random-resized crop, attempt a, block r = Philox(seed, {sample, sample >> 32, epoch, "RRC" + a}):
///   u = (r >> 8) / 2^24 (24-bit uniforms in [0, 1), as floats, then in double):
///   area   = src_h * src_w;   target = area * (scale_min + (scale_max - scale_min) * u(r0))
///   aspect = exp(log(ratio_min) + (log(ratio_max) - log(ratio_min)) * u(r1))
///   w = rint(sqrt(target * aspect)), h = rint(sqrt(target / aspect))   (round half to even, as Python's round)
///   accepted when 0 < w <= src_w and 0 < h <= src_h: box_y = (r2 * (src_h - h + 1)) >> 32,
///   box_x = (r3 * (src_w - w + 1)) >> 32 (64-bit products);
/// after `attempts` failures, torchvision's fallback: the centre crop of the largest box within the ratio range
/// (h = rint(w / ratio_min) when the image is narrower, w = rint(h * ratio_max) when wider, else all of it), at
/// ((src_h - h) / 2, (src_w - w) / 2) (floor division). exp and log are glibc's (double); everything after them is
/// exact IEEE arithmetic. Pad-crop: dy = r0 % (2p + 1) - p, dx = r1 % (2p + 1) - p, flip = r2 & 1 of the block
/// Philox(seed, {sample, sample >> 32, epoch, "AUG!"}).
SampleGeometry sample_geometry(const AugmentSpec& spec, std::uint64_t seed, std::int64_t epoch, std::int64_t sample,
                               std::int64_t src_h, std::int64_t src_w);

/// Renders one sample: `src` (src_h x src_w x c, uint8 HWC) → `out` (spec.out_h x spec.out_w x c) as the file
/// comment says. Integer arithmetic only: another implementation that follows image.h and this file gets the same
/// bytes. `scratch` is reused between calls (no allocation per sample once warm).
void render_sample(const std::uint8_t* src, std::int64_t src_h, std::int64_t src_w, std::int64_t c,
                   const SampleGeometry& g, const AugmentSpec& spec, std::uint8_t* out,
                   std::vector<std::uint8_t>& scratch);

}  // namespace renaissance::io
