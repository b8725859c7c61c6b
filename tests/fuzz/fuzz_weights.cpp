// libFuzzer target: the weights reader (read_weights: format, version, attributes, /params /bn /ema tensors with
// their Fletcher32 checksums) on the input written to a file.
#include "fuzz_util.h"

#include <renaissance/io/weights.h>

#include <cstdint>
#include <string>

using namespace renaissance;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::hdf5_no_free_lists();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fuzz::input_file(data, size, ".h5");
  fuzz::expect_clean([&] { (void)io::read_weights(path); }, "fuzz_weights");
  return 0;
}
