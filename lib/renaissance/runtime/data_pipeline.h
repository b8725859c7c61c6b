// The trainer's input pipeline: sample order, augmentation and normalisation, all keyed by
// (seed, epoch, sample index) through Philox, so they do not depend on ranks or loader threads.
#pragma once

#include <renaissance/core/dtype.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/batch_loader.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace renaissance::runtime {

/// The training run's augmentation (`renaissance train --crop ... --crop-padding ... --no-flip`); io/augment.h
/// defines every operation (the CPU reference the GPU pipeline is tested against).
struct Augmentation {
  std::int64_t crop_padding = 0;  ///< random crop of the original size from the image zero-padded by this much
  bool horizontal_flip = false;
  /// The training crop: none (the stored image; a raw store of the model's size), random-resized (torchvision's
  /// RandomResizedCrop to the model's size, with scale and ratio below), center (Resize + CenterCrop, no randomness).
  io::CropMode crop = io::CropMode::none;
  double scale_min = 0.08, scale_max = 1.0, ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  /// Validation of images that are not already the model's size (JPEG stores, raw stores of another size): the short
  /// side resized to this, then the centre crop (0: round(size / 0.875), torchvision's 256 for 224).
  std::int64_t val_resize = 0;
  bool enabled() const { return crop_padding > 0 || horizontal_flip || crop == io::CropMode::random_resized; }
};

/// The spec of the training split rendered at out_h x out_w.
io::AugmentSpec train_spec(const Augmentation& a, std::int64_t out_h, std::int64_t out_w);
/// Validation and inference at out_h x out_w: a copy when the images already have that size (`same_size`), else the
/// resize + centre crop; never random.
io::AugmentSpec val_spec(const Augmentation& a, std::int64_t out_h, std::int64_t out_w, bool same_size);
/// The loader's per-sample work for `spec`: sample at order position p gets the geometry of Philox key positions[p]
/// (the sample's position in the global epoch order; nullptr: p itself) of `epoch`.
io::SampleRender make_render(const io::AugmentSpec& spec, std::uint64_t seed, std::int64_t epoch,
                             const std::vector<std::int64_t>* positions);

/// The box make_render's sample at order position p reads of a h x w source (LoaderOptions::region: a JPEG store
/// then decodes only that part, the same pixels there). Random-resized crops only (the other modes read the whole
/// image), and only in builds that decode JPEGs partially; else empty.
io::SampleRegion make_region(const io::AugmentSpec& spec, std::uint64_t seed, std::int64_t epoch,
                             const std::vector<std::int64_t>* positions);

/// `renaissance data bench-decode --device cpu`: img/s of a JPEG store's train split (`images` of it; 0: all) through
/// the CPU loader (a pool of `threads`, batches of `batch`): read alone, then read + decode + render (the crop mode,
/// a flip, to size x size) decoding whole images, then decoding only each crop's box (random-resized crops in a build
/// with partial JPEG decoding; box_per_s 0 otherwise). The best of `passes` timed epochs each, after one untimed.
struct CpuDecodeBench {
  std::int64_t images = 0;
  double read_per_s = 0, whole_per_s = 0, box_per_s = 0;
};
CpuDecodeBench bench_cpu_decode(const io::DatasetFile& data, std::int64_t images, std::int64_t batch,
                                std::int64_t size, io::CropMode crop, int threads, int passes);

/// The epoch's sample order: a Philox-keyed Fisher–Yates permutation of [0, n) (identity when !shuffle).
std::vector<std::int64_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::int64_t n, bool shuffle);

/// Augments one uint8 HWC image in place; the randomness is a function of (seed, epoch, sample).
void augment_image(std::uint8_t* image, std::int64_t h, std::int64_t w, std::int64_t c, const Augmentation& a,
                   std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::vector<std::uint8_t>& scratch);

/// Writes (pixel/255 − mean[c]) / std[c] for `count` uint8 HWC images into `dst` (F32 or F16) with `dst_c`
/// channels (≥ c; extra channels are zero: the AMP data buffer pads to 8). Bilinear-free: sizes must match.
void normalize_images(const std::uint8_t* src, std::int64_t count, std::int64_t h, std::int64_t w, std::int64_t c,
                      const float* mean, const float* stddev, std::byte* dst, DType dst_dtype, std::int64_t dst_c);
/// normalize_images over the threads of `pool` (nullptr: this thread), in pieces of whole images: the same bytes.
void normalize_images(io::LoaderPool* pool, const std::uint8_t* src, std::int64_t count, std::int64_t h,
                      std::int64_t w, std::int64_t c, const float* mean, const float* stddev, std::byte* dst,
                      DType dst_dtype, std::int64_t dst_c);

/// Bilinear resize of `count` uint8 HWC images (align_corners = false, as torchvision's Resize on tensors
/// without antialiasing); progressive resize trains the first epochs at a lower resolution.
void resize_images(const std::uint8_t* src, std::int64_t count, std::int64_t h, std::int64_t w, std::int64_t c,
                   std::uint8_t* dst, std::int64_t oh, std::int64_t ow);

}  // namespace renaissance::runtime
