// libFuzzer target: image decoding (io/image.h): the header limits, our libpng error handling (setjmp/longjmp), the
// TurboJPEG wrapper (warnings, truncation, a handle reset after errors), to 1 and 3 channels, and the partial JPEG
// decoder of decode_image_region (libjpeg's setjmp/longjmp, skipped rows, cropped columns) for a box the input's last
// bytes choose inside the image. Images are bounded to 2^20 pixels so a valid huge image is a quick Error, not a slow
// decode.
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
  if (size >= 4) {
    fuzz::expect_clean(
        [&] {
          const io::ImageHeader h = io::read_image_header(data, size, "fuzz.img", limits);
          const std::uint8_t* k = data + size - 4;  // the box: fractions of the image from the last four bytes
          const std::int64_t y0 = h.height * k[0] / 256, x0 = h.width * k[1] / 256;
          const std::int64_t bh = 1 + (h.height - y0 - 1) * k[2] / 255, bw = 1 + (h.width - x0 - 1) * k[3] / 255;
          for (int channels : {3, 1}) {
            const io::ImageRegion r =
                io::decode_image_region(data, size, channels, "fuzz.img", y0, x0, bh, bw, limits);
            if (r.row0 > y0 || r.col0 > x0 || r.row0 + r.image.height < y0 + bh || r.col0 + r.image.width < x0 + bw)
              __builtin_trap();  // a region that does not cover its box
          }
        },
        "fuzz_image");
  }
  return 0;
}
