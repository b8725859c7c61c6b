// The Renaissance dataset file (DESIGN §10): one HDF5 file, groups /train and /val, each with
// `images` uint8 [N,H,W,C] (chunked, Fletcher32-checksummed, optionally deflated) and `labels` int32 [N];
// root attributes format="renaissance-dataset", version=1, num_classes, mean[C], std[C], class_names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::io {

inline constexpr const char* kDatasetFormat = "renaissance-dataset";
/// Version 2 adds /<split>/checksums (a CRC-32 per block of samples, data/README.md); version 1 stays readable.
inline constexpr int kDatasetVersion = 2;

enum class Split { train, val };
const char* split_name(Split s);          // "train" / "val"
Split parse_split(const std::string& s);  // throws on anything else
inline constexpr Split kAllSplits[] = {Split::train, Split::val};

/// Storage of one split as found in the file.
struct SplitInfo {
  std::int64_t count = 0;  // N
  std::int64_t height = 0, width = 0, channels = 0;
  std::int64_t chunk_samples = 0;  // images chunk extent along N (0: not chunked)
  int deflate_level = 0;           // 0: no deflate filter
  bool fletcher32 = false;
  std::int64_t sample_bytes() const { return height * width * channels; }
};

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
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  void set_class_names(std::vector<std::string> names);  // must have num_classes entries
  /// Appends `count` samples (images [count,H,W,C], labels [count]); labels must lie in [0, num_classes).
  void append(Split split, const std::uint8_t* images, const std::int32_t* labels, std::int64_t count);
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
  std::int64_t sample_bytes() const;  // H*W*C, the same for both splits

  /// Reads samples [start, start+count) with one hyperslab, so a rank can read just its shard.
  /// Either output pointer may be null to skip that part.
  void read(Split split, std::int64_t start, std::int64_t count, std::uint8_t* images, std::int32_t* labels) const;
  /// Reads the samples idx[0..n) into positions 0..n of the outputs (shuffled batches). Reads are grouped into
  /// runs of consecutive indices in file order (chunk locality), results land in the requested order.
  void read_indices(Split split, const std::vector<std::int64_t>& idx, std::uint8_t* images,
                    std::int32_t* labels) const;

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
