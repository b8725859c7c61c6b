// BatchLoader: reads batch k+1 from a DatasetFile on a background thread while the caller consumes batch k,
// into two host buffers (A/B, like the I_A_*/I_B_* input regions they are copied into). With a SampleRender (issue
// 12) every sample is decoded (JPEG stores) and rendered (augmented, resized) on the loader threads of a LoaderPool,
// into a batch of out_h x out_w images whatever the stored sizes.
#pragma once

#include <renaissance/io/dataset.h>
#include <renaissance/io/loader_pool.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace renaissance::io {

/// One batch, valid until the next call to next() (or the loader's destruction).
struct Batch {
  const std::uint8_t* images = nullptr;  // [count, H, W, C]
  const std::int32_t* labels = nullptr;  // [count]
  std::int64_t count = 0;
  std::int64_t index = 0;           // batch number within the epoch
  std::int64_t first_position = 0;  // position in `order` of the first sample (= index * batch_size)
  std::int64_t height = 0, width = 0;  // of every image: the stored size, or LoaderOptions' out_h x out_w
  /// LoaderOptions::encoded (JPEG stores decoded on the GPU): the batch's JPEG bytes, shapes and labels as read
  /// (`images` is then nullptr, `labels` the encoded batch's); `indices` the samples' stored indices.
  const EncodedBatch* encoded = nullptr;
  const std::int64_t* indices = nullptr;
};

/// One sample as stored (raw stores) or decoded (JPEG stores), HWC uint8: the whole image, or (LoaderOptions::region)
/// the part of it at (row0, col0) of the full_h x full_w image that covers what the render reads.
struct SampleSource {
  const std::uint8_t* pixels = nullptr;
  std::int64_t height = 0, width = 0, channels = 0;
  std::int64_t row0 = 0, col0 = 0;
  std::int64_t full_h = 0, full_w = 0;  ///< 0: the image is whole (height x width)
};
/// The box [y0, y0 + h) x [x0, x0 + w) of a height x width source image that the render of the sample at `position`
/// reads (its geometry's box: render_sample reads nothing else).
struct SourceBox {
  std::int64_t y0 = 0, x0 = 0, h = 0, w = 0;
};
using SampleRegion = std::function<SourceBox(std::int64_t height, std::int64_t width, std::int64_t position)>;
/// Renders one sample into its slot of the batch (out_h x out_w x channels) on a loader thread. `position` is its
/// position in the loader's `order` (the caller maps it to the sample's Philox key). Must be thread-safe.
using SampleRender = std::function<void(const SampleSource& src, std::int64_t position, std::uint8_t* out)>;

struct LoaderOptions {
  LoaderPool* pool = nullptr;          ///< where samples are decoded and rendered (nullptr: the loader's thread)
  std::int64_t out_h = 0, out_w = 0;   ///< the batch's image size (0: the stored size, raw stores only)
  SampleRender render;                 ///< empty: raw images are delivered as stored (JPEG stores need one)
  /// JPEG stores with a render: decode only the box each render reads (io/image.h decode_image_region; the same
  /// pixels there); empty: the whole image.
  SampleRegion region = {};
  /// JPEG stores only: deliver each batch's JPEG bytes undecoded (Batch::encoded; the GPU decodes them with
  /// nvJPEG): no render, no decoder needed on the host. The loader thread still reads batch k+1 while batch k is used.
  bool encoded = false;
};

/// Runs on the loader thread on each freshly read batch (augmentation). `first_position` is the position in the
/// epoch order of images[0], so a counter-based RNG keyed by (seed, epoch, position) is independent of threads.
using BatchTransform =
    std::function<void(std::uint8_t* images, std::int32_t* labels, std::int64_t count, std::int64_t first_position)>;

/// Caller-owned buffers (e.g. pinned host memory for H2D); each must hold batch_size samples.
struct BatchBuffers {
  std::uint8_t* images[2] = {nullptr, nullptr};
  std::int32_t* labels[2] = {nullptr, nullptr};
};

class BatchLoader {
 public:
  /// `order` lists the sample indices of the epoch in the order to deliver them (the caller shuffles, so the
  /// sequence is deterministic). `file` must outlive the loader. The thread starts reading at once.
  BatchLoader(const DatasetFile& file, Split split, std::int64_t batch_size, std::vector<std::int64_t> order,
              BatchTransform transform = {}, std::optional<BatchBuffers> buffers = std::nullopt,
              LoaderOptions options = {});
  /// Stops the thread after the read in flight (if any) and joins it; safe mid-epoch.
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// The next batch, or nullopt after the last one (a partial last batch is returned, never dropped). Releases
  /// the previous batch's buffer to the loader. An exception raised on the loader thread (read error, transform)
  /// is rethrown here, for the batch it happened in and every call after it.
  std::optional<Batch> next();
  /// LoaderOptions::encoded: swaps the held batch's JPEG bytes, shapes and labels (what the last next() returned in
  /// Batch::encoded) with `into`, so the caller keeps them without copying them, and gives the batch's slot back at
  /// once: the loader reads a later batch into it (into what `into` held) while the caller still works on this one.
  /// Every pointer of the Batch into the loader (encoded, labels, indices) is invalid after the call: copy the
  /// indices first, read the labels from `into`.
  void take_encoded(EncodedBatch& into);

  std::int64_t num_batches() const { return m_num_batches; }
  std::int64_t batch_size() const { return m_batch_size; }

 private:
  void run();
  void fill(int slot, std::int64_t batch);

  const DatasetFile& m_file;
  const Split m_split;
  const std::int64_t m_batch_size;
  const std::vector<std::int64_t> m_order;
  const BatchTransform m_transform;
  const LoaderOptions m_options;
  const std::int64_t m_num_batches;
  std::int64_t m_out_h = 0, m_out_w = 0;
  std::int64_t m_sample_bytes = 0;  ///< of a delivered image
  std::vector<std::uint8_t> m_stored;  ///< raw stores with a render: the batch as stored
  EncodedBatch m_encoded;              ///< JPEG stores: the batch's JPEG bytes
  EncodedBatch m_encoded_slot[2];      ///< LoaderOptions::encoded: per slot, delivered as they are
  std::vector<std::int64_t> m_indices[2];

  std::vector<std::uint8_t> m_own_images[2];
  std::vector<std::int32_t> m_own_labels[2];
  std::uint8_t* m_images[2];
  std::int32_t* m_labels[2];

  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::int64_t m_ready_batch[2] = {-1, -1};  // batch index whose data sits in slot s, -1: slot free
  std::int64_t m_consumed = 0;               // batches handed out by next()
  bool m_holding = false;                    // the caller still holds batch m_consumed - 1
  std::int64_t m_error_batch = -1;           // batch whose read failed
  std::exception_ptr m_error;
  bool m_stop = false;
  std::thread m_thread;
};

}  // namespace renaissance::io
