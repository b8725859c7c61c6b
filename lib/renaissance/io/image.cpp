#include <renaissance/io/image.h>

#include <renaissance/core/error.h>
#include <renaissance/io/hdf5_util.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <functional>
#include <cstring>
#include <limits>
#include <memory>

#ifdef RENAISSANCE_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif
#ifdef RENAISSANCE_HAVE_JPEG_REGION
#include <cstdio>  // before jpeglib.h, which needs FILE
#include <jpeglib.h>
#include <jerror.h>  // JWRN_JPEG_EOF
#endif
#ifdef RENAISSANCE_HAVE_LIBPNG
#include <png.h>
#endif

namespace renaissance::io {

namespace {

constexpr const char* kNotAnImage = "expected a JPEG or PNG image";

[[noreturn]] [[maybe_unused]] void no_codec(const std::string& name, const char* codec, const char* package) {
  RN_IO_FAIL(name, fmt::format("rebuild with {} installed (Debian/Ubuntu: apt-get install {}); the configure log says "
                               "which image codecs were found",
                               codec, package),
             "this build of Renaissance has no {} decoder", codec);
}

void check_limits(const std::string& name, const char* what, std::int64_t h, std::int64_t w,
                  const DecodeLimits& limits) {
  if (h <= 0 || w <= 0) RN_IO_FAIL(name, "the file is corrupt", "the {} header claims an image of {}x{}", what, w, h);
  if (h > limits.max_pixels / w)
    RN_IO_FAIL(name, "resize it first, or skip it (data import --skip-bad)",
               "the {} image is {}x{} = {} pixels, more than the limit of {} (a decompression bomb, or a scan far "
               "larger than training needs)",
               what, w, h, static_cast<std::uint64_t>(h) * static_cast<std::uint64_t>(w), limits.max_pixels);
}

std::uint8_t clip8(std::int32_t v) {
  constexpr std::int32_t kMax = std::int32_t(1) << 22 << 8;
  if (v >= kMax) return 255;
  if (v <= 0) return 0;
  return static_cast<std::uint8_t>(v >> 22);
}

// ---- JPEG -----------------------------------------------------------------------------------------------------------

#ifdef RENAISSANCE_HAVE_TURBOJPEG
struct TjHandle {
  tjhandle h = nullptr;
  explicit TjHandle(bool compress) : h(compress ? tjInitCompress() : tjInitDecompress()) {
    RN_CHECK(h != nullptr, "libturbojpeg: cannot create a {} handle", compress ? "compression" : "decompression");
  }
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

/// One decompressor per thread (the loader threads decode many images each). After an error it is replaced: a
/// TurboJPEG handle whose header read failed stays in that state and fails every later image with the same message.
TjHandle& decompressor_holder() {
  thread_local TjHandle t(false);
  return t;
}
tjhandle decompressor() { return decompressor_holder().h; }
void reset_decompressor() {
  TjHandle& t = decompressor_holder();
  tjDestroy(t.h);
  t.h = tjInitDecompress();
  RN_CHECK(t.h != nullptr, "libturbojpeg: cannot create a decompression handle");
}

ImageHeader jpeg_header(const std::uint8_t* data, std::size_t size, const std::string& name,
                        const DecodeLimits& limits) {
  if (size > static_cast<std::size_t>(std::numeric_limits<unsigned long>::max()))
    RN_IO_FAIL(name, "", "the file is too large");
  int w = 0, h = 0, subsamp = 0, cs = 0;
  tjhandle t = decompressor();
  if (tjDecompressHeader3(t, data, static_cast<unsigned long>(size), &w, &h, &subsamp, &cs) != 0) {
    const std::string msg = tjGetErrorStr2(t);
    reset_decompressor();
    // A valid file whose chroma sampling factors TurboJPEG has no name for (cjpeg -sample 1x4, 3x1, 4x2, ...):
    // Pillow decodes it; this reader does not.
    if (msg.find("Could not determine subsampling type") != std::string::npos)
      RN_IO_FAIL(name, "re-encode it with a common chroma subsampling (4:4:4, 4:2:2 or 4:2:0)",
                 "cannot read this JPEG: its chroma subsampling is not one libjpeg-turbo's TurboJPEG API supports ({})",
                 msg);
    RN_IO_FAIL(name, "the file is corrupt, truncated or not a JPEG", "cannot read the JPEG header: {}", msg);
  }
  ImageHeader hd;
  hd.format = ImageFormat::jpeg;
  hd.height = h;
  hd.width = w;
  check_limits(name, "JPEG", h, w, limits);
  switch (cs) {
    case TJCS_GRAY: hd.channels = 1; break;
    case TJCS_RGB:
    case TJCS_YCbCr: hd.channels = 3; break;
    case TJCS_CMYK:
    case TJCS_YCCK:
      hd.channels = 4;
      hd.cmyk = true;
      break;
    default: RN_IO_FAIL(name, "convert it to RGB first", "unsupported JPEG colour space {}", cs);
  }
  return hd;
}

/// The pixels of a JPEG (or of a part of it) in `channels`, as Pillow converts them: `decode(buffer, pf)` fills
/// `rows` rows of at most `max_cols` pixels in TurboJPEG pixel format pf (TJPF_CMYK, TJPF_GRAY or TJPF_RGB), packed,
/// and returns how many columns a row has.
Image jpeg_pixels(const ImageHeader& hd, std::int64_t rows, std::int64_t max_cols, int channels,
                  const std::function<std::int64_t(std::uint8_t*, int)>& decode) {
  Image img;
  img.height = rows;
  img.channels = channels;
  if (hd.cmyk) {
    std::vector<std::uint8_t> cmyk(static_cast<std::size_t>(rows * max_cols * 4));
    img.width = decode(cmyk.data(), TJPF_CMYK);
    const std::int64_t pixels = rows * img.width;
    // Pillow reads every CMYK JPEG as Adobe's inverted CMYK ("CMYK;I": C = 255 - stored) and converts with
    // cmyk2rgb: nk = 255 - K; R = nk - C·nk/255 (MULDIV255: t = a·b + 128, ((t >> 8) + t) >> 8).
    std::vector<std::uint8_t> rgb(static_cast<std::size_t>(pixels * 3));
    for (std::int64_t p = 0; p < pixels; ++p) {
      const std::uint8_t* s = cmyk.data() + p * 4;
      const int nk = s[3];  // 255 - (255 - stored K)
      for (int k = 0; k < 3; ++k) {
        const int c = 255 - s[k];
        const int tmp = c * nk + 128;
        const int v = nk - (((tmp >> 8) + tmp) >> 8);
        rgb[static_cast<std::size_t>(p * 3 + k)] = static_cast<std::uint8_t>(std::clamp(v, 0, 255));
      }
    }
    img.pixels.resize(static_cast<std::size_t>(pixels * channels));
    convert_channels(rgb.data(), pixels, 3, img.pixels.data(), channels);
    return img;
  }
  if (channels == 3 || hd.channels == 1) {  // grey to RGB: libjpeg replicates, as Pillow's convert("RGB") does
    img.pixels.resize(static_cast<std::size_t>(rows * max_cols * channels));
    img.width = decode(img.pixels.data(), channels == 1 ? TJPF_GRAY : TJPF_RGB);
    img.pixels.resize(static_cast<std::size_t>(rows * img.width * channels));
    return img;
  }
  // Colour to grey the way Pillow does it (decode to RGB, then L24), not libjpeg's Y channel.
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(rows * max_cols * 3));
  img.width = decode(rgb.data(), TJPF_RGB);
  img.pixels.resize(static_cast<std::size_t>(rows * img.width));
  convert_channels(rgb.data(), rows * img.width, 3, img.pixels.data(), 1);
  return img;
}

#ifdef RENAISSANCE_HAVE_JPEG_REGION
bool jpeg_region_run(const std::uint8_t* data, std::size_t size, J_COLOR_SPACE cs, int comps, JDIMENSION y0,
                     JDIMENSION rows, JDIMENSION* x0, JDIMENSION* cols, std::uint8_t* out, std::uint8_t* last_row,
                     char* error, std::size_t error_size, bool* truncated);
#else
/// libjpeg's warnings (jerror.h's JWRN_ messages), which leave the image complete; anything else is a fatal error.
bool is_libjpeg_warning(const std::string& msg) {
  for (const char* w : {"Corrupt JPEG data", "Warning: ", "Inconsistent progression sequence",
                        "Invalid SOS parameters for sequential JPEG", "Unknown Adobe color transform code",
                        "Application transferred too"})
    if (msg.rfind(w, 0) == 0) return true;
  return false;
}
#endif

Image jpeg_decode(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                  const DecodeLimits& limits) {
  const ImageHeader hd = jpeg_header(data, size, name, limits);
  const int w = static_cast<int>(hd.width), h = static_cast<int>(hd.height);
  // Progressive files: at most 500 scans (libjpeg-turbo's guard against files built to take forever to decode).
  const int flags = TJFLAG_LIMITSCANS;
  return jpeg_pixels(hd, hd.height, hd.width, channels, [&](std::uint8_t* out, int pf) -> std::int64_t {
    tjhandle t = decompressor();
    if (tjDecompress2(t, data, static_cast<unsigned long>(size), out, w, 0, h, pf, flags) == 0) return w;
    const std::string msg = tjGetErrorStr2(t);
    // libjpeg-turbo >= 2 reports warnings as -1 too (the image is complete). Pillow ignores libjpeg's warnings but
    // refuses a file that ends early ("image file is truncated"); so does this reader. TurboJPEG's code stays
    // TJERR_WARNING when a fatal error came after a warning (its warning flag is never cleared): a file with a few
    // stray bytes and then a broken scan was stored black, its error left to a training's cropped decode.
    if (tjGetErrorCode(t) == TJERR_WARNING && msg.find("Premature end of JPEG file") == std::string::npos) {
#ifdef RENAISSANCE_HAVE_JPEG_REGION
      // The libjpeg API, whose error_exit is the fatal error alone, decides (and decodes: the same pixels).
      const J_COLOR_SPACE cs = pf == TJPF_CMYK ? JCS_CMYK : pf == TJPF_GRAY ? JCS_GRAYSCALE : JCS_EXT_RGB;
      const int comps = pf == TJPF_CMYK ? 4 : pf == TJPF_GRAY ? 1 : 3;
      JDIMENSION x0 = 0, cols = static_cast<JDIMENSION>(w);
      char error[JMSG_LENGTH_MAX + 64];
      bool truncated = false;
      std::uint8_t unused[4];
      if (jpeg_region_run(data, size, cs, comps, 0, static_cast<JDIMENSION>(h), &x0, &cols, out, unused, error,
                          sizeof error, &truncated))
        return w;
      reset_decompressor();
      if (truncated)
        RN_IO_FAIL(name, "the file is truncated (an interrupted download or copy?)",
                   "the JPEG data ends before the image is complete ({})", error);
      RN_IO_FAIL(name, "the file is corrupt", "cannot decode the JPEG: {}", error);
#else
      if (is_libjpeg_warning(msg)) return w;
#endif
    }
    reset_decompressor();
    if (msg.find("Premature end") != std::string::npos)
      RN_IO_FAIL(name, "the file is truncated (an interrupted download or copy?)",
                 "the JPEG data ends before the image is complete ({})", msg);
    RN_IO_FAIL(name, "the file is corrupt", "cannot decode the JPEG: {}", msg);
  });
}

#ifdef RENAISSANCE_HAVE_JPEG_REGION
// Partial decoding through libjpeg-turbo's libjpeg API, set up as tjDecompress2 sets it up (its defaults: the
// accurate integer IDCT, fancy upsampling; the output colour space of the TurboJPEG pixel format; at most 500 scans),
// so every pixel it returns is the one the whole decode gives there (tests/io/check_image.py checks this against
// Pillow). The rows above the box are skipped (entropy-decoded, not reconstructed), the columns outside it cropped
// to whole iMCUs (jpeg_crop_scanline), and the rows below it skipped too: the whole file is still read, so a
// truncated or corrupt file fails as it does in decode_image.

struct RegionErrors {
  jpeg_error_mgr mgr;  // first: libjpeg's j_common_ptr->err points here
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void region_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<RegionErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void region_emit_message(j_common_ptr c, int level) {
  auto* e = reinterpret_cast<RegionErrors*>(c->err);
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;  // other warnings pass, as in Pillow
}

void region_limit_scans(j_common_ptr c) {
  if (c->is_decompressor && reinterpret_cast<j_decompress_ptr>(c)->input_scan_number > 500) {
    auto* e = reinterpret_cast<RegionErrors*>(c->err);
    std::snprintf(e->message, sizeof e->message, "progressive JPEG image has more than 500 scans");
    std::longjmp(e->jump, 1);
  }
}

/// Rows [y0, y0 + rows) of the image, columns from *x0 (in: the first wanted; out: the first decoded) for *cols (in:
/// wanted, out: decoded), packed into `out`, in libjpeg colour space `cs` of `comps` components (`last_row`: room for
/// one more row, the image's last, read to reach the end of the file). Returns false with
/// `error` (or `truncated`) set. Everything that touches libjpeg's longjmp lives in this one function, with only
/// trivially destructible locals across setjmp.
bool jpeg_region_run(const std::uint8_t* data, std::size_t size, J_COLOR_SPACE cs, int comps, JDIMENSION y0,
                     JDIMENSION rows, JDIMENSION* x0, JDIMENSION* cols, std::uint8_t* out, std::uint8_t* last_row,
                     char* error, std::size_t error_size, bool* truncated) {
  jpeg_decompress_struct cinfo;
  RegionErrors err;
  jpeg_progress_mgr progress;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = region_error_exit;
  err.mgr.emit_message = region_emit_message;
  err.truncated = false;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::snprintf(error, error_size, "%s", err.message);
    *truncated = err.truncated;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  progress.progress_monitor = region_limit_scans;
  cinfo.progress = &progress;
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = cs;
  jpeg_start_decompress(&cinfo);
  if (*x0 != 0 || *cols != cinfo.output_width) jpeg_crop_scanline(&cinfo, x0, cols);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
  const std::size_t pitch = static_cast<std::size_t>(*cols) * static_cast<std::size_t>(comps);
  for (JDIMENSION r = 0; r < rows; ++r) {
    JSAMPROW row = out + r * pitch;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      std::snprintf(error, error_size, "no scanline %u", static_cast<unsigned>(y0 + r));
      jpeg_destroy_decompress(&cinfo);
      *truncated = err.truncated;
      return false;
    }
  }
  // The rows below: skipped but for the last, which is read, because skipping to the end stops reading the file
  // (libjpeg-turbo then marks the end of the image reached), so a truncated or corrupt tail would pass unnoticed.
  if (cinfo.output_scanline < cinfo.output_height) {
    if (cinfo.output_scanline + 1 < cinfo.output_height)
      jpeg_skip_scanlines(&cinfo, cinfo.output_height - cinfo.output_scanline - 1);
    JSAMPROW row = last_row;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  *truncated = err.truncated;
  if (err.truncated) std::snprintf(error, error_size, "Premature end of JPEG file");
  return !err.truncated;
}

ImageRegion jpeg_decode_region(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                               std::int64_t y0, std::int64_t x0, std::int64_t h, std::int64_t w,
                               const DecodeLimits& limits) {
  const ImageHeader hd = jpeg_header(data, size, name, limits);
  RN_CHECK_CTX(y0 >= 0 && x0 >= 0 && h > 0 && w > 0 && y0 + h <= hd.height && x0 + w <= hd.width, name,
               "the region {}x{} at ({}, {}) is not inside the {}x{} image", w, h, x0, y0, hd.width, hd.height);
  ImageRegion r;
  r.full_h = hd.height;
  r.full_w = hd.width;
  r.row0 = y0;
  r.image = jpeg_pixels(hd, h, hd.width, channels, [&](std::uint8_t* out, int pf) -> std::int64_t {
    const J_COLOR_SPACE cs = pf == TJPF_CMYK ? JCS_CMYK : pf == TJPF_GRAY ? JCS_GRAYSCALE : JCS_EXT_RGB;
    const int comps = pf == TJPF_CMYK ? 4 : pf == TJPF_GRAY ? 1 : 3;
    // One column more on each side than the box: fancy upsampling of subsampled chroma reads the neighbouring chroma
    // sample, which a cropped decode replaces by its own at the crop's edges, so the outermost decoded column on a
    // side that is not the image's edge differs from the whole decode (by up to ~20 levels, 4:2:0) and is dropped.
    const std::int64_t want0 = std::max<std::int64_t>(x0 - 1, 0), want1 = std::min(x0 + w + 1, hd.width);
    auto col0 = static_cast<JDIMENSION>(want0), cols = static_cast<JDIMENSION>(want1 - want0);
    char error[JMSG_LENGTH_MAX + 64];
    bool truncated = false;
    std::vector<std::uint8_t> last_row(static_cast<std::size_t>(hd.width * comps));
    if (!jpeg_region_run(data, size, cs, comps, static_cast<JDIMENSION>(y0), static_cast<JDIMENSION>(h), &col0, &cols,
                         out, last_row.data(), error, sizeof error, &truncated)) {
      if (truncated)
        RN_IO_FAIL(name, "the file is truncated (an interrupted download or copy?)",
                   "the JPEG data ends before the image is complete ({})", error);
      RN_IO_FAIL(name, "the file is corrupt", "cannot decode the JPEG: {}", error);
    }
    const std::int64_t left = col0 > 0 ? 1 : 0;
    const std::int64_t right = static_cast<std::int64_t>(col0) + cols < hd.width ? 1 : 0;
    const std::int64_t kept = static_cast<std::int64_t>(cols) - left - right;
    if (left + right > 0) {  // rows packed again without the dropped columns (in place: each moves to the front)
      const std::size_t pitch = static_cast<std::size_t>(cols) * static_cast<std::size_t>(comps);
      const std::size_t kept_pitch = static_cast<std::size_t>(kept) * static_cast<std::size_t>(comps);
      for (std::int64_t row = 0; row < h; ++row)
        std::memmove(out + static_cast<std::size_t>(row) * kept_pitch,
                     out + static_cast<std::size_t>(row) * pitch + static_cast<std::size_t>(left * comps), kept_pitch);
    }
    r.col0 = static_cast<std::int64_t>(col0) + left;
    return kept;
  });
  return r;
}
#endif  // RENAISSANCE_HAVE_JPEG_REGION
#endif  // RENAISSANCE_HAVE_TURBOJPEG


// ---- PNG ------------------------------------------------------------------------------------------------------------

#ifdef RENAISSANCE_HAVE_LIBPNG
struct PngReader {
  const std::uint8_t* data;
  std::size_t size, at = 0;
  std::string error;
};

void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->size - r->at) {
    r->error = "the file ends before the image is complete";
    png_error(png, "truncated");
  }
  std::memcpy(out, r->data + r->at, n);
  r->at += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  if (r->error.empty()) r->error = msg;
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

/// Decodes (or, with out == nullptr, reads the header of) a PNG. Everything that touches libpng's longjmp lives
/// in this one function, with only trivially destructible locals across setjmp.
ImageHeader png_run(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                    const DecodeLimits& limits, Image* out) {
  // The size first, from the IHDR chunk that must follow the signature: a header-only file (or one whose pixel data
  // is cut short) claiming 20000 x 20000 is refused as too large, before libpng reads anything.
  if (size >= 24 && std::memcmp(data + 12, "IHDR", 4) == 0) {
    auto be32 = [&](std::size_t at) {
      return (std::int64_t(data[at]) << 24) | (std::int64_t(data[at + 1]) << 16) | (std::int64_t(data[at + 2]) << 8) |
             std::int64_t(data[at + 3]);
    };
    check_limits(name, "PNG", be32(20), be32(16), limits);
  }
  PngReader r{data, size, 0, {}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_on_error, png_on_warning);
  RN_CHECK(png != nullptr, "libpng: cannot create a read struct");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    RN_FAIL("libpng: cannot create an info struct");
  }
  png_set_read_fn(png, &r, png_read_mem);
  png_set_chunk_malloc_max(png, 64u << 20);  // no ancillary chunk may make libpng allocate more
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0, interlace = 0;
  png_bytep* volatile rows = nullptr;  // volatile: read after a longjmp
  ImageHeader hd;
  if (setjmp(png_jmpbuf(png))) {
    std::free(const_cast<png_bytep*>(rows));
    png_destroy_read_struct(&png, &info, nullptr);
    RN_IO_FAIL(name, r.error.find("ends before") != std::string::npos ? "the file is truncated (an interrupted copy?)"
                                                                        : "the file is corrupt",
               "cannot decode the PNG: {}", r.error);
  }
  png_read_info(png, info);
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, nullptr, nullptr);
  hd.format = ImageFormat::png;
  hd.height = h;
  hd.width = w;
  hd.channels = png_get_channels(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) hd.channels = png_get_valid(png, info, PNG_INFO_tRNS) ? 4 : 3;
  const bool too_big = h == 0 || w == 0 || static_cast<std::int64_t>(h) > limits.max_pixels / static_cast<std::int64_t>(w);
  if (too_big || !out) {
    png_destroy_read_struct(&png, &info, nullptr);
    check_limits(name, "PNG", hd.height, hd.width, limits);
    return hd;
  }
  // Everything to 8-bit grey or RGB, alpha dropped (Pillow's convert("L"/"RGB") drops it too).
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);
  png_set_strip_alpha(png);
  const bool grey = color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA;
  if (channels == 3 && grey) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int have = png_get_channels(png, info);
  const std::size_t rowbytes = png_get_rowbytes(png, info);
  if (png_get_bit_depth(png, info) != 8 || (have != 1 && have != 3) || rowbytes != std::size_t(w) * have) {
    png_destroy_read_struct(&png, &info, nullptr);
    RN_IO_FAIL(name, "convert it to 8-bit RGB first", "unsupported PNG layout (bit depth {}, colour type {})", depth,
               color);
  }
  out->height = h;
  out->width = w;
  out->channels = have;
  out->pixels.resize(rowbytes * h);
  rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * h));
  if (!rows) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = out->pixels.data() + rowbytes * y;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  std::free(const_cast<png_bytep*>(rows));
  rows = nullptr;
  png_destroy_read_struct(&png, &info, nullptr);
  return hd;
}

Image png_decode(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                 const DecodeLimits& limits) {
  Image img;
  png_run(data, size, channels, name, limits, &img);
  if (img.channels != channels) {  // colour PNG into a grey store: Pillow's L24
    Image g;
    g.height = img.height;
    g.width = img.width;
    g.channels = channels;
    g.pixels.resize(static_cast<std::size_t>(img.height * img.width * channels));
    convert_channels(img.pixels.data(), img.height * img.width, static_cast<int>(img.channels), g.pixels.data(),
                     channels);
    return g;
  }
  return img;
}
#endif

}  // namespace

bool have_jpeg_codec() {
#ifdef RENAISSANCE_HAVE_TURBOJPEG
  return true;
#else
  return false;
#endif
}

bool have_png_codec() {
#ifdef RENAISSANCE_HAVE_LIBPNG
  return true;
#else
  return false;
#endif
}

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::png: return "PNG";
    default: return "unknown";
  }
}

ImageFormat sniff_image_format(const std::uint8_t* data, std::size_t size) {
  static const std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::jpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::png;
  return ImageFormat::unknown;
}

ImageHeader read_image_header(const std::uint8_t* data, std::size_t size, const std::string& name,
                              const DecodeLimits& limits) {
  switch (sniff_image_format(data, size)) {
    case ImageFormat::jpeg:
#ifdef RENAISSANCE_HAVE_TURBOJPEG
      return jpeg_header(data, size, name, limits);
#else
      no_codec(name, "JPEG (libturbojpeg)", "libturbojpeg0-dev");
#endif
    case ImageFormat::png:
#ifdef RENAISSANCE_HAVE_LIBPNG
      return png_run(data, size, 0, name, limits, nullptr);
#else
      no_codec(name, "PNG (libpng)", "libpng-dev");
#endif
    default:
      RN_IO_FAIL(name, kNotAnImage,
                 size == 0 ? "the file is empty" : "not a JPEG or PNG image (its first bytes are neither signature)");
  }
}

Image decode_image(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                   const DecodeLimits& limits) {
  RN_CHECK_CTX(channels == 1 || channels == 3, name, "decode to {} channels: only 1 (grey) or 3 (RGB)", channels);
  switch (sniff_image_format(data, size)) {
    case ImageFormat::jpeg:
#ifdef RENAISSANCE_HAVE_TURBOJPEG
      return jpeg_decode(data, size, channels, name, limits);
#else
      no_codec(name, "JPEG (libturbojpeg)", "libturbojpeg0-dev");
#endif
    case ImageFormat::png:
#ifdef RENAISSANCE_HAVE_LIBPNG
      return png_decode(data, size, channels, name, limits);
#else
      no_codec(name, "PNG (libpng)", "libpng-dev");
#endif
    default:
      RN_IO_FAIL(name, kNotAnImage,
                 size == 0 ? "the file is empty" : "not a JPEG or PNG image (its first bytes are neither signature)");
  }
}

bool have_region_decode() {
#ifdef RENAISSANCE_HAVE_JPEG_REGION
  return true;
#else
  return false;
#endif
}

ImageRegion decode_image_region(const std::uint8_t* data, std::size_t size, int channels, const std::string& name,
                                std::int64_t y0, std::int64_t x0, std::int64_t h, std::int64_t w,
                                const DecodeLimits& limits) {
#ifdef RENAISSANCE_HAVE_JPEG_REGION
  if (sniff_image_format(data, size) == ImageFormat::jpeg) {
    RN_CHECK_CTX(channels == 1 || channels == 3, name, "decode to {} channels: only 1 (grey) or 3 (RGB)", channels);
    return jpeg_decode_region(data, size, channels, name, y0, x0, h, w, limits);
  }
#else
  (void)y0, (void)x0, (void)h, (void)w;
#endif
  ImageRegion r;
  r.image = decode_image(data, size, channels, name, limits);
  r.full_h = r.image.height;
  r.full_w = r.image.width;
  return r;
}

std::vector<std::uint8_t> encode_jpeg(const std::uint8_t* pixels, std::int64_t height, std::int64_t width, int channels,
                                      int quality, const std::string& name) {
  RN_CHECK_CTX(channels == 1 || channels == 3, name, "JPEG encoding of {} channels: only 1 or 3", channels);
  RN_CHECK_CTX(quality >= 1 && quality <= 100, name, "JPEG quality {} not in 1..100", quality);
  RN_CHECK_CTX(height > 0 && width > 0 && height <= 65500 && width <= 65500, name,
               "a JPEG holds at most 65500x65500 pixels, not {}x{}", width, height);
#ifdef RENAISSANCE_HAVE_TURBOJPEG
  thread_local TjHandle t(true);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(t.h, pixels, static_cast<int>(width), 0, static_cast<int>(height),
                             channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                             channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, TJFLAG_ACCURATEDCT);
  if (rc != 0) {
    const std::string msg = tjGetErrorStr2(t.h);
    tjFree(buf);
    RN_IO_FAIL(name, "", "JPEG encoding failed: {}", msg);
  }
  std::vector<std::uint8_t> out(buf, buf + size);
  tjFree(buf);
  return out;
#else
  (void)pixels;
  no_codec(name, "JPEG (libturbojpeg)", "libturbojpeg0-dev");
#endif
}

// ---- resampling -------------------------------------------------------------------------------------------------------

ResampleTable resample_table(std::int64_t in_size, std::int64_t out_size, std::int64_t first, std::int64_t count) {
  RN_CHECK(in_size > 0 && out_size > 0, "resample from {} to {} pixels", in_size, out_size);
  if (count < 0) count = out_size - first;
  RN_CHECK(first >= 0 && count >= 0 && first + count <= out_size, "resample window [{}, {}) of {} pixels", first,
           first + count, out_size);
  ResampleTable t;
  t.in_size = in_size;
  t.out_size = out_size;
  t.first = first;
  // Pillow, precompute_coeffs() and normalize_coeffs_8bpc() (in0 = 0, in1 = in_size, the bilinear filter).
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.bounds.assign(static_cast<std::size_t>(count * 2), 0);
  t.coeffs.assign(static_cast<std::size_t>(count * t.ksize), 0);
  std::vector<double> k(static_cast<std::size_t>(t.ksize));
  const double ss = 1.0 / filterscale;
  for (std::int64_t xx = first; xx < first + count; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    double ww = 0.0;
    std::int64_t xmin = static_cast<std::int64_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    std::int64_t xmax = static_cast<std::int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    for (std::int64_t x = 0; x < xmax; ++x) {
      double a = (static_cast<double>(x + xmin) - center + 0.5) * ss;
      if (a < 0.0) a = -a;
      const double w = a < 1.0 ? 1.0 - a : 0.0;
      k[static_cast<std::size_t>(x)] = w;
      ww += w;
    }
    for (std::int64_t x = 0; x < xmax; ++x)
      if (ww != 0.0) k[static_cast<std::size_t>(x)] /= ww;
    for (std::int64_t x = 0; x < xmax; ++x) {
      const double v = k[static_cast<std::size_t>(x)];
      t.coeffs[static_cast<std::size_t>((xx - first) * t.ksize + x)] =
          static_cast<std::int32_t>(v < 0 ? -0.5 + v * (1 << 22) : 0.5 + v * (1 << 22));
    }
    t.bounds[static_cast<std::size_t>((xx - first) * 2)] = static_cast<std::int32_t>(xmin);
    t.bounds[static_cast<std::size_t>((xx - first) * 2 + 1)] = static_cast<std::int32_t>(xmax);
  }
  return t;
}

void resample_window(const std::uint8_t* src, std::int64_t src_h, std::int64_t src_w, std::int64_t c, std::int64_t y0,
                     std::int64_t x0, std::int64_t box_h, std::int64_t box_w, std::int64_t virt_h, std::int64_t virt_w,
                     std::int64_t top, std::int64_t left, std::uint8_t* dst, std::int64_t out_h, std::int64_t out_w,
                     std::vector<std::uint8_t>& scratch) {
  RN_CHECK(box_h > 0 && box_w > 0 && y0 >= 0 && x0 >= 0 && y0 + box_h <= src_h && x0 + box_w <= src_w,
           "resize box {}x{} at ({}, {}) outside the {}x{} image", box_w, box_h, x0, y0, src_w, src_h);
  RN_CHECK(out_h > 0 && out_w > 0 && virt_h > 0 && virt_w > 0, "resize to {}x{}, window {}x{}", virt_w, virt_h, out_w,
           out_h);
  const std::int64_t row = src_w * c;
  // The part of the window inside the virtual image: rows [vy0, vy1), columns [vx0, vx1) of it.
  const std::int64_t vy0 = std::max<std::int64_t>(top, 0), vy1 = std::min(top + out_h, virt_h);
  const std::int64_t vx0 = std::max<std::int64_t>(left, 0), vx1 = std::min(left + out_w, virt_w);
  if (vy0 > top || vx0 > left || vy1 < top + out_h || vx1 < left + out_w)
    std::memset(dst, 0, static_cast<std::size_t>(out_h * out_w * c));
  if (vy0 >= vy1 || vx0 >= vx1) return;
  const std::int64_t ncols = vx1 - vx0;
  const bool need_h = virt_w != box_w, need_v = virt_h != box_h;
  auto out_at = [&](std::int64_t vy, std::int64_t vx) { return dst + ((vy - top) * out_w + (vx - left)) * c; };
  if (!need_h && !need_v) {
    for (std::int64_t vy = vy0; vy < vy1; ++vy)
      std::memcpy(out_at(vy, vx0), src + (y0 + vy) * row + (x0 + vx0) * c, static_cast<std::size_t>(ncols * c));
    return;
  }
  // The vertical table first: it decides which box rows the horizontal pass must produce (bounds are monotonic).
  ResampleTable tv;
  std::int64_t first = vy0, last = vy1;  // box rows needed
  if (need_v) {
    tv = resample_table(box_h, virt_h, vy0, vy1 - vy0);  // the window's rows only
    first = tv.bounds[0];
    last = tv.bounds[static_cast<std::size_t>((vy1 - 1 - vy0) * 2)] +
           tv.bounds[static_cast<std::size_t>((vy1 - 1 - vy0) * 2 + 1)];
  }
  // Horizontal pass over box rows [first, last), virtual columns [vx0, vx1): into the temporary, or (no vertical
  // pass) straight into the output. Without one, the vertical pass reads the box's own rows.
  const std::uint8_t* vsrc = nullptr;
  std::int64_t vrow = 0;   // bytes between rows of vsrc
  std::int64_t vbase = 0;  // the box row vsrc starts at
  if (need_h) {
    const ResampleTable th = resample_table(box_w, virt_w, vx0, vx1 - vx0);  // the window's columns only
    if (need_v) scratch.resize(static_cast<std::size_t>((last - first) * ncols * c));
    for (std::int64_t y = first; y < last; ++y) {
      const std::uint8_t* in = src + (y0 + y) * row + x0 * c;
      std::uint8_t* o = need_v ? scratch.data() + (y - first) * ncols * c : out_at(y, vx0);
      for (std::int64_t xx = vx0; xx < vx1; ++xx) {
        const std::int32_t xmin = th.bounds[static_cast<std::size_t>((xx - vx0) * 2)];
        const std::int32_t xmax = th.bounds[static_cast<std::size_t>((xx - vx0) * 2 + 1)];
        const std::int32_t* k = th.coeffs.data() + (xx - vx0) * th.ksize;
        for (std::int64_t ch = 0; ch < c; ++ch) {
          std::int32_t ss = 1 << 21;
          for (std::int32_t x = 0; x < xmax; ++x) ss += static_cast<std::int32_t>(in[(xmin + x) * c + ch]) * k[x];
          o[(xx - vx0) * c + ch] = clip8(ss);
        }
      }
    }
    if (!need_v) return;
    vsrc = scratch.data();
    vrow = ncols * c;
    vbase = first;
  } else {
    vsrc = src + y0 * row + (x0 + vx0) * c;
    vrow = row;
  }
  for (std::int64_t yy = vy0; yy < vy1; ++yy) {
    const std::int32_t ymin = tv.bounds[static_cast<std::size_t>((yy - vy0) * 2)];
    const std::int32_t ymax = tv.bounds[static_cast<std::size_t>((yy - vy0) * 2 + 1)];
    const std::int32_t* k = tv.coeffs.data() + (yy - vy0) * tv.ksize;
    std::uint8_t* o = out_at(yy, vx0);
    for (std::int64_t xc = 0; xc < ncols * c; ++xc) {
      std::int32_t ss = 1 << 21;
      for (std::int32_t y = 0; y < ymax; ++y) ss += static_cast<std::int32_t>(vsrc[(ymin + y - vbase) * vrow + xc]) * k[y];
      o[xc] = clip8(ss);
    }
  }
}

void resize_box(const std::uint8_t* src, std::int64_t src_h, std::int64_t src_w, std::int64_t c, std::int64_t y0,
                std::int64_t x0, std::int64_t box_h, std::int64_t box_w, std::uint8_t* dst, std::int64_t out_h,
                std::int64_t out_w, std::vector<std::uint8_t>& scratch) {
  resample_window(src, src_h, src_w, c, y0, x0, box_h, box_w, out_h, out_w, 0, 0, dst, out_h, out_w, scratch);
}

ResizeCrop resize_short_center_crop(std::int64_t h, std::int64_t w, std::int64_t short_side, std::int64_t crop_h,
                                    std::int64_t crop_w) {
  RN_CHECK(h > 0 && w > 0 && short_side > 0 && crop_h > 0 && crop_w > 0, "resize {}x{} to short side {}, crop {}x{}",
           w, h, short_side, crop_w, crop_h);
  ResizeCrop rc;
  const std::int64_t s = std::min(h, w), l = std::max(h, w);
  // torchvision: new_long = int(size * long / short) (Python: an exact product, a correctly rounded quotient).
  const auto new_long =
      static_cast<std::int64_t>(static_cast<double>(short_side * l) / static_cast<double>(s));
  if (w <= h) {
    rc.resized_w = short_side;
    rc.resized_h = new_long;
  } else {
    rc.resized_h = short_side;
    rc.resized_w = new_long;
  }
  // CenterCrop: int(round((size - crop) / 2.0)) (Python's round is half to even, as nearbyint's default mode); a crop
  // larger than the image first pads it by (crop - size) // 2 before (and the rest after), so the image starts there.
  auto offset = [](std::int64_t size, std::int64_t crop) {
    return size >= crop ? static_cast<std::int64_t>(std::nearbyint(static_cast<double>(size - crop) / 2.0))
                        : -((crop - size) / 2);
  };
  rc.top = offset(rc.resized_h, crop_h);
  rc.left = offset(rc.resized_w, crop_w);
  return rc;
}

void resize_then_crop(const std::uint8_t* src, std::int64_t h, std::int64_t w, std::int64_t c, const ResizeCrop& rc,
                      std::uint8_t* dst, std::int64_t crop_h, std::int64_t crop_w, std::vector<std::uint8_t>& scratch) {
  resample_window(src, h, w, c, 0, 0, h, w, rc.resized_h, rc.resized_w, rc.top, rc.left, dst, crop_h, crop_w, scratch);
}

void convert_channels(const std::uint8_t* src, std::int64_t pixels, int from, std::uint8_t* dst, int to) {
  RN_CHECK((from == 1 || from == 3) && (to == 1 || to == 3), "convert {} to {} channels", from, to);
  if (from == to) {
    std::memmove(dst, src, static_cast<std::size_t>(pixels * from));
  } else if (from == 1) {
    for (std::int64_t p = pixels - 1; p >= 0; --p) {  // backwards: src and dst may be the same buffer
      const std::uint8_t v = src[p];
      dst[p * 3] = dst[p * 3 + 1] = dst[p * 3 + 2] = v;
    }
  } else {
    for (std::int64_t p = 0; p < pixels; ++p) {
      const std::uint8_t* s = src + p * 3;
      dst[p] = static_cast<std::uint8_t>((s[0] * 19595 + s[1] * 38470 + s[2] * 7471 + 0x8000) >> 16);
    }
  }
}

}  // namespace renaissance::io
