// libFuzzer target: the checkpoint reader (read_checkpoint and inspect_checkpoint) on the input written to a file.
#include "fuzz_util.h"

#include <renaissance/io/checkpoint.h>

#include <cstdint>
#include <string>

using namespace renaissance;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::hdf5_no_free_lists();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fuzz::input_file(data, size, ".h5");
  fuzz::expect_clean([&] { (void)io::read_checkpoint(path); }, "fuzz_checkpoint");
  fuzz::expect_clean([&] { (void)io::inspect_checkpoint(path); }, "fuzz_checkpoint (inspect)");
  return 0;
}
