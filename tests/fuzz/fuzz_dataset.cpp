// libFuzzer target: the HDF5 dataset reader. The input is written to a file and opened as a dataset (every
// validation of DatasetFile's constructor), then a few samples of each split are read by range and by index (JPEG
// stores: their encoded bytes by index), and the labels are validated.
#include "fuzz_util.h"

#include <renaissance/io/dataset.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace renaissance;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::hdf5_no_free_lists();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fuzz::input_file(data, size, ".h5");
  fuzz::expect_clean(
      [&] {
        io::DatasetFile f(path, /*cache_budget=*/1 << 20);
        (void)f.num_classes();
        for (io::Split s : io::kAllSplits) {
          const io::SplitInfo& info = f.info(s);
          if (info.count > 0 && f.storage() == io::Storage::jpeg) {  // JPEG stores (format 3): bytes by index
            io::EncodedBatch b;
            f.read_encoded(s, {info.count - 1, 0, info.count / 2}, b);
            if (info.count <= 4096) f.validate_labels(s);
            continue;
          }
          if (info.count <= 0 || info.sample_bytes() > (1 << 20)) continue;  // our buffers, not the reader's
          const std::int64_t n = info.count < 4 ? info.count : 4;
          std::vector<std::uint8_t> images(static_cast<std::size_t>(n * info.sample_bytes()));
          std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
          f.read(s, 0, n, images.data(), labels.data());
          std::vector<std::int64_t> idx{info.count - 1, 0};
          images.resize(static_cast<std::size_t>(2 * info.sample_bytes()));
          labels.resize(2);
          f.read_indices(s, idx, images.data(), labels.data());
          if (info.count <= 4096) f.validate_labels(s);
        }
      },
      "fuzz_dataset");
  return 0;
}
