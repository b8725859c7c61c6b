// Importers that produce a Renaissance dataset file: MNIST-format idx pairs (Fashion-MNIST, MNIST, KMNIST...),
// ImageFolder trees of JPEG/PNG files, the CIFAR-10/100 python tarballs, and deterministic synthetic data for
// benchmarks. All write through DatasetWriter: temp file, then rename.
#pragma once

#include <renaissance/io/dataset.h>
#include <renaissance/io/image.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace renaissance::io {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// An idx3-ubyte images file (magic 2051) fully in memory; gzip or uncompressed.
struct IdxImages {
  std::int64_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // [count, rows, cols]
};
IdxImages read_idx_images(const std::string& path);
/// An idx1-ubyte labels file (magic 2049); gzip or uncompressed.
std::vector<std::int32_t> read_idx_labels(const std::string& path);

/// One split's source files.
struct IdxPair {
  std::string images, labels;
};

/// Streams train → /train and val → /val into `out_path` (1 channel). Validates magic numbers, dimensions,
/// matching counts, labels < num_classes; a truncated input names the file and the byte offset.
void import_idx(const std::string& out_path, const IdxPair& train, const IdxPair& val, int num_classes,
                const std::vector<std::string>& class_names = {}, const DatasetWriterOptions& options = {});

/// The ten Fashion-MNIST class names, in label order.
const std::vector<std::string>& fashion_mnist_class_names();

/// The four Fashion-MNIST files `import_fashion_mnist` reads from `src_dir`: each name's .gz as distributed, else an
/// already unpacked copy without the .gz.
struct FashionMnistSources {
  IdxPair train, val;
};
FashionMnistSources fashion_mnist_sources(const std::string& src_dir);

/// train-{images-idx3,labels-idx1}-ubyte[.gz] → /train, t10k-* → /val, 10 classes with names.
void import_fashion_mnist(const std::string& out_path, const std::string& src_dir = kFashionMnistDir,
                          const DatasetWriterOptions& options = {});

/// Deterministic random images and labels (same seed, same file contents). Each class has its own tiled 8x8
/// pattern under the noise, so a model can learn something and a smoke-test loss goes down.
void make_synthetic(const std::string& out_path, std::int64_t n_train, std::int64_t n_val, std::int64_t height,
                    std::int64_t width, std::int64_t channels, int num_classes, std::uint64_t seed,
                    const DatasetWriterOptions& options = {0, 0});

// ---- ImageFolder (issue 12) ------------------------------------------------------------------------------------------

/// Progress of an import: `done` of `total` samples of `split` written.
struct ImportProgress {
  Split split = Split::train;
  std::int64_t done = 0, total = 0;
};

struct FolderImportOptions {
  Storage storage = Storage::jpeg;  ///< --store: jpeg (encoded bytes) or raw (decoded, resized, centre-cropped)
  std::int64_t size = 0;            ///< raw: the short side is resized to this, then the centre size x size is kept
  std::int64_t max_side = 0;        ///< jpeg: an image whose longer side exceeds this is resized and re-encoded (0: never)
  int quality = 90;                 ///< jpeg: quality of the images that are (re-)encoded
  int channels = 3;                 ///< 3: RGB (torchvision's loader), 1: grey
  int threads = 0;                  ///< decoding threads; 0: available_cpus()
  bool skip_bad = false;            ///< unreadable images are skipped and counted instead of failing the import
  DecodeLimits limits;
  DatasetWriterOptions writer;
  std::function<void(const ImportProgress&)> progress;  ///< called from the writing thread, in order
};

struct FolderImportSummary {
  std::int64_t samples[2] = {0, 0};  ///< written per split
  std::vector<std::string> classes;
  std::int64_t bad = 0;                      ///< images skipped as unreadable (--skip-bad)
  std::vector<std::string> bad_examples;     ///< the first few, "file: reason"
  std::int64_t other_files = 0;              ///< files skipped because their name does not end in .jpg/.jpeg/.png
  std::int64_t kept = 0, reencoded = 0;      ///< jpeg stores: JPEGs stored as they are / decoded and encoded again
  std::int64_t stored_bytes = 0;             ///< jpeg stores: JPEG bytes written
  bool has_val = false;                      ///< DIR/val existed
};

/// torchvision's ImageFolder layout: DIR/train/<class>/**/*.{jpg,jpeg,png} (case-insensitive, subfolders walked,
/// files in (folder, name) order) and optionally DIR/val/<class>/...; classes are train's subfolders sorted by name
/// (label = rank), class names recorded. Errors name the file or folder: an unreadable image (corrupt, truncated,
/// not an image, larger than limits.max_pixels) unless skip_bad; a class folder without images; a val class that
/// train does not have; a missing DIR/train. Images are decoded on `threads` threads and written in order, so the file
/// does not depend on the thread count.
FolderImportSummary import_folder(const std::string& out_path, const std::string& dir,
                                  const FolderImportOptions& options);

// ---- CIFAR (issue 12) ---------------------------------------------------------------------------------------------------

/// cifar-10-python.tar.gz (data_batch_1..5 → /train, test_batch → /val, batches.meta's label_names) or
/// cifar-100-python.tar.gz (train, test, meta; fine labels, or coarse with coarse_labels): the python pickles (the
/// original Python 2 ones, or protocol 2-5 pickles of the same dicts from Python 3) read by our own bounded
/// unpickler, never by executing anything. Rows of 3072 bytes (1024 R, 1024 G, 1024 B) become 32x32x3 HWC.
void import_cifar(const std::string& out_path, const std::string& tarball, int classes, bool coarse_labels = false,
                  const DatasetWriterOptions& options = {});

/// One batch member of a CIFAR tarball, as import_cifar reads it.
struct CifarBatch {
  std::vector<std::uint8_t> hwc;  ///< N x 32 x 32 x 3
  std::vector<std::int32_t> labels;
};

/// One batch member's pickle (`ctx` names it in errors): the dict's 'data' (a 2-D uint8 numpy array of rows of 3072
/// bytes) and `label_key`'s list of labels in [0, classes). Exposed for the fuzzer (fuzz_pickle).
CifarBatch read_cifar_batch(const std::uint8_t* data, std::size_t size, const std::string& ctx, const char* label_key,
                            int classes);

/// The members of a tar file (gzip or plain) whose base names are in `wanted`, read into memory as tar would
/// extract them (GNU long names and pax path/size records applied; two members of a wanted name, or a wanted name
/// that is not a regular file, refused); the gzip stream is read to its end, so its CRC-32 is checked. What
/// import_cifar reads the tarball with; exposed for the fuzzer (fuzz_tar).
std::map<std::string, std::vector<std::uint8_t>> read_tar_members(const std::string& path,
                                                                  const std::vector<std::string>& wanted);

}  // namespace renaissance::io
