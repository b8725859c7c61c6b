// libFuzzer target: image decoding (io/image.h): the header limits, our libpng error handling (setjmp/longjmp), the
// TurboJPEG wrapper (warnings, truncation, a handle reset after errors), to 1 and 3 channels. Images are bounded to
// 2^20 pixels so a valid huge image is a quick Error, not a slow decode.
#include "fuzz_util.h"

#include <renaissance/io/image.h>

#include <cstdint>

using namespace renaissance;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  io::DecodeLimits limits;
  limits.max_pixels = 1 << 20;
  for (int channels : {3, 1})
    fuzz::expect_clean([&] { (void)io::decode_image(data, size, channels, "fuzz.img", limits); }, "fuzz_image");
  fuzz::expect_clean([&] { (void)io::read_image_header(data, size, "fuzz.img", limits); }, "fuzz_image");
  return 0;
}
