// Image files and pixels on the CPU (issue 12): JPEG/PNG decoding as Pillow's Image.open(...).convert() does it,
// JPEG encoding, and the resampling of the input pipeline, specified exactly so that another implementation (the
// GPU's) can match it bit for bit. Codecs are optional at build time (CMake: RENAISSANCE_JPEG / RENAISSANCE_PNG);
// without one, the functions that need it throw an Error saying so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::io {

/// Whether this build can decode and encode JPEG (libturbojpeg) and decode PNG (libpng).
bool have_jpeg_codec();
bool have_png_codec();

enum class ImageFormat { unknown, jpeg, png };
const char* image_format_name(ImageFormat f);
/// By the first bytes (JPEG: FF D8 FF; PNG: the 8-byte signature), not by the file name.
ImageFormat sniff_image_format(const std::uint8_t* data, std::size_t size);

/// What an image file's header says, read without decoding the pixels.
struct ImageHeader {
  ImageFormat format = ImageFormat::unknown;
  std::int64_t height = 0, width = 0;
  int channels = 0;   ///< as stored: 1 grey, 2 grey + alpha, 3 colour, 4 RGBA (PNG) or CMYK (JPEG)
  bool cmyk = false;  ///< a JPEG in CMYK or YCCK
};

/// Bounds checked on the header, before any pixel memory is allocated.
struct DecodeLimits {
  /// Pillow raises DecompressionBombError above twice its MAX_IMAGE_PIXELS (89,478,485): the same threshold.
  std::int64_t max_pixels = 178956970;
};

/// Reads the header; throws an Error naming `name` when the bytes are not a JPEG or PNG this build can read, or
/// the header is malformed, or the image is larger than `limits` allow.
ImageHeader read_image_header(const std::uint8_t* data, std::size_t size, const std::string& name,
                              const DecodeLimits& limits = {});

/// Pixels, HWC, row-major, uint8.
struct Image {
  std::int64_t height = 0, width = 0, channels = 0;
  std::vector<std::uint8_t> pixels;
};

/// Decodes a JPEG or PNG file's bytes to `channels` channels (1: grey, 3: RGB), as Pillow 9's
/// `Image.open(f).convert("L" / "RGB")` does: JPEG through libjpeg-turbo with its defaults (accurate integer IDCT,
/// fancy upsampling; the library Pillow links on Debian, so the pixels are identical); CMYK/YCCK JPEGs read with
/// Adobe's inverted convention and converted with Pillow's formula (R = 255 - K' - C'·(255 - K')/255 in its
/// integer form); alpha is dropped (not composited, as convert("RGB") does); palette and low-bit-depth PNGs are
/// expanded; 16-bit PNGs keep their high byte (Pillow does the same for RGB; for 16-bit grey it clips, see
/// data/README.md); RGB to grey is Pillow's L = (19595 R + 38470 G + 7471 B + 2^15) >> 16. EXIF orientation is
/// not applied (nor is it by torchvision's default loader). A truncated file is an error (as in Pillow: "image file
/// is truncated"); libjpeg's other warnings (extraneous bytes before a marker, ...) are not.
Image decode_image(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                   const DecodeLimits& limits = {});

/// A part of an image: rows [row0, row0 + image.height) and columns [col0, col0 + image.width) of the full_h x
/// full_w image, each pixel the one decode_image gives there.
struct ImageRegion {
  Image image;
  std::int64_t row0 = 0, col0 = 0, full_h = 0, full_w = 0;
};
/// Whether decode_image_region decodes JPEGs partially in this build (libjpeg-turbo's libjpeg API found at configure
/// time); otherwise it decodes the whole image.
bool have_region_decode();
/// decode_image of what covers the box [y0, y0 + h) x [x0, x0 + w) (inside the image): a JPEG is decoded partially
/// (libjpeg-turbo: the rows above and below the box are entropy-decoded only, the columns outside it cropped to whole
/// iMCUs, so `col0` may lie left of x0 and the width exceed w), the same pixels as decode_image's there; the whole
/// file is still read, so a truncated or corrupt file fails as in decode_image. A PNG, or a build without partial
/// JPEG decoding: the whole image (row0 = col0 = 0). A random-resized crop reads only its box (io/augment.h), so the
/// loader decodes only that (io/batch_loader.h, LoaderOptions::region).
ImageRegion decode_image_region(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                                std::int64_t y0, std::int64_t x0, std::int64_t h, std::int64_t w,
                                const DecodeLimits& limits = {});

/// JPEG bytes of an HWC uint8 image (1 or 3 channels) at `quality` (1..100): baseline, 4:2:0 chroma subsampling for
/// colour (Pillow's default), the accurate integer DCT.
std::vector<std::uint8_t> encode_jpeg(const std::uint8_t* pixels, std::int64_t height, std::int64_t width, int channels,
                                      int quality, const std::string& name);

// ---- resampling: Pillow's Image.resize(size, Image.BILINEAR) --------------------------------------------------------
//
// The one resampling of the input pipeline (import-time resizes, random-resized-crop, validation resizes), specified
// here so that a CUDA kernel can reproduce it bit for bit. It is Pillow's (Resample.c, 8 bits per channel): a
// separable triangle filter whose support grows with the reduction factor (antialiasing, as torchvision's resize of
// PIL images), fixed-point coefficients, the horizontal pass first, rounded and clipped to uint8 between the passes.
// For one axis of `in_size` source pixels resampled to `out_size` (both > 0):
//
//   scale   = in_size / out_size                      (double)
//   fscale  = max(scale, 1.0)
//   support = 1.0 * fscale                            (the triangle's radius, 1 before scaling)
//   ksize   = 2 * ceil(support) + 1                   (coefficients stored per output pixel)
//   for each output index o:
//     center = (o + 0.5) * scale
//     xmin   = max(int(center - support + 0.5), 0)    (int(): truncation toward zero)
//     xmax   = min(int(center + support + 0.5), in_size) - xmin       (the tap count)
//     w[x]   = tri((x + xmin - center + 0.5) / fscale) for x < xmax, tri(t) = max(0, 1 - |t|)  (double;
//              the division is a multiplication by ss = 1.0 / fscale, as in Pillow)
//     w[x]  /= sum(w)   (when the sum is not 0)
//     k[x]   = int32(w[x] * 2^22 + 0.5)    (w >= 0; Pillow's PRECISION_BITS = 22)
//   out = clip8((2^21 + sum_x src[xmin + x] * k[x]) >> 22)    (int32 arithmetic; clip8: <= 0 -> 0, >= 255 -> 255)
//
// The horizontal pass runs over the source rows the vertical pass needs (from the first output row's xmin to the
// last one's xmin + xmax) into a uint8 temporary; an axis whose size does not change is not resampled (a copy).
// Every double operation above is a single IEEE-754 operation (no fused multiply-add: this file is compiled with
// -ffp-contract=off; a CUDA port must use __dmul_rn/__dadd_rn or take the tables from the host).

/// One axis' coefficient table.
struct ResampleTable {
  std::int64_t in_size = 0, out_size = 0;
  std::int64_t first = 0;  ///< the output index of entry 0 (a table of a window of the output)
  int ksize = 0;
  std::vector<std::int32_t> bounds;  ///< per output index - first: xmin, xmax (first tap, tap count)
  std::vector<std::int32_t> coeffs;  ///< per output index - first: ksize coefficients (22-bit fixed point), unused 0
};
/// The entries of output indices [first, first + count) (count < 0: to out_size); each entry depends on its index
/// alone, so a window's entries equal the whole table's. A window keeps the work to the pixels produced: a centre
/// crop of a 1x5000 image at --val-resize 65535 built a table of 3.3e8 entries per sample.
ResampleTable resample_table(std::int64_t in_size, std::int64_t out_size, std::int64_t first = 0,
                             std::int64_t count = -1);

/// Resamples the box [y0, y0 + box_h) x [x0, x0 + box_w) of `src` (src_h x src_w x c, rows of src_w·c bytes) to
/// out_h x out_w x c, exactly as Pillow's img.crop((x0, y0, x0 + box_w, y0 + box_h)).resize((out_w, out_h),
/// Image.BILINEAR) (the box lies inside the image). `scratch` holds the intermediate rows between calls.
void resize_box(const std::uint8_t* src, std::int64_t src_h, std::int64_t src_w, std::int64_t c, std::int64_t y0,
                std::int64_t x0, std::int64_t box_h, std::int64_t box_w, std::uint8_t* dst, std::int64_t out_h,
                std::int64_t out_w, std::vector<std::uint8_t>& scratch);

/// The general form (random-resized and centre crops, augment.h): the box of `src` resampled to virt_h x virt_w (as
/// resize_box would), of which only the out_h x out_w window at (top, left) is computed and written to `dst`; pixels
/// of the window outside the virtual image are 0. Each output pixel is the one the whole resize would give.
void resample_window(const std::uint8_t* src, std::int64_t src_h, std::int64_t src_w, std::int64_t c, std::int64_t y0,
                     std::int64_t x0, std::int64_t box_h, std::int64_t box_w, std::int64_t virt_h, std::int64_t virt_w,
                     std::int64_t top, std::int64_t left, std::uint8_t* dst, std::int64_t out_h, std::int64_t out_w,
                     std::vector<std::uint8_t>& scratch);

/// torchvision's Resize(size) then CenterCrop(size) on a PIL image: the short side to `short_side` (the long side
/// to int(short_side * long / short), truncated), then the centre `crop_h` x `crop_w` (top = int(round((h' -
/// crop_h) / 2)), Python's round: half to even). Returns the box of the source image and the intermediate size it
/// maps to, so that both steps can run as one resize when the crop lies inside (resize_then_crop does the two steps).
struct ResizeCrop {
  std::int64_t resized_h = 0, resized_w = 0;  ///< after the resize
  std::int64_t top = 0, left = 0;             ///< of the crop in the resized image
};
ResizeCrop resize_short_center_crop(std::int64_t h, std::int64_t w, std::int64_t short_side, std::int64_t crop_h,
                                    std::int64_t crop_w);
/// The two steps of resize_short_center_crop on pixels (the resize whole, then the crop: Pillow's order, so the
/// result equals torchvision's to the bit). A crop larger than the resized image is padded with zeros (as
/// CenterCrop pads).
void resize_then_crop(const std::uint8_t* src, std::int64_t h, std::int64_t w, std::int64_t c, const ResizeCrop& rc,
                      std::uint8_t* dst, std::int64_t crop_h, std::int64_t crop_w, std::vector<std::uint8_t>& scratch);

/// Channel conversions as Pillow's convert(): grey → RGB replicates; RGB → grey is L = (19595 R + 38470 G +
/// 7471 B + 32768) >> 16. `src` has `from` channels (1 or 3), `dst` gets `to` (1 or 3).
void convert_channels(const std::uint8_t* src, std::int64_t pixels, int from, std::uint8_t* dst, int to);

}  // namespace renaissance::io
