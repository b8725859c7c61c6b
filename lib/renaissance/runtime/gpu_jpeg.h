// JPEG stores decoded on the GPU (issue 12, `renaissance train --decode gpu|cpu|auto`, docs/input-pipeline.md):
// each step's JPEG bytes (read by the loader thread, double-buffered) go to nvJPEG's batched decode
// (kernels/cuda/jpeg_decode.h: the hardware JPEG engines where the GPU has them, the default backend otherwise and for
// what the engines refuse), and the decoded images, each of its own size, to the device cache's render
// (kernels/cuda/augment.cu: random-resized or centre crop, Pillow's BILINEAR in fixed point, pad-crop shift, flip,
// normalise, FP16 cast, channel padding) straight into I_A / I_B, on the transfer stream. Training and validation
// passes decode ahead (begin/next/render_current/end): `decoders` threads, each with its own nvJPEG state and stream,
// decode batches k+1.. into a ring of decoders + 2 device buffers while batch k is rendered and trained, so nvJPEG's
// blocking calls are off the trainer's thread. Per step the host computes the batch's io::SampleGeometry (keyed by
// (seed, epoch, position) as the host loader keys them) and makes one host-to-device copy of them with the labels;
// nvJPEG copies the bytes. Images nvJPEG cannot decode (CMYK, a corrupt stream, ...) are decoded on the CPU
// (libjpeg-turbo) and uploaded, counted; a build without libjpeg-turbo stops there with an error naming the sample.
#pragma once

#include <renaissance/core/dtype.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/dataset.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace renaissance::runtime {

enum class DecodeMode {
  automatic,  ///< gpu on the CUDA backend when nvJPEG is in the build, else cpu
  gpu,        ///< nvJPEG (an error when it cannot be used)
  cpu,        ///< libjpeg-turbo on the host loader threads
};
DecodeMode parse_decode(const std::string& s);  // "auto", "gpu", "cpu"; anything else: an error naming it
const char* decode_name(DecodeMode m);
/// True when this build has nvJPEG.
bool nvjpeg_in_build();
/// A warning when the user's CUDA_DEVICE_MAX_CONNECTIONS is below the library's 32 hardware queues (nvJPEG's decode
/// then shares a queue with the step's streams and waits behind them), else empty (cuda::hardware_queues).
std::string hardware_queue_warning();

struct DecodeDecision {
  bool gpu = false;
  std::string reason;  ///< why the CPU decodes (empty when gpu, or for raw stores)
};
/// A pure function (tested without a GPU): JPEG stores on the CUDA backend with nvJPEG in the build decode on the
/// GPU unless --decode cpu; --decode gpu where that is impossible is an Error saying why.
DecodeDecision decide_decode(DecodeMode mode, bool cuda_backend, bool jpeg_store, bool nvjpeg);

/// The device bytes one decoded image takes in a batch (and in the device cache, which keeps nvJPEG's layout):
/// h x w x c rounded up to 256.
inline std::int64_t decoded_image_bytes(std::int64_t h, std::int64_t w, std::int64_t c) {
  return (h * w * c + 255) & ~std::int64_t(255);
}

/// The GPU decode + render of JPEG batches (GPU builds with nvJPEG; constructing one elsewhere is an error).
class GpuJpegInput {
 public:
  /// `channels`: the store's (1 or 3). `path`: the store, for error messages.
  GpuJpegInput(std::int64_t channels, std::string path, bool prefer_hardware = true);
  ~GpuJpegInput();
  GpuJpegInput(const GpuJpegInput&) = delete;
  GpuJpegInput& operator=(const GpuJpegInput&) = delete;

  /// nvJPEG's backends: "hardware, GPU-hybrid for the rest", "GPU-hybrid" or "default".
  const char* backend() const;

  struct Dest {
    std::byte* labels = nullptr;  ///< int32 [count] on the device
    std::byte* data = nullptr;    ///< [count, out_h, out_w, channels] F32 or F16 on the device
    DType dtype = DType::F32;
    std::int64_t channels = 0;  ///< >= the store's (padded with zeros)
    std::int64_t out_h = 0, out_w = 0;
  };
  /// A batch's decoded images on the device: image i at offsets[i] (bytes, 256-aligned), h x w x channels.
  struct Decoded {
    std::uint8_t* images = nullptr;
    std::int64_t bytes = 0;
    std::vector<std::int64_t> offsets;
  };
  /// Decodes batch `b` (split `split`, stored indices `indices`, for error messages) and renders sample i with
  /// geometry[i] into d, normalised with mean/stddev as runtime::normalize_images does, on `stream` (a
  /// cudaStream_t). `slot` (0/1): which pinned staging buffer carries the table (the caller alternates; the slot's
  /// previous copy is waited for).
  void decode_render(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices,
                     const std::vector<io::SampleGeometry>& geometry, const Dest& d, const float* mean,
                     const float* stddev, int slot, void* stream);
  /// Decodes batch `b` into the device buffer only (the benchmark's decode-alone figure).
  void decode(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices, void* stream);

  /// Decode-ahead over a pass of `loader` (LoaderOptions::encoded) of `split`: `decoders` threads (>= 1) take its
  /// batches in order (their bytes swapped out, BatchLoader::take_encoded) and decode them, each on its own nvJPEG
  /// state and stream, into a ring of decoders + 2 device buffers. `loader` must outlive end(). Errors (the
  /// loader's, a corrupt image) are rethrown by next() for the batch they belong to.
  void begin(io::BatchLoader& loader, io::Split split, int decoders);
  /// The next batch of the pass (its bytes, labels and indices are the decode-ahead's copies, valid until the next
  /// call), or nullopt after the last. Waits for its decode; releases the previous batch's buffer.
  std::optional<io::Batch> next();
  /// decode_render for the batch next() returned, from its decoded images (the stream waits for their decode).
  void render_current(const std::vector<io::SampleGeometry>& geometry, const Dest& d, const float* mean,
                      const float* stddev, int slot, void* stream);
  /// Copies the decoded images of the batch next() returned, as they lie in its buffer (image i at its 256-aligned
  /// offset, the first at 0: `bytes` must be the buffer's used size), to device memory `dst` on `stream` (the stream
  /// waits for their decode; the buffer is reused once the copy has run). The device cache's start-up decode.
  void copy_current(std::uint8_t* dst, std::int64_t bytes, void* stream);
  /// Stops the pass's threads (after the decodes in flight) and waits for their streams; safe mid-pass, and a no-op
  /// when no pass is active.
  void end() noexcept;
  bool ahead() const;
  /// Where the decode-ahead's time went since begin() (the per-epoch log line).
  struct AheadStats {
    std::int64_t batches = 0;  ///< decoded
    double ring_s = 0;         ///< summed over the decoder threads: waiting for a free buffer of the ring
    double read_s = 0;         ///< ... waiting for the loader's batch and taking it
    double slot_s = 0;         ///< ... waiting for the render of the batch that last used the ring slot
    double decode_s = 0;       ///< ... inside nvJPEG's decode (and the CPU fallbacks)
    double wait_s = 0;         ///< time next() waited for a decode to finish
  };
  AheadStats ahead_stats() const;
  /// Tests: the decoded images of the batch next() returned last (nullptr when there is none).
  const Decoded* current_decoded() const;

  /// Images decoded on the CPU because nvJPEG could not (since construction, every thread), and the first reason.
  std::int64_t cpu_fallbacks() const;
  std::string first_fallback() const;
  std::int64_t hardware_images() const;
  std::int64_t default_images() const;

  /// The decoded images of the last decode() or decode_render() (device memory), and where image i lies (bytes),
  /// for tests.
  const std::uint8_t* decoded() const;
  const std::vector<std::int64_t>& offsets() const;

 private:
  void render(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices,
              const std::vector<io::SampleGeometry>& geometry, const Decoded& dec, const Dest& d, const float* mean,
              const float* stddev, int slot, void* stream);
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  std::int64_t m_c = 0;
  std::string m_path;
  std::uint8_t* m_scratch = nullptr;  // device: the render's horizontal-pass rows
  std::int64_t m_scratch_bytes = 0;
  std::byte* m_table = nullptr;  // device: labels, geometry table, sources
  std::int64_t m_table_bytes = 0;
  std::byte* m_pinned[2] = {nullptr, nullptr};
  std::int64_t m_pinned_bytes[2] = {0, 0};
  void* m_copied[2] = {nullptr, nullptr};  // events: slot s's last table copy
};

/// `renaissance data bench-decode STORE`: decode throughput of a JPEG store on the GPU.
struct JpegBenchOptions {
  std::int64_t batch = 256;
  std::int64_t images = 0;  ///< 0: the whole train split
  std::int64_t size = 224;  ///< the rendered size (square)
  io::CropMode crop = io::CropMode::random_resized;
  int loader_threads = 1;  ///< the loader's (reading only)
  bool prefer_hardware = true;
  int passes = 3;  ///< timed passes of each kind (the best is reported); one untimed warm-up first
  int decoders = 1;  ///< the decode-ahead's threads (the training path, --gpu-decoders) for the fourth figure
};
struct JpegBenchResult {
  std::string backend;
  std::int64_t images = 0;
  double encoded_mib = 0;                                     ///< of the images read
  double read_per_s = 0, decode_per_s = 0, render_per_s = 0;  ///< img/s: reading alone, + decode, + render
  double ahead_per_s = 0;  ///< img/s: read + decode + render through the decode-ahead (the training path)
  std::int64_t cpu_fallbacks = 0, hardware_images = 0, default_images = 0;
};
JpegBenchResult bench_jpeg_decode(const io::DatasetFile& data, const JpegBenchOptions& o);

}  // namespace renaissance::runtime
