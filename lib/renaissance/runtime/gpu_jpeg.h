// JPEG stores decoded on the GPU (issue 12, `renaissance train --decode gpu|cpu|auto`, docs/input-pipeline.md):
// each step's JPEG bytes (read by the loader thread, double-buffered: batch k+1 is read while batch k is decoded and
// trained) go to nvJPEG's batched decode (kernels/cuda/jpeg_decode.h: the hardware JPEG engines where the GPU has
// them, the default backend otherwise and for what the engines refuse), and the decoded images, each of its own
// size, to the device cache's render (kernels/cuda/augment.cu: random-resized or centre crop, Pillow's BILINEAR in
// fixed point, pad-crop shift, flip, normalise, FP16 cast, channel padding) straight into I_A / I_B, on the
// transfer stream. Per step the host computes the batch's io::SampleGeometry (keyed by (seed, epoch, position) as
// the host loader keys them) and makes one host-to-device copy of them with the labels; nvJPEG copies the bytes.
// Images nvJPEG cannot decode (CMYK, a corrupt stream, ...) are decoded on the CPU (libjpeg-turbo) and uploaded,
// counted; a build without libjpeg-turbo stops there with an error naming the sample.
#pragma once

#include <renaissance/core/dtype.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/dataset.h>

#include <cstdint>
#include <memory>
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

struct DecodeDecision {
  bool gpu = false;
  std::string reason;  ///< why the CPU decodes (empty when gpu, or for raw stores)
};
/// A pure function (tested without a GPU): JPEG stores on the CUDA backend with nvJPEG in the build decode on the
/// GPU unless --decode cpu; --decode gpu where that is impossible is an Error saying why.
DecodeDecision decide_decode(DecodeMode mode, bool cuda_backend, bool jpeg_store, bool nvjpeg);

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
  /// Decodes batch `b` (split `split`, stored indices `indices`, for error messages) and renders sample i with
  /// geometry[i] into d, normalised with mean/stddev as runtime::normalize_images does, on `stream` (a
  /// cudaStream_t). `slot` (0/1): which pinned staging buffer carries the table (the caller alternates; the slot's
  /// previous copy is waited for).
  void decode_render(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices,
                     const std::vector<io::SampleGeometry>& geometry, const Dest& d, const float* mean,
                     const float* stddev, int slot, void* stream);
  /// Decodes batch `b` into the device buffer only (the benchmark's decode-alone figure).
  void decode(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices, void* stream);

  /// Images decoded on the CPU because nvJPEG could not (since construction), and the first reason.
  std::int64_t cpu_fallbacks() const { return m_cpu_fallbacks; }
  const std::string& first_fallback() const { return m_first_fallback; }
  std::int64_t hardware_images() const;
  std::int64_t default_images() const;

  /// The decoded images of the last decode (device memory), and where image i lies (bytes), for tests.
  const std::uint8_t* decoded() const { return m_images; }
  const std::vector<std::int64_t>& offsets() const { return m_offsets; }

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  std::int64_t m_c = 0;
  std::string m_path;
  std::uint8_t* m_images = nullptr;  // device: the batch's decoded images
  std::int64_t m_images_bytes = 0;
  std::uint8_t* m_scratch = nullptr;  // device: the render's horizontal-pass rows
  std::int64_t m_scratch_bytes = 0;
  std::byte* m_table = nullptr;  // device: labels, geometry table, sources
  std::int64_t m_table_bytes = 0;
  std::byte* m_pinned[2] = {nullptr, nullptr};
  std::int64_t m_pinned_bytes[2] = {0, 0};
  void* m_copied[2] = {nullptr, nullptr};  // events: slot s's last table copy
  std::vector<std::int64_t> m_offsets;
  std::int64_t m_cpu_fallbacks = 0;
  std::string m_first_fallback;
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
};
struct JpegBenchResult {
  std::string backend;
  std::int64_t images = 0;
  double encoded_mib = 0;                                     ///< of the images read
  double read_per_s = 0, decode_per_s = 0, render_per_s = 0;  ///< img/s: reading alone, + decode, + render
  std::int64_t cpu_fallbacks = 0, hardware_images = 0, default_images = 0;
};
JpegBenchResult bench_jpeg_decode(const io::DatasetFile& data, const JpegBenchOptions& o);

}  // namespace renaissance::runtime
