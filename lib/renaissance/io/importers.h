// Importers that produce a Renaissance dataset file: MNIST-format idx pairs (Fashion-MNIST, MNIST, KMNIST...)
// and deterministic synthetic data for benchmarks. All write through DatasetWriter: temp file, then rename.
#pragma once

#include <renaissance/io/dataset.h>

#include <cstdint>
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

/// train-{images-idx3,labels-idx1}-ubyte[.gz] → /train, t10k-* → /val, 10 classes with names.
void import_fashion_mnist(const std::string& out_path, const std::string& src_dir = kFashionMnistDir,
                          const DatasetWriterOptions& options = {});

/// Deterministic random images and labels (same seed, same file contents). Each class has its own tiled 8x8
/// pattern under the noise, so a model can learn something and a smoke-test loss goes down.
void make_synthetic(const std::string& out_path, std::int64_t n_train, std::int64_t n_val, std::int64_t height,
                    std::int64_t width, std::int64_t channels, int num_classes, std::uint64_t seed,
                    const DatasetWriterOptions& options = {0, 0});

}  // namespace renaissance::io
