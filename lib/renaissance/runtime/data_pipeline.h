// The trainer's input pipeline: sample order, augmentation and normalisation, all keyed by
// (seed, epoch, sample index) through Philox, so they do not depend on ranks or loader threads.
#pragma once

#include <renaissance/core/dtype.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace renaissance::runtime {

struct Augmentation {
  std::int64_t crop_padding = 0;  ///< random crop of the original size from the image zero-padded by this much
  bool horizontal_flip = false;
  bool enabled() const { return crop_padding > 0 || horizontal_flip; }
};

/// The epoch's sample order: a Philox-keyed Fisher–Yates permutation of [0, n) (identity when !shuffle).
std::vector<std::int64_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::int64_t n, bool shuffle);

/// Augments one uint8 HWC image in place; the randomness is a function of (seed, epoch, sample).
void augment_image(std::uint8_t* image, std::int64_t h, std::int64_t w, std::int64_t c, const Augmentation& a,
                   std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::vector<std::uint8_t>& scratch);

/// Writes (pixel/255 − mean[c]) / std[c] for `count` uint8 HWC images into `dst` (F32 or F16) with `dst_c`
/// channels (≥ c; extra channels are zero: the AMP data buffer pads to 8). Bilinear-free: sizes must match.
void normalize_images(const std::uint8_t* src, std::int64_t count, std::int64_t h, std::int64_t w, std::int64_t c,
                      const float* mean, const float* stddev, std::byte* dst, DType dst_dtype, std::int64_t dst_c);

/// Bilinear resize of `count` uint8 HWC images (align_corners = false, as torchvision's Resize on tensors
/// without antialiasing); progressive resize trains the first epochs at a lower resolution.
void resize_images(const std::uint8_t* src, std::int64_t count, std::int64_t h, std::int64_t w, std::int64_t c,
                   std::uint8_t* dst, std::int64_t oh, std::int64_t ow);

}  // namespace renaissance::runtime
