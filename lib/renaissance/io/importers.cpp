#include <renaissance/io/importers.h>

#include <renaissance/core/error.h>
#include <renaissance/io/gzip_reader.h>
#include <renaissance/io/hdf5_util.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace renaissance::io {

namespace fs = std::filesystem;

namespace {

constexpr std::uint32_t kIdxImagesMagic = 2051;  // 0x00000803: unsigned byte, 3 dimensions
constexpr std::uint32_t kIdxLabelsMagic = 2049;  // 0x00000801: unsigned byte, 1 dimension
constexpr std::int64_t kBlockSamples = 8192;     // streaming granularity: bounded memory for any input size

/// Sequential reader of an idx file, gzip or uncompressed (GzipReader: a gzip member counts as read to its end only
/// once its CRC-32 and length have matched).
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : m_reader(open(path)) {}

  const std::string& path() const { return m_reader.path(); }
  std::int64_t offset() const { return m_reader.offset(); }

  /// Reads exactly n bytes; a short read is a truncated (or corrupt) file, reported at its byte offset.
  void read_exact(void* dst, std::int64_t n, const char* what) {
    const std::int64_t at = m_reader.offset();
    const std::int64_t got = m_reader.read(dst, n, what);
    if (got < n)
      RN_IO_FAIL(path(), "the file is truncated (interrupted download?); download it again",
                 "truncated at byte offset {} (uncompressed) while reading {}: {} more bytes expected", at + got, what,
                 n - got);
  }

  /// After the last item the header counts: more bytes mean a count damaged downwards (or another file appended),
  /// and importing would drop samples without a word. Reading to the end also verifies the gzip trailer.
  void expect_end(const std::string& items) {
    const std::int64_t at = m_reader.offset();
    unsigned char extra[4096];
    const std::string what = fmt::format("what follows the {}", items);
    std::int64_t more = m_reader.read(extra, sizeof extra, what);
    if (more > 0) {
      // Counted up to 64 MiB more: a gzip bomb behind a valid header is not inflated to its end to say so.
      constexpr std::int64_t kCountLimit = std::int64_t(64) << 20;
      for (std::int64_t k; more < kCountLimit && (k = m_reader.read(extra, sizeof extra, what)) > 0;) more += k;
      RN_IO_FAIL(path(), "the header's count is wrong, or the file was damaged; download it again",
                 "{}{} more byte(s) after the {} the header counts (from byte offset {}, uncompressed)",
                 more >= kCountLimit ? "at least " : "", more, items, at);
    }
  }

  std::uint32_t read_be32(const char* what) {
    unsigned char b[4];
    read_exact(b, 4, what);
    return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
  }

 private:
  static const std::string& open(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec))
      RN_IO_FAIL(path, "check the path (Fashion-MNIST lives in /usr/share/datasets/fashion-mnist)",
                 "idx file not found");
    return path;
  }
  GzipReader m_reader;
};

struct ImagesHeader {
  std::int64_t count = 0, rows = 0, cols = 0;
};

ImagesHeader read_images_header(IdxStream& s) {
  const std::uint32_t magic = s.read_be32("the magic number");
  if (magic != kIdxImagesMagic)
    RN_IO_FAIL(s.path(), "expected an idx3-ubyte images file (e.g. train-images-idx3-ubyte.gz); labels swapped?",
               "bad magic number {} (0x{:08x}), expected {} for idx images", magic, magic, kIdxImagesMagic);
  ImagesHeader h;
  h.count = s.read_be32("the image count");
  h.rows = s.read_be32("the row count");
  h.cols = s.read_be32("the column count");
  if (h.rows <= 0 || h.cols <= 0 || h.rows > 65536 || h.cols > 65536)
    RN_IO_FAIL(s.path(), "the header is corrupt", "implausible image size {}x{}", h.rows, h.cols);
  return h;
}

std::int64_t read_labels_header(IdxStream& s) {
  const std::uint32_t magic = s.read_be32("the magic number");
  if (magic != kIdxLabelsMagic)
    RN_IO_FAIL(s.path(), "expected an idx1-ubyte labels file (e.g. train-labels-idx1-ubyte.gz); images swapped?",
               "bad magic number {} (0x{:08x}), expected {} for idx labels", magic, magic, kIdxLabelsMagic);
  return s.read_be32("the label count");
}

/// `images` has read its header `h` (the train images were opened once: a pipe cannot be read twice).
void import_split(DatasetWriter& writer, Split split, const IdxPair& src, IdxStream& images, const ImagesHeader& h,
                  const ImagesHeader& expect, int num_classes) {
  IdxStream labels(src.labels);
  const std::int64_t n_labels = read_labels_header(labels);
  if (split == Split::train && h.count == 0)
    RN_IO_FAIL(src.images, "the train split needs at least one image", "the header counts 0 images");
  if (h.rows != expect.rows || h.cols != expect.cols)
    RN_IO_FAIL(src.images, "train and val images must have the same size", "images are {}x{}, the train images {}x{}",
               h.rows, h.cols, expect.rows, expect.cols);
  if (n_labels != h.count)
    RN_IO_FAIL(src.labels, "images and labels files do not belong together", "{} labels for {} images (in '{}')",
               n_labels, h.count, src.images);
  const std::int64_t sb = h.rows * h.cols;
  // At most 64 MiB of pixels a block: a 16-byte file whose header claims 8192 images of 30000x30000 allocated 7 TB
  // (std::bad_alloc) before the first read found it truncated.
  const std::int64_t block = std::max<std::int64_t>(1, std::min<std::int64_t>(kBlockSamples, (64 << 20) / sb));
  std::vector<std::uint8_t> img;
  std::vector<std::uint8_t> raw_labels;
  std::vector<std::int32_t> lab;
  for (std::int64_t start = 0; start < h.count; start += block) {
    const std::int64_t n = std::min(block, h.count - start);
    img.resize(static_cast<size_t>(n * sb));
    raw_labels.resize(static_cast<size_t>(n));
    lab.resize(static_cast<size_t>(n));
    images.read_exact(img.data(), n * sb, fmt::format("images [{}, {})", start, start + n).c_str());
    labels.read_exact(raw_labels.data(), n, fmt::format("labels [{}, {})", start, start + n).c_str());
    for (std::int64_t i = 0; i < n; ++i) {
      lab[i] = raw_labels[i];
      if (lab[i] >= num_classes)
        RN_IO_FAIL(src.labels, "pass the right number of classes (--classes)", "label {} at index {} >= num_classes {}",
                   lab[i], start + i, num_classes);
    }
    writer.append(split, img.data(), lab.data(), n);
  }
  images.expect_end(fmt::format("{} images", h.count));
  labels.expect_end(fmt::format("{} labels", n_labels));
}

std::string find_idx_source(const std::string& dir, const std::string& stem) {
  // Prefer the .gz as distributed, accept an already unpacked copy.
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (!fs::exists(gz, ec) && fs::exists(plain, ec)) return plain.string();
  return gz.string();
}

// splitmix64: a counter-based hash, so sample i's content depends on (seed, split, i) only.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  IdxStream s(path);
  const ImagesHeader h = read_images_header(s);
  IdxImages out;
  out.count = h.count;
  out.rows = h.rows;
  out.cols = h.cols;
  out.pixels.resize(static_cast<size_t>(h.count * h.rows * h.cols));
  s.read_exact(out.pixels.data(), static_cast<std::int64_t>(out.pixels.size()), "the pixels");
  s.expect_end(fmt::format("{} images", h.count));
  return out;
}

std::vector<std::int32_t> read_idx_labels(const std::string& path) {
  IdxStream s(path);
  const std::int64_t n = read_labels_header(s);
  std::vector<std::uint8_t> raw(static_cast<size_t>(n));
  s.read_exact(raw.data(), n, "the labels");
  s.expect_end(fmt::format("{} labels", n));
  return std::vector<std::int32_t>(raw.begin(), raw.end());
}

void import_idx(const std::string& out_path, const IdxPair& train, const IdxPair& val, int num_classes,
                const std::vector<std::string>& class_names, const DatasetWriterOptions& options) {
  RN_CHECK_CTX(num_classes >= 1 && num_classes <= 256, out_path, "idx labels are bytes: num_classes {} not in 1..256",
               num_classes);
  IdxStream train_images(train.images);
  const ImagesHeader shape = read_images_header(train_images);
  DatasetWriter writer(out_path, shape.rows, shape.cols, 1, num_classes, options);
  writer.set_class_names(class_names);
  import_split(writer, Split::train, train, train_images, shape, shape, num_classes);
  IdxStream val_images(val.images);
  const ImagesHeader val_shape = read_images_header(val_images);
  import_split(writer, Split::val, val, val_images, val_shape, shape, num_classes);
  writer.finish();
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

FashionMnistSources fashion_mnist_sources(const std::string& src_dir) {
  return {{find_idx_source(src_dir, "train-images-idx3-ubyte"), find_idx_source(src_dir, "train-labels-idx1-ubyte")},
          {find_idx_source(src_dir, "t10k-images-idx3-ubyte"), find_idx_source(src_dir, "t10k-labels-idx1-ubyte")}};
}

void import_fashion_mnist(const std::string& out_path, const std::string& src_dir,
                          const DatasetWriterOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(src_dir, ec))
    RN_IO_FAIL(src_dir,
               "pass --src DIR with train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
               "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (github.com/zalandoresearch/fashion-mnist)",
               "Fashion-MNIST source directory not found");
  const FashionMnistSources src = fashion_mnist_sources(src_dir);
  import_idx(out_path, src.train, src.val, 10, fashion_mnist_class_names(), options);
}

void make_synthetic(const std::string& out_path, std::int64_t n_train, std::int64_t n_val, std::int64_t height,
                    std::int64_t width, std::int64_t channels, int num_classes, std::uint64_t seed,
                    const DatasetWriterOptions& options) {
  RN_CHECK_CTX(n_train > 0 && n_val >= 0, out_path, "need train > 0 and val >= 0 samples, got {} and {}", n_train,
               n_val);
  RN_CHECK_CTX(num_classes >= 1, out_path, "num_classes must be >= 1, got {}", num_classes);
  DatasetWriter writer(out_path, height, width, channels, num_classes, options);
  const std::int64_t sb = height * width * channels;

  constexpr int kTile = 8;
  std::vector<std::uint8_t> templates(static_cast<size_t>(num_classes) * kTile * kTile * channels);
  for (size_t i = 0; i < templates.size(); ++i) templates[i] = static_cast<std::uint8_t>(mix64(seed ^ mix64(i + 1)));

  const std::int64_t block = std::max<std::int64_t>(1, std::min<std::int64_t>(kBlockSamples, (64 << 20) / sb));
  std::vector<std::uint8_t> img;
  std::vector<std::int32_t> lab;
  for (Split split : kAllSplits) {
    const std::int64_t n = split == Split::train ? n_train : n_val;
    const std::uint64_t salt = mix64(seed + (split == Split::train ? 0x7261696eULL : 0x76616cULL));
    for (std::int64_t start = 0; start < n; start += block) {
      const std::int64_t count = std::min(block, n - start);
      img.resize(static_cast<size_t>(count * sb));
      lab.resize(static_cast<size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) {
        std::uint64_t state = mix64(salt ^ mix64(static_cast<std::uint64_t>(start + i)));
        lab[i] = static_cast<std::int32_t>(state % static_cast<std::uint64_t>(num_classes));
        const std::uint8_t* tpl = templates.data() + static_cast<size_t>(lab[i]) * kTile * kTile * channels;
        std::uint8_t* out = img.data() + i * sb;
        std::uint64_t bits = 0;
        for (std::int64_t p = 0; p < sb; ++p) {
          if ((p & 7) == 0) bits = state = mix64(state);
          const std::int64_t c = p % channels, x = (p / channels) % width, y = p / (channels * width);
          const std::uint8_t t = tpl[((y % kTile) * kTile + (x % kTile)) * channels + c];
          out[p] = static_cast<std::uint8_t>((t >> 1) + ((bits >> ((p & 7) * 8)) & 0xff) / 2);
        }
      }
      writer.append(split, img.data(), lab.data(), count);
    }
  }
  writer.finish();
}

}  // namespace renaissance::io
