// The Renaissance dataset file (DESIGN §10, data/README.md): one HDF5 file, groups /train and /val, each with
// `images` uint8 [N,H,W,C] (a raw store: chunked, Fletcher32-checksummed, optionally deflated) or, in a JPEG store,
// the images' JPEG bytes one after the other (`jpeg` uint8, `offsets` int64 [N+1], `shapes` int32 [N,2]), and
// `labels` int32 [N], `checksums` (a CRC-32 per block of samples); root attributes format="renaissance-dataset",
// version, storage, num_classes, mean[C], std[C], class_names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::io {

inline constexpr const char* kDatasetFormat = "renaissance-dataset";
/// Version 3 adds the `storage` attribute and JPEG stores (issue 12); version 2 added /<split>/checksums (a CRC-32
/// per block of samples); versions 1 and 2 stay readable (raw stores).
inline constexpr int kDatasetVersion = 3;
/// The most classes a dataset may have (written or read): 2^20, far beyond any real label set (ImageNet-21k has
/// 21,841), and small enough that a per-class table of a corrupt file's claim stays small.
inline constexpr int kMaxClasses = 1 << 20;

/// How a split holds its images: raw uint8 [N,H,W,C], or each image's JPEG bytes (variable sizes).
enum class Storage { raw, jpeg };
const char* storage_name(Storage s);  // "raw" / "jpeg"

enum class Split { train, val };
const char* split_name(Split s);          // "train" / "val"
Split parse_split(const std::string& s);  // throws on anything else
inline constexpr Split kAllSplits[] = {Split::train, Split::val};

/// Storage of one split as found in the file.
struct SplitInfo {
  std::int64_t count = 0;  // N
  Storage storage = Storage::raw;
  /// Raw stores: every image's size. JPEG stores: height = width = 0 (images differ; see min_/max_ below), channels
  /// = what every image decodes to.
  std::int64_t height = 0, width = 0, channels = 0;
  std::int64_t min_height = 0, min_width = 0, max_height = 0, max_width = 0;  ///< JPEG stores: over the split
  std::int64_t encoded_bytes = 0;                                             ///< JPEG stores: of all the split's JPEGs
  std::int64_t chunk_samples = 0;  // images chunk extent along N (0: not chunked)
  int deflate_level = 0;           // 0: no deflate filter
  bool fletcher32 = false;
  std::int64_t sample_bytes() const { return height * width * channels; }  // 0 for a JPEG store
};

/// A JPEG store's parameters (recorded as attributes; `quality` and `max_side` describe the import).
struct JpegStoreSpec {
  std::int64_t channels = 3;  ///< what every stored JPEG decodes to: 1 (grey) or 3 (RGB)
  int quality = 90;           ///< of the images the import re-encoded
  std::int64_t max_side = 0;  ///< images larger than this were resized and re-encoded (0: never)
};

/// A batch of a JPEG store's samples as stored: sample i's bytes are bytes[offsets[i], offsets[i+1]), it decodes to
/// heights[i] x widths[i] x channels.
struct EncodedBatch {
  std::vector<std::uint8_t> bytes;
  std::vector<std::int64_t> offsets;  ///< count + 1 entries
  std::vector<std::int32_t> heights, widths, labels;
  std::int64_t count() const { return static_cast<std::int64_t>(labels.size()); }
  const std::uint8_t* data(std::int64_t i) const { return bytes.data() + offsets[static_cast<std::size_t>(i)]; }
  std::int64_t size(std::int64_t i) const {
    return offsets[static_cast<std::size_t>(i) + 1] - offsets[static_cast<std::size_t>(i)];
  }
};

/// Per-channel sums of an image's pixels (exact integers: the train split's mean and std do not depend on the order
/// or the thread that summed them).
struct PixelSums {
  std::vector<std::uint64_t> sum, sumsq;
  std::uint64_t pixels = 0;
};
/// Sums `pixels` (pixels x channels interleaved uint8).
PixelSums pixel_sums(const std::uint8_t* data, std::int64_t pixels, std::int64_t channels);

struct DatasetWriterOptions {
  /// Samples per images chunk; 0 picks ~1 MiB chunks (at most 256 samples), small enough that a
  /// shuffled batch does not decompress far more than it reads.
  std::int64_t chunk_samples = 0;
  int deflate_level = 1;  // 0 = off, 1..9 (1-4 recommended: decompression speed matters more than size)
};

/// Streams samples into a new dataset file. Writes go to "<path>.tmp-<pid>" in the same directory, renamed to
/// `path` by finish(); an exception or a destructor without finish() removes the temporary, so an interrupted
/// import never leaves a broken file behind. mean/std are computed over the train split as it streams by.
class DatasetWriter {
 public:
  DatasetWriter(std::string path, std::int64_t height, std::int64_t width, std::int64_t channels, int num_classes,
                DatasetWriterOptions options = {});
  /// A JPEG store (append_encoded). options.deflate_level applies to the labels only (JPEG bytes do not deflate).
  DatasetWriter(std::string path, const JpegStoreSpec& jpeg, int num_classes, DatasetWriterOptions options = {});
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  void set_class_names(std::vector<std::string> names);  // must have num_classes entries
  /// Appends `count` samples (images [count,H,W,C], labels [count]); labels must lie in [0, num_classes).
  void append(Split split, const std::uint8_t* images, const std::int32_t* labels, std::int64_t count);
  /// JPEG stores: one sample, its JPEG `bytes` and what they decode to (height x width x channels: `pixels`, which
  /// the train split's mean and std are computed from; the writer does not decode).
  void append_encoded(Split split, const std::uint8_t* bytes, std::int64_t size, std::int64_t height, std::int64_t width,
                      std::int32_t label, const std::uint8_t* pixels);
  /// The same with the train statistics of the sample already summed (pixel_sums, e.g. on an importer's worker
  /// thread; empty: none, as for `pixels` == nullptr): the writer adds them, exactly as it would have summed
  /// `pixels` itself.
  void append_encoded(Split split, const std::uint8_t* bytes, std::int64_t size, std::int64_t height, std::int64_t width,
                      std::int32_t label, const PixelSums& sums);
  std::int64_t count(Split split) const;
  /// Writes the attributes, closes and renames the file into place. The train split must not be empty.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

/// A validated, read-only dataset file. Opening checks format, version, groups, dtypes, ranks and shapes and
/// throws an Error naming the file (and dataset) on anything wrong. Reads are const and may run from several
/// threads (the HDF5 library serialises them).
class DatasetFile {
 public:
  /// `cache_budget` bytes (per split) of decompressed chunks kept in memory; a split that fits is cached whole,
  /// which makes shuffled epochs after the first a memcpy. -1: env RENAISSANCE_DATASET_CACHE_MB, else 1 GiB.
  explicit DatasetFile(const std::string& path, std::int64_t cache_budget = -1);
  ~DatasetFile();
  DatasetFile(DatasetFile&&) noexcept;
  DatasetFile& operator=(DatasetFile&&) noexcept;

  const std::string& path() const;
  int version() const;
  int num_classes() const;
  const std::vector<float>& mean() const;               // per channel, [0,1] pixel units, train split
  const std::vector<float>& stddev() const;             // per channel, [0,1] pixel units
  const std::vector<std::string>& class_names() const;  // empty when the file has none
  const SplitInfo& info(Split split) const;
  std::int64_t size(Split split) const { return info(split).count; }
  Storage storage() const;
  std::int64_t channels() const;      // C, the same for both splits
  std::int64_t sample_bytes() const;  // H*W*C, the same for both splits (0 for a JPEG store)
  /// JPEG stores: the recorded import parameters (channels, quality, max_side).
  const JpegStoreSpec& jpeg_spec() const;
  /// JPEG stores: (height, width) of every sample of the split, 2 ints a sample, in stored order (held in memory
  /// since opening: no read); raw stores: empty.
  const std::vector<std::int32_t>& jpeg_shapes(Split split) const;

  /// Reads samples [start, start+count) with one hyperslab, so a rank can read just its shard.
  /// Either output pointer may be null to skip that part. Raw stores (labels alone: any store).
  void read(Split split, std::int64_t start, std::int64_t count, std::uint8_t* images, std::int32_t* labels) const;
  /// Reads the samples idx[0..n) into positions 0..n of the outputs (shuffled batches). Reads are grouped into
  /// runs of consecutive indices in file order (chunk locality), results land in the requested order.
  void read_indices(Split split, const std::vector<std::int64_t>& idx, std::uint8_t* images,
                    std::int32_t* labels) const;
  /// JPEG stores: the samples idx[0..n) as stored (in the requested order), through verified blocks as read().
  void read_encoded(Split split, const std::vector<std::int64_t>& idx, EncodedBatch& out) const;

  /// Throws naming the first index whose label is < 0 or >= num_classes.
  void validate_labels(Split split) const;
  void validate_labels() const;  // both splits
  /// Reads every image chunk of the split (so every Fletcher32 checksum is verified) and validates the labels;
  /// throws naming the first bad chunk. Costs one pass over the data.
  void verify(Split split) const;
  /// Counts per class; labels out of range are not counted (validate_labels reports them).
  std::vector<std::int64_t> label_histogram(Split split) const;
  /// A hash of the file's content, for ranks to compare at start (issue 13): format 2, of every block's content
  /// checksum (so of every sample) and the attributes, without reading the images; format 1, of the attributes,
  /// every label and the first and last block of images of each split.
  std::uint64_t content_fingerprint() const;

 public:
  struct Impl;  ///< (public so the file's own helpers can name it)

 private:
  std::unique_ptr<Impl> m_impl;
};

}  // namespace renaissance::io
