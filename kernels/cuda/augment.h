// The GPU input pipeline's kernels (issue 12, docs/input-pipeline.md): a batch gathered from a device-resident uint8
// store and rendered as io::render_sample does on the host — the source box resampled (Pillow's BILINEAR in 22-bit
// fixed point, io/image.h, coefficient tables computed on the device with the host's IEEE double operations), the
// window kept, the pad-crop shift and the flip — then normalised, cast to FP16 (AMP) and channel-padded, straight
// into the plan's input buffer. No CUDA types: the runtime calls these.
#pragma once

#include <cstdint>

namespace renaissance::cuda {

using StreamHandle = void*;  ///< a cudaStream_t

/// Ints per sample in a pass table: the stored index, then io::SampleGeometry's 11 fields in their order (box_y,
/// box_x, box_h, box_w, virt_h, virt_w, top, left, shift_y, shift_x, flip).
inline constexpr int kGatherTableInts = 12;

/// One gather: batch number *cursor of a pass whose batches hold `batch` samples, `count` of them in this one.
/// Each pixel: v = float(px) * scale[k] + bias[k] (two roundings, no FMA: runtime::normalize_images' arithmetic),
/// channels k >= c are 0, FP16 rounded to nearest even.
struct GatherParams {
  const std::uint8_t* images = nullptr;  ///< [n, h, w, c] uint8 on the device
  std::int64_t h = 0, w = 0, c = 0;
  const std::int32_t* labels = nullptr;  ///< [n] on the device
  const std::int32_t* table = nullptr;   ///< [pass samples, kGatherTableInts] on the device
  const std::int32_t* cursor = nullptr;  ///< the pass's batch counter on the device (nullptr: batch 0)
  std::int64_t batch = 0, count = 0;
  std::int64_t out_h = 0, out_w = 0;  ///< the rendered size
  /// false: every box is the whole image and every virtual size the image's (shift and flip only, one thread a
  /// pixel); true: the general render, one block a sample, with the scratch below.
  bool resample = false;
  int max_taps = 0;                 ///< resample: the longest filter of the pass (2 ceil(scale) + 1), <= kMaxTaps
  std::uint8_t* scratch = nullptr;  ///< resample: [batch, h, out_w, c] bytes (the horizontal pass' rows)
  std::int64_t scratch_stride = 0;  ///< resample: bytes of scratch per sample (0: h * out_w * c)
  /// Decoded JPEG images (resample only): [images, 3] int64 on the device, image idx (a table entry's stored index)
  /// at byte offset sources[3 idx] of `images`, sources[3 idx + 1] x sources[3 idx + 2] (h x w) x c; `h` is then the
  /// tallest image's height (the scratch's rows). A decoded batch (gpu_jpeg.h): `cursor` nullptr, the table holds
  /// the batch only, entry n's index n, `labels` the batch's; the device cache of a JPEG store: the split's images.
  const std::int64_t* sources = nullptr;
  float scale[16] = {}, bias[16] = {};
  void* out = nullptr;  ///< [count, out_h, out_w, out_c] FP32 or FP16
  bool out_f16 = false;
  std::int64_t out_c = 0;
  std::int32_t* out_labels = nullptr;  ///< [count]
};
inline constexpr int kMaxTaps = 64;
void gather_normalize(const GatherParams& p, StreamHandle stream);
/// *cursor += 1 (one thread): captured after the gather, so the next replay reads the next batch.
void advance_cursor(std::int32_t* cursor, StreamHandle stream);

}  // namespace renaissance::cuda
