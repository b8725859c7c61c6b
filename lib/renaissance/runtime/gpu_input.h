// The device-resident dataset cache (issue 12, `renaissance train --data-cache auto|off|on`, docs/input-pipeline.md):
// a raw store's uint8 images and labels of both splits uploaded once; each step's batch is gathered on the GPU from
// the pass's table (the epoch order's stored indices and each sample's io::SampleGeometry — random-resized or
// centre crop box, pad-crop shift, flip — computed on the host once per pass, keyed by (seed, epoch, position) as
// the host loader keys them), rendered (Pillow's BILINEAR in fixed point where the box is resampled), normalised,
// cast to FP16 (AMP) and channel-padded by kernels/cuda/augment.cu straight into the plan's input buffer I_A / I_B. The
// gathers are CUDA graphs captured at start-up (one per split, slot and batch size; each reads and advances a
// device-resident batch counter), replayed on the transfer stream in place of the TRANSFER graphs' host-to-device copy:
// no host work per step beyond the replay. The result equals the host path (io::render_sample + normalize_images) bit
// for bit. A JPEG store decoded on the GPU (--decode gpu) is cached too: every image decoded once at start-up by
// nvJPEG (gpu_jpeg.h), each kept at its own size, and each batch rendered from them as the batch-by-batch decode
// renders it (the same kernel; MLPerf's ResNet-50 keeps its decoded images in a GPU cache the same way).
#pragma once

#include <renaissance/core/dtype.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/dataset.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace renaissance::io {
class LoaderPool;
}

namespace renaissance::runtime {

class GpuJpegInput;  // gpu_jpeg.h

enum class DataCacheMode {
  automatic,  ///< the cache when the run can use it and the images fit in kDataCacheShare of the device's memory
  off,        ///< the host loader always
  on,         ///< the cache, or an error saying why it cannot be used
};
DataCacheMode parse_data_cache(const std::string& s);  // "auto", "off", "on"; anything else: an error naming it
const char* data_cache_name(DataCacheMode m);

/// The share of the device's total memory the cache may take (and it must also fit in what is free after the
/// plan's arena and workspace, with kDataCacheHeadroom to spare).
inline constexpr double kDataCacheShare = 0.25;
inline constexpr std::int64_t kDataCacheHeadroom = std::int64_t(1) << 30;

/// What the run asks of its input, for the decision below.
struct DataCacheRequest {
  DataCacheMode mode = DataCacheMode::automatic;
  bool gpu = false;          ///< the CUDA backend
  bool raw_store = false;    ///< not a JPEG store
  bool jpeg_on_gpu = false;  ///< a JPEG store that nvJPEG decodes (--decode gpu): cached decoded, else not at all
  bool progressive = false;  ///< progressive resize (--start-resolution): its low-resolution variants
  std::int64_t bytes = 0;    ///< images, labels, pass tables and the resampling scratch
  std::int64_t free_bytes = -1, total_bytes = -1;  ///< the device's, after the arena (-1: unknown)
};
struct DataCacheDecision {
  bool use = false;
  std::string reason;  ///< why not (or, when used, what: "60000 + 10000 images, 54.7 MiB")
};
/// A pure function (tested without a GPU). mode on and not usable: an Error with the reason.
DataCacheDecision decide_data_cache(const DataCacheRequest& r);
/// The current device's free and total bytes (CPU-only builds: -1, -1).
void device_memory_now(std::int64_t* free_bytes, std::int64_t* total_bytes);

/// A raw store's train and val images and labels in host memory (read_host_dataset), indexed by io::Split.
struct HostDataset {
  std::vector<std::uint8_t> images[2];
  std::vector<std::int32_t> labels[2];
};
/// Reads both splits of a raw store whole (on any thread: DatasetFile's reads hold io::hdf5_lock).
HostDataset read_host_dataset(const io::DatasetFile& data);

/// The cache itself (GPU builds; constructing one in a CPU-only build is an error).
class GpuDataCache {
 public:
  /// Reads both splits of `data` (a raw store) and uploads them; labels are checked against [0, num_classes).
  /// `host`: the splits already read (read_host_dataset), uploaded from there.
  GpuDataCache(const io::DatasetFile& data, int num_classes, const HostDataset* host = nullptr);
  /// A JPEG store: reads both splits (on `pool`'s threads) and decodes every image once with `decoder`'s
  /// decode-ahead on `decoders` threads (images nvJPEG cannot decode: on the CPU, counted by the decoder), each kept
  /// at its own size (256-aligned), `decode_batch` images a decode; labels are checked as above. Every gather then
  /// resamples.
  GpuDataCache(const io::DatasetFile& data, int num_classes, GpuJpegInput& decoder, io::LoaderPool* pool, int decoders,
               std::int64_t decode_batch = 256);
  /// The device bytes a JPEG store's decoded images take (both splits, as the constructor above lays them out).
  static std::int64_t jpeg_image_bytes(const io::DatasetFile& data);
  ~GpuDataCache();
  GpuDataCache(const GpuDataCache&) = delete;
  GpuDataCache& operator=(const GpuDataCache&) = delete;

  /// Where a gather writes: the labels (int32 [count]) and the data tensor (NHWC, F32 or F16, `channels` >= C).
  struct Dest {
    std::byte* labels = nullptr;
    std::byte* data = nullptr;
    DType dtype = DType::F32;
    std::int64_t channels = 0;
  };
  /// Captures the gather of `split` into `slot` (0: A, 1: B) for batches of `count` samples out of passes of
  /// `batch`-sample batches, rendered at out_h x out_w (start-up only). `resample`: the general render (boxes
  /// resampled), else whole images shifted and flipped only (out_h x out_w must be the stored size).
  void prepare(io::Split split, int slot, std::int64_t batch, std::int64_t count, const Dest& d, const float* mean,
               const float* stddev, std::int64_t out_h, std::int64_t out_w, bool resample);
  /// The resampling scratch the gathers need for batches of up to `batch` at out_w columns (bytes).
  std::int64_t scratch_bytes(std::int64_t batch, std::int64_t out_w) const { return batch * m_h * out_w * m_c; }
  /// Allocates that scratch for the largest batch and output width of any render to be captured (before the first
  /// prepare() that resamples; prepare() reserves what it needs itself when it is the first).
  void reserve_scratch(std::int64_t batch, std::int64_t out_w);
  /// Starts a pass over `split`: order[p] is the stored index of position p, geometry[p] its geometry (nullptr:
  /// the whole image as stored). Synchronous (waits for the device: the previous pass's gathers are done).
  void begin_pass(io::Split split, const std::vector<std::int64_t>& order,
                  const std::vector<io::SampleGeometry>* geometry);
  /// Replays the captured gather of the pass's next batch on `stream` (a cudaStream_t).
  void launch(io::Split split, int slot, std::int64_t count, void* stream) const;

  std::int64_t bytes() const { return m_bytes; }
  /// Raw stores: the images' size; JPEG stores: the tallest and the widest image's.
  std::int64_t height() const { return m_h; }
  std::int64_t width() const { return m_w; }
  std::int64_t channels() const { return m_c; }
  bool jpeg() const { return m_jpeg; }
  /// Stored sample i's height and width (JPEG stores: each its own).
  std::int64_t sample_height(io::Split s, std::int64_t i) const;
  std::int64_t sample_width(io::Split s, std::int64_t i) const;
  /// Tests: stored sample i's pixels as cached (height x width x channels), downloaded.
  std::vector<std::uint8_t> image(io::Split s, std::int64_t i) const;
  /// The seconds the start-up decode of a JPEG store took (0 for raw stores).
  double decode_seconds() const { return m_decode_s; }

 private:
  struct Split;
  struct Graph;
  Split& split(io::Split s);
  const Split& split(io::Split s) const;
  void allocate_split_tables(Split& sp);
  std::int64_t m_h = 0, m_w = 0, m_c = 0, m_bytes = 0;
  bool m_jpeg = false;
  double m_decode_s = 0;
  std::unique_ptr<Split> m_train, m_val;
  void* m_capture_stream = nullptr;
  std::uint8_t* m_scratch = nullptr;
  std::int64_t m_scratch_bytes = 0;
  int m_max_taps = 0;  ///< the longest filter the captured renders allow
  std::map<std::tuple<int, int, std::int64_t>, std::unique_ptr<Graph>> m_graphs;
};

}  // namespace renaissance::runtime
