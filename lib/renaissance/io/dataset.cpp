#include <renaissance/io/dataset.h>

#include <renaissance/core/paths.h>
#include <renaissance/core/utf8.h>
#include <renaissance/io/hdf5_util.h>

#include <zlib.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <list>
#include <map>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include <unistd.h>

namespace renaissance::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRecreateHint =
    "re-create the file with `renaissance data import ...` or `renaissance data synthetic`";

std::string ds_ctx(const std::string& path, Split s, const char* name) {
  return fmt::format("{}: dataset '/{}/{}'", path, split_name(s), name);
}

H5Handle own(hid_t id, H5Handle::CloseFn close) { return H5Handle(id, close); }

std::string describe_type(hid_t t) {
  const H5T_class_t cls = H5Tget_class(t);
  const size_t bits = H5Tget_size(t) * 8;
  switch (cls) {
    case H5T_INTEGER: return fmt::format("{}int{}", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_FLOAT: return fmt::format("float{}", bits);
    case H5T_STRING: return "string";
    default: return fmt::format("HDF5 type class {}", static_cast<int>(cls));
  }
}

// ---- attributes ----------------------------------------------------------------------------------------------

H5Handle vlen_string_type() {
  H5Handle t(H5_CHECK(H5Tcopy(H5T_C_S1), "HDF5", "copying the string type"), H5Tclose);
  H5_CHECK(H5Tset_size(t, H5T_VARIABLE), "HDF5", "making a variable-length string type");
  H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8), "HDF5", "setting UTF-8");
  return t;
}

/// A fixed-length UTF-8 string type of `size` bytes: stored in the object header (checksummed in format 2), not in
/// a global heap as variable-length strings are (which HDF5 reads without bounds checks).
H5Handle fixed_string_type(std::size_t size) {
  H5Handle t(H5_CHECK(H5Tcopy(H5T_C_S1), "HDF5", "copying the string type"), H5Tclose);
  H5_CHECK(H5Tset_size(t, std::max<std::size_t>(size, 1)), "HDF5", "sizing a string type");
  H5_CHECK(H5Tset_strpad(t, H5T_STR_NULLPAD), "HDF5", "setting the string padding");
  H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8), "HDF5", "setting UTF-8");
  return t;
}

void write_string_attr(hid_t loc, const char* name, const std::string& value, const std::string& ctx) {
  H5Handle type = fixed_string_type(value.size());
  H5Handle space(H5_CHECK(H5Screate(H5S_SCALAR), ctx, "creating a scalar dataspace"), H5Sclose);
  H5Handle attr(
      H5_CHECK(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), ctx, "creating attribute '{}'", name),
      H5Aclose);
  std::string buf = value;
  buf.resize(std::max<std::size_t>(value.size(), 1), '\0');
  H5_CHECK(H5Awrite(attr, type, buf.data()), ctx, "writing attribute '{}'", name);
}

void write_string_array_attr(hid_t loc, const char* name, const std::vector<std::string>& values,
                             const std::string& ctx) {
  std::size_t width = 1;
  for (const auto& v : values) width = std::max(width, v.size());
  H5Handle type = fixed_string_type(width);
  const hsize_t n = values.size();
  H5Handle space(H5_CHECK(H5Screate_simple(1, &n, nullptr), ctx, "creating a dataspace"), H5Sclose);
  H5Handle attr(
      H5_CHECK(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), ctx, "creating attribute '{}'", name),
      H5Aclose);
  std::vector<char> buf(values.size() * width, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) std::memcpy(buf.data() + i * width, values[i].data(), values[i].size());
  H5_CHECK(H5Awrite(attr, type, buf.data()), ctx, "writing attribute '{}'", name);
}

void write_int_attr(hid_t loc, const char* name, int value, const std::string& ctx) {
  H5Handle space(H5_CHECK(H5Screate(H5S_SCALAR), ctx, "creating a scalar dataspace"), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(loc, name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "creating attribute '{}'", name),
                H5Aclose);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT, &value), ctx, "writing attribute '{}'", name);
}

void write_float_array_attr(hid_t loc, const char* name, const std::vector<float>& values, const std::string& ctx) {
  const hsize_t n = values.size();
  H5Handle space(H5_CHECK(H5Screate_simple(1, &n, nullptr), ctx, "creating a dataspace"), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(loc, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "creating attribute '{}'", name),
                H5Aclose);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_FLOAT, values.data()), ctx, "writing attribute '{}'", name);
}

struct OpenAttr {
  H5Handle attr, type, space;
  hssize_t npoints = 0;
};

OpenAttr open_attr(hid_t loc, const char* name, const std::string& ctx, bool required = true) {
  OpenAttr a;
  const htri_t exists = H5_CHECK(H5Aexists(loc, name), ctx, "looking for attribute '{}'", name);
  if (!exists) {
    if (!required) return a;
    RN_IO_FAIL(ctx, std::string("expected a Renaissance dataset; ") + kRecreateHint, "missing root attribute '{}'",
               name);
  }
  a.attr = own(H5_CHECK(H5Aopen(loc, name, H5P_DEFAULT), ctx, "opening attribute '{}'", name), H5Aclose);
  a.type = own(H5_CHECK(H5Aget_type(a.attr), ctx, "reading the type of attribute '{}'", name), H5Tclose);
  a.space = own(H5_CHECK(H5Aget_space(a.attr), ctx, "reading the shape of attribute '{}'", name), H5Sclose);
  a.npoints = H5_CHECK(H5Sget_simple_extent_npoints(a.space), ctx, "reading the size of attribute '{}'", name);
  return a;
}

std::vector<std::string> read_strings(const OpenAttr& a, const char* name, const std::string& ctx) {
  if (H5Tget_class(a.type) != H5T_STRING)
    RN_IO_FAIL(ctx, kRecreateHint, "attribute '{}' has type {}, expected string", name, describe_type(a.type));
  const size_t n = static_cast<size_t>(a.npoints);
  std::vector<std::string> out;
  if (H5_CHECK(H5Tis_variable_str(a.type), ctx, "inspecting attribute '{}'", name) > 0) {
    H5Handle mt = vlen_string_type();
    H5_CHECK(H5Tset_cset(mt, H5Tget_cset(a.type)), ctx, "matching the character set of '{}'", name);
    std::vector<char*> ptrs(n, nullptr);
    H5_CHECK(H5Aread(a.attr, mt, ptrs.data()), ctx, "reading attribute '{}'", name);
    for (char* p : ptrs) out.emplace_back(p ? p : "");
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(mt, a.space, H5P_DEFAULT, ptrs.data());
#else
    H5Dvlen_reclaim(mt, a.space, H5P_DEFAULT, ptrs.data());
#endif
  } else {
    const size_t sz = H5Tget_size(a.type);
    std::vector<char> buf(n * sz + 1, '\0');
    H5_CHECK(H5Aread(a.attr, a.type, buf.data()), ctx, "reading attribute '{}'", name);
    for (size_t i = 0; i < n; ++i) {
      std::string s(buf.data() + i * sz, sz);
      s.erase(std::find(s.begin(), s.end(), '\0'), s.end());  // NULTERM / NULLPAD
      while (!s.empty() && s.back() == ' ') s.pop_back();     // SPACEPAD
      out.push_back(std::move(s));
    }
  }
  return out;
}

long long read_int_attr(hid_t loc, const char* name, const std::string& ctx) {
  OpenAttr a = open_attr(loc, name, ctx);
  if (H5Tget_class(a.type) != H5T_INTEGER || a.npoints != 1)
    RN_IO_FAIL(ctx, kRecreateHint, "attribute '{}' is {} with {} element(s), expected one integer", name,
               describe_type(a.type), a.npoints);
  long long v = 0;
  H5_CHECK(H5Aread(a.attr, H5T_NATIVE_LLONG, &v), ctx, "reading attribute '{}'", name);
  return v;
}

std::vector<float> read_float_array_attr(hid_t loc, const char* name, hssize_t expected, const std::string& ctx) {
  OpenAttr a = open_attr(loc, name, ctx);
  if (H5Tget_class(a.type) != H5T_FLOAT)
    RN_IO_FAIL(ctx, kRecreateHint, "attribute '{}' has type {}, expected float", name, describe_type(a.type));
  if (a.npoints != expected)
    RN_IO_FAIL(ctx, kRecreateHint, "attribute '{}' has {} element(s), expected {} (one per channel)", name, a.npoints,
               expected);
  std::vector<float> v(static_cast<size_t>(expected));
  H5_CHECK(H5Aread(a.attr, H5T_NATIVE_FLOAT, v.data()), ctx, "reading attribute '{}'", name);
  return v;
}

// ---- hyperslab I/O -------------------------------------------------------------------------------------------

/// Selects rows [start, start+count) along dimension 0 of `ds` and reads or writes them from/to `buf`.
void rows_io(bool write, hid_t ds, hid_t mem_type, std::int64_t start, std::int64_t count, void* buf,
             const std::string& ctx, const std::string& what) {
  H5Handle fspace(H5_CHECK(H5Dget_space(ds), ctx, "reading the dataspace"), H5Sclose);
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(fspace), ctx, "reading the rank");
  hsize_t dims[H5S_MAX_RANK], off[H5S_MAX_RANK] = {0};
  H5_CHECK(H5Sget_simple_extent_dims(fspace, dims, nullptr), ctx, "reading the dimensions");
  off[0] = static_cast<hsize_t>(start);
  dims[0] = static_cast<hsize_t>(count);
  H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, off, nullptr, dims, nullptr), ctx, "selecting {}", what);
  H5Handle mspace(H5_CHECK(H5Screate_simple(rank, dims, nullptr), ctx, "creating a memory dataspace"), H5Sclose);
  if (write)
    H5_CHECK(H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, buf), ctx, "writing {}", what);
  else
    H5_CHECK(H5Dread(ds, mem_type, mspace, fspace, H5P_DEFAULT, buf), ctx, "reading {}", what);
}

std::string rows_what(std::int64_t start, std::int64_t count, std::int64_t chunk) {
  if (count == 1)
    return chunk > 0 ? fmt::format("sample {} (chunk {})", start, start / chunk) : fmt::format("sample {}", start);
  if (chunk > 0 && start / chunk == (start + count - 1) / chunk)
    return fmt::format("samples [{}, {}) (chunk {})", start, start + count, start / chunk);
  if (chunk > 0)
    return fmt::format("samples [{}, {}) (chunks {}..{})", start, start + count, start / chunk,
                       (start + count - 1) / chunk);
  return fmt::format("samples [{}, {})", start, start + count);
}

/// The content checksum of a block (format 2): CRC-32 (zlib, as Python's zlib.crc32) of its image bytes, continued
/// over its labels as int32 little-endian.
std::uint32_t content_crc(std::uint32_t crc, const std::uint8_t* p, std::size_t n) {
  return static_cast<std::uint32_t>(crc32_z(crc, p, n));
}
std::uint32_t labels_crc(std::uint32_t crc, const std::vector<std::int32_t>& labels) {
  std::vector<std::uint8_t> le(labels.size() * 4);
  for (std::size_t i = 0; i < labels.size(); ++i)
    for (int b = 0; b < 4; ++b) le[i * 4 + b] = static_cast<std::uint8_t>((static_cast<std::uint32_t>(labels[i]) >> (8 * b)) & 0xff);
  return content_crc(crc, le.data(), le.size());
}

std::int64_t auto_chunk_samples(std::int64_t sample_bytes) {
  const std::int64_t target = 1 << 20;
  return std::clamp<std::int64_t>(target / std::max<std::int64_t>(sample_bytes, 1), 1, 256);
}

}  // namespace

const char* split_name(Split s) { return s == Split::train ? "train" : "val"; }

Split parse_split(const std::string& s) {
  if (s == "train") return Split::train;
  if (s == "val") return Split::val;
  RN_FAIL("unknown split '{}' (known: train, val)", s);
}

// ================================================ DatasetWriter ================================================

const char* storage_name(Storage s) { return s == Storage::jpeg ? "jpeg" : "raw"; }

namespace {
/// The tail of a JPEG store's block checksum (format 3): per sample its byte count, height and width, uint32 LE.
std::uint32_t shapes_crc(std::uint32_t crc, const std::vector<std::uint32_t>& meta) {
  std::vector<std::uint8_t> le(meta.size() * 4);
  for (std::size_t i = 0; i < meta.size(); ++i)
    for (int b = 0; b < 4; ++b) le[i * 4 + b] = static_cast<std::uint8_t>((meta[i] >> (8 * b)) & 0xff);
  return content_crc(crc, le.data(), le.size());
}
constexpr std::int64_t kJpegChunkBytes = 64 << 10;   // chunks of the JPEG bytes: a random read costs ~ one image
constexpr std::int64_t kJpegFlushBytes = 8 << 20;    // bytes gathered before one write
constexpr std::int64_t kMaxJpegBytes = 64 << 20;     // one image's JPEG (a reader refuses a larger claim)
constexpr std::int64_t kMaxJpegSide = 65535;         // JPEG's own limit
constexpr std::int64_t kMaxChunkBytes = 256 << 20;   // one chunk, unless it holds one sample (a reader refuses more)
}  // namespace

struct DatasetWriter::Impl {
  std::string path, tmp_path;
  Storage storage = Storage::raw;
  JpegStoreSpec jpeg;
  std::int64_t h = 0, w = 0, c = 0;
  int num_classes = 0;
  DatasetWriterOptions options;
  std::vector<std::string> class_names;
  H5Handle file;
  H5Handle groups[2];
  H5Handle images[2], labels[2];  ///< images: the uint8 [N,H,W,C] dataset, or a JPEG store's byte dataset
  std::int64_t counts[2] = {0, 0};
  std::vector<std::uint64_t> sum, sumsq;  // train pixel sums per channel: exact, so mean/std are reproducible
  std::uint64_t pixels_seen = 0;           // train pixels summed (JPEG stores: their sizes differ)
  bool finished = false;
  std::unique_ptr<InterruptibleTemporary> interruptible;  ///< tmp_path, removed by an interrupt (released after ~Impl)
  // Content checksums (format 2): one CRC-32 per block of `block` samples, over the block's image bytes then its
  // labels (int32 LE); JPEG stores continue over each sample's (byte count, height, width) as uint32 LE. The open
  // block's image CRC runs as samples stream in; its labels wait for the block's end.
  std::int64_t block = 0;
  std::vector<std::uint32_t> checksums[2];
  std::uint32_t open_crc[2] = {0, 0};
  std::vector<std::int32_t> open_labels[2];
  std::vector<std::uint32_t> open_meta[2];
  // JPEG stores: bytes not yet written, the offsets (count + 1) and shapes (2 per sample), kept until finish().
  std::vector<std::uint8_t> pending[2];
  std::vector<std::int32_t> pending_labels[2];
  std::int64_t written_bytes[2] = {0, 0}, written_labels[2] = {0, 0};
  std::vector<std::int64_t> offsets[2] = {{0}, {0}};
  std::vector<std::int32_t> shapes[2];

  void add_sums(const PixelSums& s) {
    for (std::size_t ch = 0; ch < sum.size(); ++ch) {
      sum[ch] += s.sum[ch];
      sumsq[ch] += s.sumsq[ch];
    }
    pixels_seen += s.pixels;
  }
  void checksum(int si, const std::uint8_t* images, const std::int32_t* labels, std::int64_t count) {
    const std::int64_t sb = h * w * c;
    for (std::int64_t i = 0; i < count;) {
      const std::int64_t room = block - static_cast<std::int64_t>(open_labels[si].size());
      const std::int64_t take = std::min(room, count - i);
      open_crc[si] = content_crc(open_crc[si], images + i * sb, static_cast<std::size_t>(take * sb));
      open_labels[si].insert(open_labels[si].end(), labels + i, labels + i + take);
      i += take;
      if (static_cast<std::int64_t>(open_labels[si].size()) == block) close_block(si);
    }
  }
  void close_block(int si) {
    if (open_labels[si].empty()) return;
    std::uint32_t crc = labels_crc(open_crc[si], open_labels[si]);
    if (storage == Storage::jpeg) crc = shapes_crc(crc, open_meta[si]);
    checksums[si].push_back(crc);
    open_crc[si] = 0;
    open_labels[si].clear();
    open_meta[si].clear();
  }

  /// Labels dataset of a split (both storages).
  void create_labels(int si) {
    const Split s = static_cast<Split>(si);
    const std::string ctx = ds_ctx(path, s, "labels");
    const hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, cdims[1] = {4096};
    H5Handle space(H5_CHECK(H5Screate_simple(1, dims, maxdims), ctx, "creating the dataspace"), H5Sclose);
    H5Handle dcpl = untimed_plist(H5P_DATASET_CREATE, ctx);
    H5_CHECK(H5Pset_chunk(dcpl, 1, cdims), ctx, "setting chunks");
    if (options.deflate_level > 0) H5_CHECK(H5Pset_deflate(dcpl, options.deflate_level), ctx, "enabling deflate");
    H5_CHECK(H5Pset_fletcher32(dcpl), ctx, "enabling the Fletcher32 checksum");
    labels[si] = own(H5_CHECK(H5Dcreate2(groups[si], "labels", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                              ctx, "creating the dataset"),
                     H5Dclose);
  }

  /// Appends rows to a 1-D or N-D chunked dataset whose first dimension grows.
  void grow_and_write(hid_t ds, hid_t mem_type, int rank, const hsize_t* tail, std::int64_t base, std::int64_t count,
                      const void* buf, const std::string& ctx) {
    hsize_t dims[4] = {hsize_t(base + count), 0, 0, 0};
    for (int i = 1; i < rank; ++i) dims[i] = tail[i - 1];
    H5_CHECK(H5Dset_extent(ds, dims), ctx, "growing to {} rows", base + count);
    rows_io(true, ds, mem_type, base, count, const_cast<void*>(buf), ctx, rows_what(base, count, 0));
  }

  /// JPEG stores: writes the gathered bytes and labels of split si.
  void flush(int si) {
    const Split s = static_cast<Split>(si);
    if (!pending[si].empty()) {
      grow_and_write(images[si], H5T_NATIVE_UINT8, 1, nullptr, written_bytes[si],
                     static_cast<std::int64_t>(pending[si].size()), pending[si].data(), ds_ctx(path, s, "jpeg"));
      written_bytes[si] += static_cast<std::int64_t>(pending[si].size());
      pending[si].clear();
    }
    if (!pending_labels[si].empty()) {
      grow_and_write(labels[si], H5T_NATIVE_INT32, 1, nullptr, written_labels[si],
                     static_cast<std::int64_t>(pending_labels[si].size()), pending_labels[si].data(),
                     ds_ctx(path, s, "labels"));
      written_labels[si] += static_cast<std::int64_t>(pending_labels[si].size());
      pending_labels[si].clear();
    }
  }

  /// A dataset written whole at finish() (JPEG stores: offsets, shapes).
  void write_whole(int si, const char* name, hid_t file_type, hid_t mem_type, int rank, const hsize_t* dims,
                   const void* data) {
    const std::string ctx = ds_ctx(path, static_cast<Split>(si), name);
    H5Handle space(H5_CHECK(H5Screate_simple(rank, dims, nullptr), ctx, "creating the dataspace"), H5Sclose);
    H5Handle dcpl = untimed_plist(H5P_DATASET_CREATE, ctx);
    hsize_t cdims[2] = {std::max<hsize_t>(1, std::min<hsize_t>(dims[0], 1 << 16)), rank > 1 ? dims[1] : 1};
    H5_CHECK(H5Pset_chunk(dcpl, rank, cdims), ctx, "setting chunks");
    H5_CHECK(H5Pset_fletcher32(dcpl), ctx, "enabling the Fletcher32 checksum");
    H5Handle ds(H5_CHECK(H5Dcreate2(groups[si], name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), ctx,
                         "creating the dataset"),
                H5Dclose);
    if (dims[0] > 0) H5_CHECK(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), ctx, "writing");
  }

  void create(std::string target, int classes, DatasetWriterOptions opts);

  void close_all() noexcept {
    for (int s = 0; s < 2; ++s) {
      images[s].reset();
      labels[s].reset();
      groups[s].reset();
    }
    file.reset();
  }
  // Also runs when the constructor throws half-way, so the cleanup lives here, not in ~DatasetWriter.
  ~Impl() {
    const auto lock = hdf5_lock();
    close_all();
    if (!finished && !tmp_path.empty()) {
      std::error_code ec;
      fs::remove(tmp_path, ec);  // never leave a half-written file behind
    }
  }
};

/// The file, its groups and labels datasets; the images datasets are the caller's (they differ by storage).
void DatasetWriter::Impl::create(std::string target, int classes, DatasetWriterOptions opts) {
  path = std::move(target);
  num_classes = classes;
  options = opts;
  RN_CHECK_CTX(num_classes >= 1 && num_classes <= kMaxClasses, path, "num_classes must be in [1, {}], got {}",
               kMaxClasses, num_classes);
  RN_CHECK_CTX(options.deflate_level >= 0 && options.deflate_level <= 9, path, "deflate level {} not in 0..9",
               options.deflate_level);
  RN_CHECK_CTX(options.chunk_samples >= 0, path, "chunk_samples must be >= 0, got {}", options.chunk_samples);
  sum.assign(static_cast<std::size_t>(c), 0);
  sumsq.assign(static_cast<std::size_t>(c), 0);

  const fs::path tp(path);
  const fs::path dir = tp.has_parent_path() ? tp.parent_path() : fs::path(".");
  if (!fs::is_directory(dir))
    RN_IO_FAIL(path, "create the directory first", "output directory '{}' does not exist", dir.string());
  // Same directory as the target so that the final rename is atomic (no cross-file-system copy). A symlink at the
  // target is followed (its file is replaced, the link stays); a device or directory there is refused.
  path = resolve_output_file(path, "--out");
  // A checkpoint, weights or logits file under the name (a typo'd --out): replaced by the dataset without a word. A
  // dataset there is replaced (an import run again).
  if (const std::string kind = data_file_kind(path); !kind.empty() && kind != "an HDF5 file")
    RN_IO_FAIL(path, "write the dataset to a file of its own, or remove that file first",
               "--out would replace {}, not a dataset", kind);
  remove_stale_temporaries(path);
  tmp_path = temporary_name(path);
  interruptible = std::make_unique<InterruptibleTemporary>(tmp_path);

  H5Handle fapl(make_file_access_plist(), H5Pclose);
  // Format 2: checksummed metadata (superblock 2, object headers 2), so a corrupt header is a checksum error, never
  // input HDF5's parsers trust. The chunk indexes stay v1 B-trees, which have no checksum (HDF5 1.10 writes the 1.8
  // layout for the V18 lower bound): readers bound what they declare (check_layout).
  H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST), path, "setting the format version bounds");
  // STRONG: closing the file closes every object, so finish() really releases it before the rename.
  H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), path, "setting the close degree");
  // No object times (untimed_plist): one source imported twice gives the same bytes.
  const H5Handle fcpl = untimed_plist(H5P_FILE_CREATE, path);
  file = own(H5_CHECK(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, fcpl, fapl), path, "creating temporary file '{}'",
                      tmp_path),
             H5Fclose);
  for (Split s : kAllSplits) {
    const int si = static_cast<int>(s);
    const std::string gctx = fmt::format("{}: group '/{}'", path, split_name(s));
    const H5Handle gcpl = untimed_plist(H5P_GROUP_CREATE, gctx);
    groups[si] =
        own(H5_CHECK(H5Gcreate2(file, split_name(s), H5P_DEFAULT, gcpl, H5P_DEFAULT), gctx, "creating the group"),
            H5Gclose);
    create_labels(si);
  }
}

DatasetWriter::DatasetWriter(std::string path, std::int64_t height, std::int64_t width, std::int64_t channels,
                             int num_classes, DatasetWriterOptions options)
    : m_impl(std::make_unique<Impl>()) {
  const auto lock = hdf5_lock();
  hdf5_init();
  Impl& m = *m_impl;
  m.h = height;
  m.w = width;
  m.c = channels;
  RN_CHECK_CTX(height > 0 && width > 0 && channels > 0, path, "image shape {}x{}x{} must be positive", height, width,
               channels);
  // HDF5 stores a sample in one chunk, and a chunk holds less than 4 GiB (checked before the file exists).
  const long double sample_bytes = static_cast<long double>(height) * width * channels;
  RN_CHECK_CTX(sample_bytes < 4294967296.0L, path,
               "one image of {}x{}x{} is {:.1f} GiB; a raw store holds images of less than 4 GiB each (HDF5's chunk "
               "limit)",
               height, width, channels, static_cast<double>(sample_bytes / 1073741824.0L));
  m.create(std::move(path), num_classes, options);
  const std::int64_t chunk =
      options.chunk_samples > 0 ? options.chunk_samples : auto_chunk_samples(height * width * channels);
  // Readers refuse larger chunks (check_layout); one sample per chunk is always allowed.
  RN_CHECK_CTX(chunk == 1 || chunk <= kMaxChunkBytes / (height * width * channels), m.path,
               "chunks of {} samples of {} bytes exceed {} MiB", chunk, height * width * channels,
               kMaxChunkBytes >> 20);
  m.block = chunk;  // one content checksum per images chunk
  for (Split s : kAllSplits) {
    const int si = static_cast<int>(s);
    const std::string ctx = ds_ctx(m.path, s, "images");
    const hsize_t dims[4] = {0, hsize_t(height), hsize_t(width), hsize_t(channels)};
    const hsize_t maxdims[4] = {H5S_UNLIMITED, hsize_t(height), hsize_t(width), hsize_t(channels)};
    const hsize_t cdims[4] = {hsize_t(chunk), hsize_t(height), hsize_t(width), hsize_t(channels)};
    H5Handle space(H5_CHECK(H5Screate_simple(4, dims, maxdims), ctx, "creating the dataspace"), H5Sclose);
    H5Handle dcpl = untimed_plist(H5P_DATASET_CREATE, ctx);
    H5_CHECK(H5Pset_chunk(dcpl, 4, cdims), ctx, "setting chunks of {} samples", chunk);
    if (options.deflate_level > 0) H5_CHECK(H5Pset_deflate(dcpl, options.deflate_level), ctx, "enabling deflate");
    // After deflate: the checksum covers the bytes on disk, so a flipped byte is reported as corruption
    // instead of surfacing as a confusing inflate error (or not at all).
    H5_CHECK(H5Pset_fletcher32(dcpl), ctx, "enabling the Fletcher32 checksum");
    m.images[si] = own(H5_CHECK(H5Dcreate2(m.groups[si], "images", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                                ctx, "creating the dataset"),
                       H5Dclose);
  }
}

DatasetWriter::DatasetWriter(std::string path, const JpegStoreSpec& jpeg, int num_classes, DatasetWriterOptions options)
    : m_impl(std::make_unique<Impl>()) {
  const auto lock = hdf5_lock();
  hdf5_init();
  Impl& m = *m_impl;
  m.storage = Storage::jpeg;
  m.jpeg = jpeg;
  m.c = jpeg.channels;
  RN_CHECK_CTX(jpeg.channels == 1 || jpeg.channels == 3, path, "a JPEG store holds 1 or 3 channels, not {}",
               jpeg.channels);
  RN_CHECK_CTX(jpeg.quality >= 1 && jpeg.quality <= 100 && jpeg.max_side >= 0, path,
               "JPEG quality {} (1..100) or max side {} (>= 0) out of range", jpeg.quality, jpeg.max_side);
  m.create(std::move(path), num_classes, options);
  // One checksum per sample by default: a shuffled read of a store larger than the cache then reads what it needs.
  m.block = options.chunk_samples > 0 ? options.chunk_samples : 1;
  for (Split s : kAllSplits) {
    const int si = static_cast<int>(s);
    const std::string ctx = ds_ctx(m.path, s, "jpeg");
    const hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, cdims[1] = {hsize_t(kJpegChunkBytes)};
    H5Handle space(H5_CHECK(H5Screate_simple(1, dims, maxdims), ctx, "creating the dataspace"), H5Sclose);
    H5Handle dcpl = untimed_plist(H5P_DATASET_CREATE, ctx);
    H5_CHECK(H5Pset_chunk(dcpl, 1, cdims), ctx, "setting chunks");
    H5_CHECK(H5Pset_fletcher32(dcpl), ctx, "enabling the Fletcher32 checksum");
    m.images[si] = own(H5_CHECK(H5Dcreate2(m.groups[si], "jpeg", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                                ctx, "creating the dataset"),
                       H5Dclose);
  }
}

DatasetWriter::~DatasetWriter() = default;

void DatasetWriter::set_class_names(std::vector<std::string> names) {
  RN_CHECK_CTX(names.empty() || static_cast<int>(names.size()) == m_impl->num_classes, m_impl->path,
               "{} class names given for {} classes", names.size(), m_impl->num_classes);
  for (std::size_t k = 0; k < names.size(); ++k)
    RN_CHECK_CTX(valid_utf8(names[k]) && names[k].find('\0') == std::string::npos, m_impl->path,
                 "the name of class {} is not UTF-8 text without NUL bytes (class names are stored as UTF-8 strings)",
                 k);
  m_impl->class_names = std::move(names);
}

std::int64_t DatasetWriter::count(Split split) const { return m_impl->counts[static_cast<int>(split)]; }

void DatasetWriter::append(Split split, const std::uint8_t* images, const std::int32_t* labels, std::int64_t count) {
  const auto lock = hdf5_lock();
  Impl& m = *m_impl;
  const int si = static_cast<int>(split);
  RN_CHECK_CTX(!m.finished, m.path, "append after finish()");
  RN_CHECK_CTX(m.storage == Storage::raw, m.path, "append() to a JPEG store: use append_encoded()");
  RN_CHECK_CTX(count >= 0, m.path, "negative sample count {}", count);
  if (count == 0) return;
  RN_CHECK_CTX(images && labels, m.path, "append: null images or labels");
  const std::int64_t base = m.counts[si];
  for (std::int64_t i = 0; i < count; ++i) {
    if (labels[i] < 0 || labels[i] >= m.num_classes)
      RN_IO_FAIL(ds_ctx(m.path, split, "labels"), "check --classes against the source labels",
                 "label {} of sample {} is outside [0, {})", labels[i], base + i, m.num_classes);
  }
  const hsize_t tail[3] = {hsize_t(m.h), hsize_t(m.w), hsize_t(m.c)};
  m.grow_and_write(m.images[si], H5T_NATIVE_UINT8, 4, tail, base, count, images, ds_ctx(m.path, split, "images"));
  m.grow_and_write(m.labels[si], H5T_NATIVE_INT32, 1, nullptr, base, count, labels, ds_ctx(m.path, split, "labels"));
  m.checksum(si, images, labels, count);
  if (split == Split::train) m.add_sums(pixel_sums(images, count * m.h * m.w, m.c));
  m.counts[si] = base + count;
}

void DatasetWriter::append_encoded(Split split, const std::uint8_t* bytes, std::int64_t size, std::int64_t height,
                                   std::int64_t width, std::int32_t label, const std::uint8_t* pixels) {
  append_encoded(split, bytes, size, height, width, label,
                 split == Split::train && pixels ? pixel_sums(pixels, height * width, m_impl->c) : PixelSums{});
}

void DatasetWriter::append_encoded(Split split, const std::uint8_t* bytes, std::int64_t size, std::int64_t height,
                                   std::int64_t width, std::int32_t label, const PixelSums& sums) {
  const auto lock = hdf5_lock();
  Impl& m = *m_impl;
  const int si = static_cast<int>(split);
  RN_CHECK_CTX(!m.finished, m.path, "append after finish()");
  RN_CHECK_CTX(m.storage == Storage::jpeg, m.path, "append_encoded() to a raw store: use append()");
  const std::int64_t base = m.counts[si];
  RN_CHECK_CTX(bytes && size > 0 && size <= kMaxJpegBytes, m.path, "sample {}: {} bytes of JPEG (1 to {} allowed)",
               base, size, kMaxJpegBytes);
  RN_CHECK_CTX(height > 0 && width > 0 && height <= kMaxJpegSide && width <= kMaxJpegSide, m.path,
               "sample {}: a JPEG of {}x{} pixels", base, width, height);
  if (label < 0 || label >= m.num_classes)
    RN_IO_FAIL(ds_ctx(m.path, split, "labels"), "check --classes against the source labels",
               "label {} of sample {} is outside [0, {})", label, base, m.num_classes);
  RN_CHECK_CTX(sums.sum.empty() || (static_cast<std::int64_t>(sums.sum.size()) == m.c &&
                                    static_cast<std::int64_t>(sums.sumsq.size()) == m.c &&
                                    sums.pixels == static_cast<std::uint64_t>(height * width)),
               m.path, "internal: pixel sums of {} channels and {} pixels for a {}x{} sample of {} channels",
               sums.sum.size(), sums.pixels, width, height, m.c);
  m.pending[si].insert(m.pending[si].end(), bytes, bytes + size);
  m.pending_labels[si].push_back(label);
  m.offsets[si].push_back(m.offsets[si].back() + size);
  m.shapes[si].push_back(static_cast<std::int32_t>(height));
  m.shapes[si].push_back(static_cast<std::int32_t>(width));
  m.open_crc[si] = content_crc(m.open_crc[si], bytes, static_cast<std::size_t>(size));
  m.open_labels[si].push_back(label);
  m.open_meta[si].insert(m.open_meta[si].end(), {static_cast<std::uint32_t>(size), static_cast<std::uint32_t>(height),
                                                 static_cast<std::uint32_t>(width)});
  if (static_cast<std::int64_t>(m.open_labels[si].size()) == m.block) m.close_block(si);
  if (split == Split::train && !sums.sum.empty()) m.add_sums(sums);
  m.counts[si] = base + 1;
  if (static_cast<std::int64_t>(m.pending[si].size()) >= kJpegFlushBytes) m.flush(si);
}

PixelSums pixel_sums(const std::uint8_t* data, std::int64_t pixels, std::int64_t channels) {
  PixelSums s;
  s.sum.assign(static_cast<std::size_t>(channels), 0);
  s.sumsq.assign(static_cast<std::size_t>(channels), 0);
  s.pixels = static_cast<std::uint64_t>(pixels);
  // Rows of at most 2^16 values per channel in 32-bit partial sums (255^2 * 2^16 < 2^32), added into 64 bits.
  constexpr std::int64_t kRun = 1 << 16;
  for (std::int64_t p0 = 0; p0 < pixels; p0 += kRun) {
    const std::int64_t p1 = std::min(pixels, p0 + kRun);
    std::uint32_t a[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
    if (channels == 3) {
      for (std::int64_t p = p0; p < p1; ++p) {
        const std::uint8_t* px = data + p * 3;
        const std::uint32_t r = px[0], g = px[1], b = px[2];
        a[0] += r;
        a[1] += g;
        a[2] += b;
        q[0] += r * r;
        q[1] += g * g;
        q[2] += b * b;
      }
    } else if (channels == 1) {
      for (std::int64_t p = p0; p < p1; ++p) {
        const std::uint32_t v = data[p];
        a[0] += v;
        q[0] += v * v;
      }
    } else {
      for (std::int64_t p = p0; p < p1; ++p)
        for (std::int64_t ch = 0; ch < channels; ++ch) {
          const std::uint64_t v = data[p * channels + ch];
          s.sum[static_cast<std::size_t>(ch)] += v;
          s.sumsq[static_cast<std::size_t>(ch)] += v * v;
        }
      continue;
    }
    for (std::int64_t ch = 0; ch < channels; ++ch) {
      s.sum[static_cast<std::size_t>(ch)] += a[ch];
      s.sumsq[static_cast<std::size_t>(ch)] += q[ch];
    }
  }
  return s;
}

void DatasetWriter::finish() {
  const auto lock = hdf5_lock();
  Impl& m = *m_impl;
  RN_CHECK_CTX(!m.finished, m.path, "finish() called twice");
  if (m.counts[0] == 0) RN_IO_FAIL(m.path, "append training samples before finish()", "the train split is empty");
  const std::string& ctx = m.path;
  RN_CHECK_CTX(m.pixels_seen > 0, ctx, "no train pixels were given for the mean and std");
  const long double n = static_cast<long double>(m.pixels_seen);
  std::vector<float> mean(m.c), stddev(m.c);
  for (std::int64_t ch = 0; ch < m.c; ++ch) {
    const long double mu = m.sum[ch] / n;
    const long double var = std::max<long double>(m.sumsq[ch] / n - mu * mu, 0.0L);
    mean[ch] = static_cast<float>(mu / 255.0L);
    stddev[ch] = static_cast<float>(std::sqrt(var) / 255.0L);
    // The reader refuses a std of 0 (nothing to normalise by): checked here, before the file replaces `path`, which
    // a blank import used to destroy, leaving a file that no command opens.
    if (!(stddev[ch] > 0.0f))
      RN_IO_FAIL(ctx, "every train image has the same value in this channel (blank or constant images?)",
                 "the train images' channel {} has a standard deviation of 0 (every pixel {}): it cannot be "
                 "normalised; nothing was written",
                 ch, static_cast<int>(std::lround(static_cast<double>(mu))));
  }
  write_string_attr(m.file, "format", kDatasetFormat, ctx);
  write_int_attr(m.file, "version", kDatasetVersion, ctx);
  write_string_attr(m.file, "storage", storage_name(m.storage), ctx);
  write_int_attr(m.file, "num_classes", m.num_classes, ctx);
  write_float_array_attr(m.file, "mean", mean, ctx);
  write_float_array_attr(m.file, "std", stddev, ctx);
  if (m.storage == Storage::jpeg) {
    write_int_attr(m.file, "channels", static_cast<int>(m.c), ctx);
    write_int_attr(m.file, "jpeg_quality", m.jpeg.quality, ctx);
    write_int_attr(m.file, "max_side", static_cast<int>(m.jpeg.max_side), ctx);
  }
  if (!m.class_names.empty()) write_string_array_attr(m.file, "class_names", m.class_names, ctx);
  for (int si = 0; si < 2; ++si) {
    m.close_block(si);
    if (m.storage == Storage::jpeg) {
      m.flush(si);
      const hsize_t odims[1] = {m.offsets[si].size()};
      m.write_whole(si, "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, odims, m.offsets[si].data());
      const hsize_t sdims[2] = {hsize_t(m.counts[si]), 2};
      m.write_whole(si, "shapes", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, sdims, m.shapes[si].data());
    }
    const Split s = static_cast<Split>(si);
    const std::string cctx = ds_ctx(m.path, s, "checksums");
    const hsize_t n = m.checksums[si].size();
    const hsize_t cdims[1] = {std::max<hsize_t>(1, std::min<hsize_t>(n, 4096))};
    H5Handle space(H5_CHECK(H5Screate_simple(1, &n, nullptr), cctx, "creating the dataspace"), H5Sclose);
    H5Handle dcpl = untimed_plist(H5P_DATASET_CREATE, cctx);
    H5_CHECK(H5Pset_chunk(dcpl, 1, cdims), cctx, "setting chunks");
    H5_CHECK(H5Pset_fletcher32(dcpl), cctx, "enabling the Fletcher32 checksum");
    H5Handle ds(H5_CHECK(H5Dcreate2(m.groups[si], "checksums", H5T_STD_U32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                         cctx, "creating the dataset"),
                H5Dclose);
    if (n > 0) H5_CHECK(H5Dwrite(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.checksums[si].data()), cctx, "writing");
    H5Handle aspace(H5_CHECK(H5Screate(H5S_SCALAR), cctx, "creating a scalar dataspace"), H5Sclose);
    H5Handle attr(H5_CHECK(H5Acreate2(ds, "block_samples", H5T_STD_I64LE, aspace, H5P_DEFAULT, H5P_DEFAULT), cctx,
                           "creating attribute 'block_samples'"),
                  H5Aclose);
    const long long block = m.block;
    H5_CHECK(H5Awrite(attr, H5T_NATIVE_LLONG, &block), cctx, "writing attribute 'block_samples'");
  }

  for (int s = 0; s < 2; ++s) {
    m.images[s].reset();
    m.labels[s].reset();
    m.groups[s].reset();
  }
  H5_CHECK(H5Fflush(m.file, H5F_SCOPE_GLOBAL), ctx, "flushing '{}'", m.tmp_path);
  if (m.file.reset() < 0) RN_IO_FAIL(ctx, "is the disk full?", "closing temporary file '{}' failed", m.tmp_path);
  // On the disk before it takes the name (H5Fflush does not fsync): a crash or power loss right after the rename
  // left an empty or partial file under it, and the dataset it replaced was gone. Then the directory entry, as the
  // checkpoints and weights files do.
  if (const int err = fsync_path(m.tmp_path, /*directory=*/false); err != 0)
    RN_IO_FAIL(ctx, "is the disk full, or the file system failing?",
               "writing temporary file '{}' to the disk (fsync) failed: {}", m.tmp_path, std::strerror(err));
  std::error_code ec;
  fs::rename(m.tmp_path, m.path, ec);
  if (ec)
    RN_IO_FAIL(ctx, "check permissions of the output directory", "renaming '{}' failed: {}", m.tmp_path, ec.message());
  m.finished = true;
  fsync_path(fs::absolute(m.path).parent_path().string(), /*directory=*/true);
}

// ================================================= DatasetFile =================================================

struct DatasetFile::Impl {
  /// Decoded samples [first, first + count) of one split: what a read copies from.
  struct Block {
    std::int64_t first = 0, count = 0;
    std::vector<std::uint8_t> images;  ///< raw: count samples of H*W*C; JPEG: their bytes one after the other
    std::vector<std::int32_t> labels;
  };
  struct SplitData {
    H5Handle images, labels;  ///< images: uint8 [N,H,W,C], or a JPEG store's byte dataset /<split>/jpeg
    std::vector<std::int64_t> offsets;  ///< JPEG stores: N + 1 byte offsets
    std::vector<std::int32_t> shapes;   ///< JPEG stores: (height, width) per sample
    /// JPEG stores read chunk by chunk (see read_direct): the bytes' chunk size (0: through H5Dread) and scratch.
    std::int64_t chunk_bytes = 0;
    mutable std::vector<std::uint8_t> raw_chunk;
    std::int64_t block = 1;                ///< samples per block (= per content checksum in format 2)
    std::vector<std::uint32_t> checksums;  ///< format 2: one per block; empty in format 1
    std::int64_t capacity = 2;             ///< blocks kept in memory (all of them when the split fits the budget)
    std::map<std::int64_t, std::pair<std::shared_ptr<Block>, std::list<std::int64_t>::iterator>> cache;
    std::list<std::int64_t> lru;  ///< most recent first (only when not every block fits)
    std::int64_t blocks(std::int64_t count) const { return (count + block - 1) / block; }
  };
  std::string path;
  std::string format_attr;  ///< as read (a child process hands it over: see the constructor)
  std::string storage_attr;  ///< likewise ("raw", "jpeg"; empty before version 3)
  int version = 0;
  Storage storage = Storage::raw;
  JpegStoreSpec jpeg;
  int num_classes = 0;
  std::vector<float> mean, stddev;
  std::vector<std::string> class_names;
  H5Handle file;
  int fd = -1;                  ///< the file as HDF5 holds it open (to notice a truncation during a run)
  std::int64_t file_bytes = 0;  ///< its size when opened
  std::int64_t mtime_ns = -1;   ///< its modification time when opened (-1: unknown)
  SplitData split[2];
  SplitInfo info[2];
  ~Impl() {
    const auto lock = hdf5_lock();  // closing handles is HDF5 use too
    for (int s = 0; s < 2; ++s) {
      split[s].images.reset();
      split[s].labels.reset();
    }
    file.reset();
  }

  /// The file must not have shrunk since it was opened: HDF5 reads the bytes past a truncated end as zeros, which
  /// pass Fletcher32.
  /// The file as it is now: through the descriptor HDF5 holds (the file the run opened), else by its path.
  bool stat_now(struct stat& st) const { return fd >= 0 ? ::fstat(fd, &st) == 0 : ::stat(path.c_str(), &st) == 0; }

  void check_size(Split s, std::int64_t first, std::int64_t count) const {
    struct stat st {};
    if (stat_now(st) && static_cast<std::int64_t>(st.st_size) < file_bytes)
      RN_IO_FAIL(ds_ctx(path, s, "images"), "another process truncated or rewrote the file during the run",
                 "the file shrank from {} to {} bytes while samples [{}, {}) were read", file_bytes,
                 static_cast<std::int64_t>(st.st_size), first, first + count);
  }

  /// A read of blocks not yet cached that failed (inside HDF5: inflate, Fletcher32; or the content checksum) in a
  /// file written since it was opened (size or modification time: another process rewrote it in place, `cp` over
  /// it) fails saying so; nothing when unchanged or unknown (the caller reports the failure itself).
  void fail_if_changed(Split s, const std::string& what) const {
    struct stat st {};
    if (!stat_now(st) || mtime_ns < 0) return;
    const auto size = static_cast<std::int64_t>(st.st_size);
    if (static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec == mtime_ns &&
        size == file_bytes)
      return;
    RN_IO_FAIL(ds_ctx(path, s, "images"),
               "another process rewrote the file during the run; write a new file and rename it over the old one "
               "(a run that has it open keeps reading the old one)",
               "the file changed while {} were read (it was written after the run opened it{}); the run cannot go on",
               what, size == file_bytes ? "" : fmt::format(", and is now {} bytes instead of {}", size, file_bytes));
  }

  /// A JPEG store's bytes [byte0, byte0 + n) from whole raw chunks (H5Dread_chunk: no filter pipeline, no chunk
  /// cache, no selection), past HDF5's per-read machinery: a shuffled epoch reads ~100 KB per image, and H5Dread
  /// with Fletcher32 over every chunk touched (64 KiB each) held the loader to ~4,000 img/s on the H200 machine.
  /// Used only where nothing but Fletcher32 filters the bytes (a raw chunk is the bytes as written, then its
  /// checksum) and the store has content checksums (format 2: every block is verified after the read, so
  /// Fletcher32's check is redundant). False (nothing trusted) when HDF5 cannot give a chunk of the expected size:
  /// the caller reads through H5Dread. (Chunk addresses are not looked up: HDF5 1.10's H5Dget_chunk_info_by_coord
  /// walks every chunk, ~0.5 ms a lookup on a 5 GB store.)
  bool read_direct(Split s, std::int64_t byte0, std::int64_t n, std::uint8_t* out) const {
    const SplitData& d = split[static_cast<int>(s)];
    if (d.chunk_bytes <= 0 || d.checksums.empty()) return false;
    for (std::int64_t at = byte0; at < byte0 + n;) {
      const std::int64_t c = at / d.chunk_bytes;
      const std::int64_t in_chunk = at - c * d.chunk_bytes;
      const std::int64_t len = std::min(byte0 + n - at, d.chunk_bytes - in_chunk);
      const hsize_t coord[1] = {static_cast<hsize_t>(c * d.chunk_bytes)};
      hsize_t stored = 0;
      if (H5Dget_chunk_storage_size(d.images, coord, &stored) < 0 || stored < static_cast<hsize_t>(in_chunk + len) ||
          stored > static_cast<hsize_t>(d.chunk_bytes) + 64) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
      d.raw_chunk.resize(static_cast<std::size_t>(stored));
      std::uint32_t mask = 0;
      if (H5Dread_chunk(d.images, H5P_DEFAULT, coord, &mask, d.raw_chunk.data()) < 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
      std::memcpy(out + (at - byte0), d.raw_chunk.data() + in_chunk, static_cast<std::size_t>(len));
      at += len;
    }
    return true;
  }

  /// `hdf5`: the JPEG bytes through HDF5 even where they could be read directly (verify(): Fletcher32 checks the
  /// whole chunks, padding included).
  std::shared_ptr<Block> load(Split s, std::int64_t k, const std::string& request, bool hdf5 = false) const {
    const SplitData& d = split[static_cast<int>(s)];
    const SplitInfo& in = info[static_cast<int>(s)];
    auto b = std::make_shared<Block>();
    b->first = k * d.block;
    b->count = std::min(d.block, in.count - b->first);
    const bool jpeg = in.storage == Storage::jpeg;
    const std::int64_t sb = in.sample_bytes();
    const std::int64_t byte0 = jpeg ? d.offsets[static_cast<std::size_t>(b->first)] : 0;
    const std::int64_t nbytes =
        jpeg ? d.offsets[static_cast<std::size_t>(b->first + b->count)] - byte0 : b->count * sb;
    b->images.resize(static_cast<std::size_t>(nbytes));
    b->labels.resize(static_cast<std::size_t>(b->count));
    const std::string what = rows_what(b->first, b->count, in.chunk_samples);
    try {
      // JPEG bytes past HDF5 where they can be (the content checksum below verifies them), else through it.
      if (jpeg && (hdf5 || !read_direct(s, byte0, nbytes, b->images.data())))
        rows_io(false, d.images, H5T_NATIVE_UINT8, byte0, nbytes, b->images.data(), ds_ctx(path, s, "jpeg"),
                fmt::format("{} (bytes [{}, {}))", what, byte0, byte0 + nbytes));
      else if (!jpeg)
        rows_io(false, d.images, H5T_NATIVE_UINT8, b->first, b->count, b->images.data(), ds_ctx(path, s, "images"), what);
      rows_io(false, d.labels, H5T_NATIVE_INT32, b->first, b->count, b->labels.data(), ds_ctx(path, s, "labels"), what);
    } catch (const Error& e) {
      check_size(s, b->first, b->count);
      fail_if_changed(s, what);
      if (request.empty() || request == what) throw;
      throw Error(fmt::format("{} (reading {})", e.message(), request), e.context(), e.hint(), e.where());
    }
    check_size(s, b->first, b->count);
    if (!d.checksums.empty()) {
      const std::uint32_t want = d.checksums[static_cast<std::size_t>(k)];
      std::uint32_t got = labels_crc(content_crc(0, b->images.data(), b->images.size()), b->labels);
      if (jpeg) {
        std::vector<std::uint32_t> meta;
        for (std::int64_t i = b->first; i < b->first + b->count; ++i) {
          const auto u = static_cast<std::size_t>(i);
          meta.insert(meta.end(), {static_cast<std::uint32_t>(d.offsets[u + 1] - d.offsets[u]),
                                   static_cast<std::uint32_t>(d.shapes[2 * u]),
                                   static_cast<std::uint32_t>(d.shapes[2 * u + 1])});
        }
        got = shapes_crc(got, meta);
      }
      if (got != want) {
        fail_if_changed(s, what);
        const bool zeros = std::all_of(b->images.begin(), b->images.end(), [](std::uint8_t v) { return v == 0; });
        RN_IO_FAIL(ds_ctx(path, s, jpeg ? "jpeg" : "images"), "the file is corrupted; re-create or re-copy it",
                   "samples [{}, {}) fail their content checksum (stored {:08x}, read {:08x}){}", b->first,
                   b->first + b->count, want, got,
                   zeros ? ": their images read as all zero (a zeroed chunk, one never written, or one past the end "
                           "of a truncated file)"
                         : "");
      }
    }
    return b;
  }

  /// Block k from the cache, loading (and caching) it when missing.
  std::shared_ptr<Block> block(Split s, std::int64_t k, const std::string& request) {
    SplitData& d = split[static_cast<int>(s)];
    const bool all = d.capacity >= d.blocks(info[static_cast<int>(s)].count);
    const auto it = d.cache.find(k);
    if (it != d.cache.end()) {
      if (!all) d.lru.splice(d.lru.begin(), d.lru, it->second.second);
      return it->second.first;
    }
    auto b = load(s, k, request);
    if (all) {
      d.cache.emplace(k, std::make_pair(b, d.lru.end()));
      return b;
    }
    d.lru.push_front(k);
    d.cache.emplace(k, std::make_pair(b, d.lru.begin()));
    while (static_cast<std::int64_t>(d.lru.size()) > d.capacity) {
      d.cache.erase(d.lru.back());
      d.lru.pop_back();
    }
    return b;
  }
};

namespace {

/// Calls fn(index, filter id, its first client value or -1) for each filter of a dataset's creation properties.
template <typename Fn>
void for_each_filter(hid_t dcpl, const std::string& ctx, Fn&& fn) {
  const int nf = H5_CHECK(H5Pget_nfilters(dcpl), ctx, "reading the filters");
  for (int i = 0; i < nf; ++i) {
    unsigned flags = 0, cd[8] = {0}, config = 0;
    size_t ncd = 8;
    char name[64] = {0};
    const H5Z_filter_t f =
        H5_CHECK(H5Pget_filter2(dcpl, i, &flags, &ncd, cd, sizeof(name), name, &config), ctx, "reading filter {}", i);
    fn(i, f, ncd > 0 ? static_cast<long>(cd[0]) : -1L);
  }
}

/// The storage a dataset's header declares, checked before HDF5 reads a byte of its data: HDF5 sizes its buffers by
/// what the file says (the chunk shape; each stored chunk's byte count, read whole before the filters run), and the
/// chunk index is a v1 B-tree, without checksums, even in format 2 and 3 files (HDF5 1.10 keeps the 1.8 layout for
/// the V18 lower bound). A chunk index claiming a 4 GB chunk in a 160 KB file made H5Dread allocate 4 GB (found by
/// the CI run of fuzz_dataset). Refused, naming the dataset:
///  - a filter other than deflate, shuffle and Fletcher32 (what our writers and h5py's gzip use; HDF5 would look for
///    a plugin for any other id);
///  - chunks over kMaxChunkBytes, unless a chunk is at most one row (one sample: a reader holds that much anyway);
///    our writers never make larger ones (images aim at ~1 MiB, labels 16 KiB, JPEG bytes 64 KiB);
///  - stored bytes (every chunk's, as the chunk index counts them) beyond the size of the whole file, which no file
///    written by anyone has: so no chunk read makes HDF5 allocate more than the file holds.
void check_layout(hid_t ds, const std::string& path, const std::string& ctx) {
  H5Handle dcpl(H5_CHECK(H5Dget_create_plist(ds), ctx, "reading the creation properties"), H5Pclose);
  for_each_filter(dcpl, ctx, [&](int i, H5Z_filter_t f, long) {
    if (f != H5Z_FILTER_DEFLATE && f != H5Z_FILTER_SHUFFLE && f != H5Z_FILTER_FLETCHER32)
      RN_IO_FAIL(ctx, "write the dataset with deflate (h5py: compression=\"gzip\"), shuffle and Fletcher32 only, or " +
                          std::string(kRecreateHint),
                 "filter {} of its pipeline has id {}, not one Renaissance reads (deflate, shuffle, Fletcher32)", i, f);
  });
  const bool chunked = H5Pget_layout(dcpl) == H5D_CHUNKED;
  if (chunked) {
    H5Handle type(H5_CHECK(H5Dget_type(ds), ctx, "reading the type"), H5Tclose);
    H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "reading the dataspace"), H5Sclose);
    const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space), ctx, "reading the rank");
    hsize_t dims[H5S_MAX_RANK] = {0}, cdims[H5S_MAX_RANK] = {0};
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr), ctx, "reading the dimensions");
    const int crank = H5_CHECK(H5Pget_chunk(dcpl, H5S_MAX_RANK, cdims), ctx, "reading the chunk shape");
    if (crank != rank) RN_IO_FAIL(ctx, kRecreateHint, "has chunks of rank {} for rank {}", crank, rank);
    // In long double: a header may claim any extent and chunk shape.
    long double chunk = static_cast<long double>(H5Tget_size(type)), row = chunk;
    std::string shape;
    for (int i = 0; i < rank; ++i) {
      chunk *= static_cast<long double>(cdims[i]);
      if (i > 0) row *= static_cast<long double>(dims[i]);
      shape += fmt::format("{}{}", i ? "x" : "", cdims[i]);
    }
    if (chunk > std::max(static_cast<long double>(kMaxChunkBytes), row))
      RN_IO_FAIL(ctx, kRecreateHint,
                 "has chunks of {} ({:.0f} bytes), over the limit of {} MiB (or one sample of {:.0f} bytes): a corrupt "
                 "header?",
                 shape, static_cast<double>(chunk), kMaxChunkBytes >> 20, static_cast<double>(row));
  }
  const hsize_t stored = H5Dget_storage_size(ds);  // chunked: the sum over the chunk index's records
  H5Eclear2(H5E_DEFAULT);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && stored > static_cast<hsize_t>(st.st_size))
    RN_IO_FAIL(ctx, kRecreateHint, "{} {} stored bytes, more than the whole file has ({} bytes): a corrupt {}",
               chunked ? "its chunks claim" : "claims", stored, static_cast<std::int64_t>(st.st_size),
               chunked ? "chunk index" : "header");
}

H5Handle open_dataset(hid_t file, const std::string& path, Split s, const char* name) {
  const std::string ctx = ds_ctx(path, s, name);
  const std::string link = fmt::format("/{}/{}", split_name(s), name);
  if (!H5_CHECK(H5Lexists(file, link.c_str(), H5P_DEFAULT), ctx, "looking for the dataset"))
    RN_IO_FAIL(fmt::format("{}: group '/{}'", path, split_name(s)), kRecreateHint, "missing dataset '{}'", link);
  H5Handle ds = own(H5_CHECK(H5Dopen2(file, link.c_str(), H5P_DEFAULT), ctx, "opening the dataset"), H5Dclose);
  check_layout(ds, path, ctx);
  return ds;
}

/// Reopens a chunked dataset with a chunk cache sized for shuffled access. A shuffled epoch reads one sample of a
/// chunk at a time; unless the chunk stays cached, every sample costs a whole chunk's read, checksum and inflate
/// (chunk_samples-fold amplification). A split that fits the budget is therefore cached whole (each chunk inflated
/// once per process, memcpy afterwards); a larger one keeps a few chunks, enough for sorted batch reads.
H5Handle reopen_with_cache(hid_t file, H5Handle ds, const std::string& link, std::int64_t count,
                           std::int64_t chunk_samples, std::int64_t sample_bytes, std::int64_t budget,
                           const std::string& ctx) {
  if (chunk_samples <= 0 || count <= 0) return ds;
  chunk_samples = std::min(chunk_samples, count);  // a chunk beyond the extent holds no more samples
  const std::int64_t chunk_bytes = chunk_samples * sample_bytes;
  const std::int64_t nchunks = (count + chunk_samples - 1) / chunk_samples;
  const std::int64_t total = nchunks * chunk_bytes;
  size_t nbytes = 0, nslots = 521;
  if (total <= budget) {
    nbytes = static_cast<size_t>(total + chunk_bytes);
    // Only dimension 0 is chunked, so HDF5's slot hash is chunk number % nslots: no collisions (evictions) here.
    nslots = static_cast<size_t>(std::max<std::int64_t>(nchunks + 1, 521));
  } else {
    nbytes = static_cast<size_t>(std::max<std::int64_t>(4 * chunk_bytes, 1 << 20));
  }
  H5Handle dapl(H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS), ctx, "creating access properties"), H5Pclose);
  H5_CHECK(H5Pset_chunk_cache(dapl, nslots, nbytes, 1.0), ctx, "sizing the chunk cache");
  ds.reset();
  return own(H5_CHECK(H5Dopen2(file, link.c_str(), dapl), ctx, "opening the dataset"), H5Dclose);
}

void read_storage(hid_t ds, SplitInfo& info, const std::string& ctx) {
  H5Handle dcpl(H5_CHECK(H5Dget_create_plist(ds), ctx, "reading the creation properties"), H5Pclose);
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t cdims[4] = {0};
    H5_CHECK(H5Pget_chunk(dcpl, 4, cdims), ctx, "reading the chunk shape");
    info.chunk_samples = static_cast<std::int64_t>(cdims[0]);
  }
  for_each_filter(dcpl, ctx, [&](int, H5Z_filter_t f, long first_value) {
    if (f == H5Z_FILTER_DEFLATE) info.deflate_level = first_value >= 0 ? static_cast<int>(first_value) : 1;
    if (f == H5Z_FILTER_FLETCHER32) info.fletcher32 = true;
  });
}


/// Every sample the extent claims must be stored: a chunk never written reads back as the fill value (zeros) with
/// no error at all, and a header can claim any extent (`data inspect` would read 10^12 missing samples). Chunked
/// datasets: the allocated chunks are counted (H5Dget_num_chunks walks the chunk index, not the extent) and the
/// first missing one is named; contiguous ones: the stored bytes.
void check_stored(hid_t ds, const std::string& ctx, std::int64_t count, std::int64_t sample_bytes,
                  std::int64_t chunk_samples) {
  if (count <= 0) return;
  H5Handle dcpl(H5_CHECK(H5Dget_create_plist(ds), ctx, "reading the creation properties"), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_CHUNKED) {
    H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "reading the dataspace"), H5Sclose);
    const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space), ctx, "reading the rank");
    hsize_t dims[H5S_MAX_RANK] = {0}, cdims[H5S_MAX_RANK] = {0}, grid[H5S_MAX_RANK] = {0};
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr), ctx, "reading the dimensions");
    H5_CHECK(H5Pget_chunk(dcpl, rank, cdims), ctx, "reading the chunk shape");
    long double expected = 1;
    for (int i = 0; i < rank; ++i) {
      if (cdims[i] == 0) RN_IO_FAIL(ctx, kRecreateHint, "a chunk dimension is 0");
      grid[i] = (dims[i] + cdims[i] - 1) / cdims[i];
      expected *= static_cast<long double>(grid[i]);
    }
    hsize_t stored = 0;
    H5_CHECK(H5Dget_num_chunks(ds, space, &stored), ctx, "counting the stored chunks");
    if (static_cast<long double>(stored) >= expected) return;
    // The first chunk (in storage order) that is missing: at most stored + 1 lookups.
    hsize_t first_missing = 0;
    for (hsize_t idx = 0; idx <= stored; ++idx) {
      hsize_t off[H5S_MAX_RANK] = {0}, rest = idx;
      for (int i = rank - 1; i >= 0; --i) {
        off[i] = (rest % grid[i]) * cdims[i];
        rest /= grid[i];
      }
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(ds, off, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF) {
        H5Eclear2(H5E_DEFAULT);
        first_missing = off[0];
        break;
      }
    }
    const std::int64_t a = static_cast<std::int64_t>(first_missing);
    const std::int64_t b = std::min<std::int64_t>(count, a + static_cast<std::int64_t>(cdims[0]));
    RN_IO_FAIL(ctx, kRecreateHint,
               "samples [{}, {}) were never written: the extent claims {} samples but only {} of its {:.0f} chunks are "
               "stored (a truncated import, or a corrupt header)",
               a, b, count, stored, static_cast<double>(expected));
  }
  (void)chunk_samples;
  const hsize_t want = static_cast<hsize_t>(count) * static_cast<hsize_t>(sample_bytes);
  const hsize_t stored = H5Dget_storage_size(ds);
  if (layout == H5D_CONTIGUOUS && stored < want)
    RN_IO_FAIL(ctx, kRecreateHint, "only {} of its {} bytes are stored (samples past {} were never written)", stored,
               want, stored / static_cast<hsize_t>(std::max<std::int64_t>(sample_bytes, 1)));
}

/// The type and rank of a dataset, checked; its dimensions.
std::vector<hsize_t> checked_dims(hid_t ds, const std::string& ctx, H5T_class_t cls, std::size_t bytes, H5T_sign_t sign,
                                  int rank, const char* expected) {
  H5Handle type(H5_CHECK(H5Dget_type(ds), ctx, "reading the type"), H5Tclose);
  if (H5Tget_class(type) != cls || H5Tget_size(type) != bytes || (cls == H5T_INTEGER && H5Tget_sign(type) != sign))
    RN_IO_FAIL(ctx, kRecreateHint, "has type {}, expected {}", describe_type(type), expected);
  H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "reading the dataspace"), H5Sclose);
  const int r = H5_CHECK(H5Sget_simple_extent_ndims(space), ctx, "reading the rank");
  if (r != rank) RN_IO_FAIL(ctx, kRecreateHint, "has rank {}, expected {}", r, rank);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr), ctx, "reading the dimensions");
  return dims;
}

/// A JPEG store's split (format 3): /<split>/jpeg uint8 [bytes], /<split>/offsets int64 [N+1], /<split>/shapes int32
/// [N, 2]. Every chunk the extents claim must be stored before anything is read; the offsets must run from 0 to the
/// byte count, each image 1 byte to 64 MiB; every shape 1..65535.
void open_jpeg_split(DatasetFile::Impl& m, const std::string& path, Split s) {
  const int si = static_cast<int>(s);
  auto& d = m.split[si];
  SplitInfo& info = m.info[si];
  constexpr hsize_t kMaxCount = hsize_t{1} << 40, kMaxBytes = hsize_t{1} << 50;
  const std::string jctx = ds_ctx(path, s, "jpeg"), octx = ds_ctx(path, s, "offsets"), sctx = ds_ctx(path, s, "shapes");
  d.images = open_dataset(m.file, path, s, "jpeg");
  const hsize_t total = checked_dims(d.images, jctx, H5T_INTEGER, 1, H5T_SGN_NONE, 1, "uint8 [bytes]")[0];
  if (total > kMaxBytes) RN_IO_FAIL(jctx, kRecreateHint, "claims {} bytes, more than 1 PiB (corrupt header?)", total);
  H5Handle shapes = open_dataset(m.file, path, s, "shapes");
  const std::vector<hsize_t> sd = checked_dims(shapes, sctx, H5T_INTEGER, 4, H5T_SGN_2, 2, "int32 [N, 2]");
  if (sd[1] != 2) RN_IO_FAIL(sctx, kRecreateHint, "has {} columns, expected 2 (height, width)", sd[1]);
  if (sd[0] > kMaxCount || sd[0] > total)
    RN_IO_FAIL(sctx, kRecreateHint, "claims {} images in {} bytes of JPEG (corrupt header?)", sd[0], total);
  H5Handle offsets = open_dataset(m.file, path, s, "offsets");
  const hsize_t no = checked_dims(offsets, octx, H5T_INTEGER, 8, H5T_SGN_2, 1, "int64 [N + 1]")[0];
  if (no != sd[0] + 1) RN_IO_FAIL(octx, kRecreateHint, "{} offsets for {} images ({} expected)", no, sd[0], sd[0] + 1);
  const std::int64_t n = static_cast<std::int64_t>(sd[0]);
  SplitInfo jinfo;
  read_storage(d.images, jinfo, jctx);
  check_stored(d.images, jctx, static_cast<std::int64_t>(total), 1, jinfo.chunk_samples);
  check_stored(shapes, sctx, n, 8, 0);
  check_stored(offsets, octx, n + 1, 8, 0);
  d.offsets.resize(static_cast<std::size_t>(n + 1));
  d.shapes.resize(static_cast<std::size_t>(2 * n));
  H5_CHECK(H5Dread(offsets, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.offsets.data()), octx, "reading");
  if (n > 0) H5_CHECK(H5Dread(shapes, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.shapes.data()), sctx, "reading");
  if (d.offsets[0] != 0) RN_IO_FAIL(octx, kRecreateHint, "offset 0 is {}, expected 0", d.offsets[0]);
  if (d.offsets[static_cast<std::size_t>(n)] != static_cast<std::int64_t>(total))
    RN_IO_FAIL(octx, kRecreateHint, "the last offset is {} but the JPEG data has {} bytes",
               d.offsets[static_cast<std::size_t>(n)], total);
  info.count = n;
  info.channels = m.jpeg.channels;
  info.encoded_bytes = static_cast<std::int64_t>(total);
  info.chunk_samples = jinfo.chunk_samples;  // bytes, for a JPEG store
  info.deflate_level = jinfo.deflate_level;
  info.fletcher32 = jinfo.fletcher32;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const std::int64_t len = d.offsets[u + 1] - d.offsets[u];
    if (len < 1 || len > kMaxJpegBytes)
      RN_IO_FAIL(octx, kRecreateHint, "image {} spans {} bytes (offsets {} to {}): not 1 to {}", i, len, d.offsets[u],
                 d.offsets[u + 1], kMaxJpegBytes);
    const std::int64_t h = d.shapes[2 * u], w = d.shapes[2 * u + 1];
    if (h < 1 || w < 1 || h > kMaxJpegSide || w > kMaxJpegSide)
      RN_IO_FAIL(sctx, kRecreateHint, "image {} claims {}x{} pixels", i, w, h);
    info.min_height = i ? std::min(info.min_height, h) : h;
    info.min_width = i ? std::min(info.min_width, w) : w;
    info.max_height = std::max(info.max_height, h);
    info.max_width = std::max(info.max_width, w);
  }
  // Blocks are cached by us (verified once); HDF5 keeps only a few chunks.
  d.images = reopen_with_cache(m.file, std::move(d.images), fmt::format("/{}/jpeg", split_name(s)),
                               static_cast<std::int64_t>(total), jinfo.chunk_samples, 1, 0, jctx);
  // Raw-chunk reads (Impl::read_direct) where the chunks hold the bytes as written: chunked, Fletcher32 at most.
  // RENAISSANCE_JPEG_DIRECT_READ=0 reads through HDF5 (a measurement switch, docs/input-pipeline.md).
  H5Handle dcpl(H5_CHECK(H5Dget_create_plist(d.images), jctx, "reading the creation properties"), H5Pclose);
  const int filters = H5_CHECK(H5Pget_nfilters(dcpl), jctx, "reading the filters");
  const char* env = std::getenv("RENAISSANCE_JPEG_DIRECT_READ");
  const bool off = env && std::string(env) == "0";
  if (!off && jinfo.chunk_samples > 0 && filters == (jinfo.fletcher32 ? 1 : 0) && jinfo.deflate_level == 0 &&
      total > 0) {
    d.chunk_bytes = jinfo.chunk_samples;
  }
}

/// Blocks, content checksums (format 2) and the cache of one split.
void open_blocks(DatasetFile::Impl& m, Split s, std::int64_t budget) {
  const int si = static_cast<int>(s);
  auto& d = m.split[si];
  const SplitInfo& in = m.info[si];
  const std::int64_t sb = in.sample_bytes();
  d.block = in.chunk_samples > 0 ? in.chunk_samples : auto_chunk_samples(sb);
  if (m.version >= 2) {
    const std::string ctx = ds_ctx(m.path, s, "checksums");
    const std::string link = fmt::format("/{}/checksums", split_name(s));
    if (!H5_CHECK(H5Lexists(m.file, link.c_str(), H5P_DEFAULT), ctx, "looking for the dataset"))
      RN_IO_FAIL(ctx, kRecreateHint, "missing: a version 2 dataset stores a content checksum per block of samples");
    H5Handle ds(H5_CHECK(H5Dopen2(m.file, link.c_str(), H5P_DEFAULT), ctx, "opening the dataset"), H5Dclose);
    check_layout(ds, m.path, ctx);
    H5Handle type(H5_CHECK(H5Dget_type(ds), ctx, "reading the type"), H5Tclose);
    if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 4 || H5Tget_sign(type) != H5T_SGN_NONE)
      RN_IO_FAIL(ctx, kRecreateHint, "checksums have type {}, expected uint32", describe_type(type));
    H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "reading the dataspace"), H5Sclose);
    if (H5_CHECK(H5Sget_simple_extent_ndims(space), ctx, "reading the rank") != 1)
      RN_IO_FAIL(ctx, kRecreateHint, "checksums must have rank 1");
    hsize_t n = 0;
    H5_CHECK(H5Sget_simple_extent_dims(space, &n, nullptr), ctx, "reading the dimensions");
    const long long block = read_int_attr(ds, "block_samples", ctx);
    if (block < 1 || block > (1LL << 31)) RN_IO_FAIL(ctx, kRecreateHint, "attribute 'block_samples' = {}", block);
    d.block = block;
    if (static_cast<std::int64_t>(n) != d.blocks(in.count))
      RN_IO_FAIL(ctx, kRecreateHint, "{} checksums for {} samples in blocks of {} ({} expected)", n, in.count, block,
                 d.blocks(in.count));
    check_stored(ds, ctx, static_cast<std::int64_t>(n), 4, 0);
    d.checksums.resize(static_cast<std::size_t>(n));
    if (n > 0)
      H5_CHECK(H5Dread(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.checksums.data()), ctx, "reading");
  }
  // JPEG stores: blocks differ in size; their mean decides how many fit.
  const std::int64_t total = in.storage == Storage::jpeg ? in.encoded_bytes : in.count * sb;
  const std::int64_t block_bytes =
      std::max<std::int64_t>(1, in.count > 0 ? total / std::max<std::int64_t>(d.blocks(in.count), 1) : 1);
  d.capacity = total <= budget ? std::max<std::int64_t>(d.blocks(in.count), 1)
                               : std::max<std::int64_t>(2, budget / block_bytes);
}

}  // namespace

namespace {

/// The string attributes, read where HDF5 may crash on them (below).
struct StringAttrs {
  std::string format, storage;
  std::vector<std::string> class_names;
};

/// The version of the HDF5 superblock, found as HDF5 does (at 0, 512, 1024, ...), read by us: -1 when there is none.
/// Version 2 and later checksum all metadata; 0 and 1 (HDF5's default for new files) checksum none of it.
int superblock_version(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const char sig[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  for (std::uint64_t at = 0; at < (std::uint64_t(1) << 30); at = at ? at * 2 : 512) {
    char buf[9] = {0};
    f.seekg(static_cast<std::streamoff>(at));
    if (!f.read(buf, 9)) return -1;
    if (std::memcmp(buf, sig, 8) == 0) return static_cast<unsigned char>(buf[8]);
  }
  return -1;
}

/// A variable-length string attribute where this process must not read one (open_into, vlen_strings false).
struct NeedsChild {};

void open_into(DatasetFile::Impl& m, const std::string& path, std::int64_t cache_budget, const StringAttrs* strings,
               bool vlen_strings);

/// read_strings, unless the attribute is variable-length and this process may not read those.
std::vector<std::string> guarded_strings(const OpenAttr& a, const char* name, const std::string& ctx, bool vlen_strings) {
  if (!vlen_strings && H5Tget_class(a.type) == H5T_STRING && H5Tis_variable_str(a.type) > 0) throw NeedsChild{};
  return read_strings(a, name, ctx);
}

}  // namespace

DatasetFile::DatasetFile(const std::string& path, std::int64_t cache_budget) : m_impl(std::make_unique<Impl>()) {
  const auto lock = hdf5_lock();
  hdf5_init();
  Impl& m = *m_impl;
  m.path = path;
  if (cache_budget < 0) {
    const char* env = std::getenv("RENAISSANCE_DATASET_CACHE_MB");
    cache_budget = std::int64_t(1024) << 20;
    if (env && *env) {
      char* end = nullptr;
      const long long mb = std::strtoll(env, &end, 10);
      RN_CHECK_CTX(end && *end == '\0' && mb >= 0, "RENAISSANCE_DATASET_CACHE_MB",
                   "'{}' is not a non-negative number of MiB", env);
      cache_budget = static_cast<std::int64_t>(mb) << 20;
    }
  }
  std::error_code ec;
  if (!fs::exists(path, ec))
    RN_IO_FAIL(path,
               "check the path; create one with `renaissance data import fashion-mnist|cifar10|cifar100|folder ... "
               "--out FILE`",
               "dataset file not found");
  if (fs::is_directory(path, ec)) RN_IO_FAIL(path, "pass the .h5 file, not its directory", "is a directory");
  // Opened only as a regular file: opening a FIFO blocks until something writes into it (eval, predict, train and
  // data inspect hung there, past RENAISSANCE_HDF5_OPEN_TIMEOUT).
  if (!fs::is_regular_file(path, ec))
    RN_IO_FAIL(path, "pass the dataset's .h5 file", "is not a regular file (a FIFO, socket or device)");

  // HDF5 1.10 parses metadata without checksums (superblock 0/1, the default of h5py and of files before format 2)
  // and variable-length strings (a global heap, never checksummed) without bounds: a corrupt file can crash it
  // inside its own code (an overlapping memcpy in H5HG_read, found by tests/fuzz). Such a file is opened and walked
  // in a child process first (io::run_contained: a crash there is an Error), which also reads the string
  // attributes, so this process never reads a global heap itself. Format 2 files, written with checksummed
  // metadata and fixed-length strings, need no child.
  if (superblock_version(path) >= 2) {
    try {
      open_into(m, path, cache_budget, nullptr, /*vlen_strings=*/false);
      return;
    } catch (const NeedsChild&) {  // checksummed metadata, but variable-length strings (h5py's)
      m_impl = std::make_unique<Impl>();
    }
  }
  Impl& mc = *m_impl;
  const std::string got = run_contained(path, [&] {
    DatasetFile::Impl probe;
    open_into(probe, path, cache_budget, nullptr, /*vlen_strings=*/true);
    std::string out = probe.format_attr + '\0' + probe.storage_attr;
    for (const std::string& n : probe.class_names) out += '\0' + n;
    return out;
  });
  StringAttrs strings;
  std::size_t at = 0;
  const auto next = [&] {
    const auto end = got.find('\0', at);
    std::string v = got.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? got.size() + 1 : end + 1;
    return v;
  };
  strings.format = next();
  strings.storage = next();
  while (at <= got.size()) strings.class_names.push_back(next());
  open_into(mc, path, cache_budget, &strings, /*vlen_strings=*/false);
}

namespace {

void open_into(DatasetFile::Impl& m, const std::string& path, std::int64_t cache_budget, const StringAttrs* strings,
               bool vlen_strings) {
  m.path = path;
  H5Handle fapl(make_file_access_plist(), H5Pclose);
#if H5_VERSION_GE(1, 12, 0)
  const htri_t is_h5 = H5Fis_accessible(path.c_str(), fapl);
#else
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
#endif
  if (is_h5 == 0) RN_IO_FAIL(path, "expected an HDF5 dataset written by `renaissance data import`", "not an HDF5 file");
  if (is_h5 < 0) detail::throw_h5_error(__FILE__, __LINE__, path, "checking the file signature");
  m.file = own(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), path, "opening the file"), H5Fclose);

  const std::vector<std::string> format =
      strings ? std::vector<std::string>{strings->format}
              : guarded_strings(open_attr(m.file, "format", path), "format", path, vlen_strings);
  if (!format.empty()) m.format_attr = format[0];
  if (format.size() != 1 || format[0] != kDatasetFormat)
    RN_IO_FAIL(path, "this is not a Renaissance dataset; create one with `renaissance data import`",
               "format attribute is '{}', expected '{}'", format.empty() ? "" : format[0], kDatasetFormat);
  const long long version = read_int_attr(m.file, "version", path);
  if (version < 1 || version > kDatasetVersion)
    RN_IO_FAIL(path, "upgrade Renaissance or re-import the dataset with this version",
               "unsupported dataset version {} (this build reads versions 1 to {})", version, kDatasetVersion);
  m.version = static_cast<int>(version);
  const long long classes = read_int_attr(m.file, "num_classes", path);
  if (classes < 1 || classes > kMaxClasses)
    RN_IO_FAIL(path, kRecreateHint, "attribute 'num_classes' = {} is not a class count (1 to {})", classes,
               kMaxClasses);
  m.num_classes = static_cast<int>(classes);
  if (m.version >= 3) {  // version 3 says how the images are stored
    const std::vector<std::string> storage =
        strings ? std::vector<std::string>{strings->storage}
                : guarded_strings(open_attr(m.file, "storage", path), "storage", path, vlen_strings);
    if (!storage.empty()) m.storage_attr = storage[0];
    if (storage.size() == 1 && storage[0] == "jpeg")
      m.storage = Storage::jpeg;
    else if (storage.size() != 1 || storage[0] != "raw")
      RN_IO_FAIL(path, kRecreateHint, "attribute 'storage' is '{}', expected 'raw' or 'jpeg'",
                 storage.empty() ? "" : storage[0]);
  }
  if (m.storage == Storage::jpeg) {
    const long long ch = read_int_attr(m.file, "channels", path);
    if (ch != 1 && ch != 3) RN_IO_FAIL(path, kRecreateHint, "attribute 'channels' = {}: a JPEG store has 1 or 3", ch);
    m.jpeg.channels = ch;
    if (H5Aexists(m.file, "jpeg_quality") > 0) {
      const long long q = read_int_attr(m.file, "jpeg_quality", path);
      if (q < 1 || q > 100)
        RN_IO_FAIL(path, kRecreateHint, "attribute 'jpeg_quality' = {}: a JPEG quality is 1 to 100", q);
      m.jpeg.quality = static_cast<int>(q);
    }
    if (H5Aexists(m.file, "max_side") > 0) {
      m.jpeg.max_side = read_int_attr(m.file, "max_side", path);
      if (m.jpeg.max_side < 0)
        RN_IO_FAIL(path, kRecreateHint, "attribute 'max_side' = {}: a side is >= 0 (0: never resized)",
                   m.jpeg.max_side);
    }
  }

  for (Split s : kAllSplits) {
    const int si = static_cast<int>(s);
    const std::string gctx = fmt::format("{}: group '/{}'", path, split_name(s));
    const std::string group = fmt::format("/{}", split_name(s));
    if (!H5_CHECK(H5Lexists(m.file, group.c_str(), H5P_DEFAULT), gctx, "looking for the group"))
      RN_IO_FAIL(path, kRecreateHint, "missing group '{}'", group);
    SplitInfo& info = m.info[si];

    info.storage = m.storage;
    const std::string ictx = ds_ctx(path, s, "images");
    if (m.storage == Storage::jpeg) {
      open_jpeg_split(m, path, s);
    } else {
      m.split[si].images = open_dataset(m.file, path, s, "images");
      H5Handle type(H5_CHECK(H5Dget_type(m.split[si].images), ictx, "reading the type"), H5Tclose);
      if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 1 || H5Tget_sign(type) != H5T_SGN_NONE)
        RN_IO_FAIL(ictx, kRecreateHint, "images have type {}, expected uint8", describe_type(type));
      H5Handle space(H5_CHECK(H5Dget_space(m.split[si].images), ictx, "reading the dataspace"), H5Sclose);
      const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space), ictx, "reading the rank");
      if (rank != 4) RN_IO_FAIL(ictx, kRecreateHint, "images have rank {}, expected 4 [N,H,W,C]", rank);
      hsize_t dims[4];
      H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr), ictx, "reading the dimensions");
      if (dims[1] == 0 || dims[2] == 0 || dims[3] == 0)
        RN_IO_FAIL(ictx, kRecreateHint, "images have an empty sample shape {}x{}x{}", dims[1], dims[2], dims[3]);
      // A header can claim any extent; bound it before any size arithmetic (1 PiB of images: no real split).
      constexpr hsize_t kMaxBytes = hsize_t{1} << 50;
      if (dims[1] > kMaxBytes || dims[2] > kMaxBytes / dims[1] || dims[3] > kMaxBytes / (dims[1] * dims[2]) ||
          dims[0] > kMaxBytes / (dims[1] * dims[2] * dims[3]))
        RN_IO_FAIL(ictx, kRecreateHint, "images claim a shape of {}x{}x{}x{}, more than 1 PiB (corrupt header?)",
                   dims[0], dims[1], dims[2], dims[3]);
      info.count = std::int64_t(dims[0]);
      info.height = std::int64_t(dims[1]);
      info.width = std::int64_t(dims[2]);
      info.channels = std::int64_t(dims[3]);
      read_storage(m.split[si].images, info, ictx);
      check_stored(m.split[si].images, ictx, info.count, info.sample_bytes(), info.chunk_samples);
      // Decoded blocks are cached by us (verified once); HDF5 keeps only a few chunks.
      m.split[si].images = reopen_with_cache(m.file, std::move(m.split[si].images),
                                             fmt::format("/{}/images", split_name(s)), info.count, info.chunk_samples,
                                             info.sample_bytes(), 0, ictx);
    }

    const std::string lctx = ds_ctx(path, s, "labels");
    m.split[si].labels = open_dataset(m.file, path, s, "labels");
    {
      H5Handle type(H5_CHECK(H5Dget_type(m.split[si].labels), lctx, "reading the type"), H5Tclose);
      if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 4 || H5Tget_sign(type) != H5T_SGN_2)
        RN_IO_FAIL(lctx, kRecreateHint, "labels have type {}, expected int32", describe_type(type));
      H5Handle space(H5_CHECK(H5Dget_space(m.split[si].labels), lctx, "reading the dataspace"), H5Sclose);
      const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space), lctx, "reading the rank");
      if (rank != 1) RN_IO_FAIL(lctx, kRecreateHint, "labels have rank {}, expected 1 [N]", rank);
      hsize_t n = 0;
      H5_CHECK(H5Sget_simple_extent_dims(space, &n, nullptr), lctx, "reading the dimensions");
      if (std::int64_t(n) != info.count) RN_IO_FAIL(lctx, kRecreateHint, "{} labels for {} images", n, info.count);
      SplitInfo linfo;
      read_storage(m.split[si].labels, linfo, lctx);
      check_stored(m.split[si].labels, lctx, info.count, 4, linfo.chunk_samples);
      // Labels are small: always cached whole (budget -1 = unlimited).
      m.split[si].labels =
          reopen_with_cache(m.file, std::move(m.split[si].labels), fmt::format("/{}/labels", split_name(s)), info.count,
                            linfo.chunk_samples, 4, std::numeric_limits<std::int64_t>::max(), lctx);
    }
  }
  const SplitInfo& t = m.info[0];
  const SplitInfo& v = m.info[1];
  if (m.storage == Storage::raw && (t.height != v.height || t.width != v.width || t.channels != v.channels))
    RN_IO_FAIL(path, kRecreateHint, "train images are {}x{}x{} but val images are {}x{}x{}", t.height, t.width,
               t.channels, v.height, v.width, v.channels);

  m.mean = read_float_array_attr(m.file, "mean", t.channels, path);
  m.stddev = read_float_array_attr(m.file, "std", t.channels, path);
  // Training normalises by them: a NaN, an infinity or a zero std would turn every input into NaN or inf, and the
  // run would fail much later as a "diverged" loss.
  for (std::size_t ch = 0; ch < m.stddev.size(); ++ch) {
    if (!std::isfinite(m.mean[ch]))
      RN_IO_FAIL(path, kRecreateHint, "attribute 'mean' of channel {} is {}, not a finite number", ch, m.mean[ch]);
    if (!std::isfinite(m.stddev[ch]) || m.stddev[ch] <= 0)
      RN_IO_FAIL(path,
                 m.stddev[ch] == 0 ? "every pixel of that channel has the same value in /train; such a dataset cannot "
                                     "be normalised"
                                   : kRecreateHint,
                 "attribute 'std' of channel {} is {} (a standard deviation must be finite and > 0: training divides "
                 "by it)",
                 ch, m.stddev[ch]);
  }
  for (Split s : kAllSplits) open_blocks(m, s, cache_budget);
  // The size the file has now: a read that later finds it smaller reports the truncation.
  {
    hsize_t size = 0;
    H5_CHECK(H5Fget_filesize(m.file, &size), path, "reading the file size");
    m.file_bytes = static_cast<std::int64_t>(size);
    void* handle = nullptr;
    H5Handle fapl2(H5_CHECK(H5Fget_access_plist(m.file), path, "access properties"), H5Pclose);
    if (H5Pget_driver(fapl2) == H5FD_SEC2 && H5Fget_vfd_handle(m.file, fapl2, &handle) >= 0 && handle)
      m.fd = *static_cast<int*>(handle);
    H5Eclear2(H5E_DEFAULT);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      m.file_bytes = static_cast<std::int64_t>(st.st_size);
      m.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    }
  }
  OpenAttr names = open_attr(m.file, "class_names", path, /*required=*/false);
  if (names.attr.valid()) {
    m.class_names = strings ? strings->class_names : guarded_strings(names, "class_names", path, vlen_strings);
    if (static_cast<int>(m.class_names.size()) != m.num_classes)
      RN_IO_FAIL(path, kRecreateHint, "attribute 'class_names' has {} entries for num_classes = {}",
                 m.class_names.size(), m.num_classes);
  }
}

}  // namespace

DatasetFile::~DatasetFile() = default;
DatasetFile::DatasetFile(DatasetFile&&) noexcept = default;
DatasetFile& DatasetFile::operator=(DatasetFile&&) noexcept = default;

const std::string& DatasetFile::path() const { return m_impl->path; }
int DatasetFile::version() const { return m_impl->version; }
int DatasetFile::num_classes() const { return m_impl->num_classes; }
const std::vector<float>& DatasetFile::mean() const { return m_impl->mean; }
const std::vector<float>& DatasetFile::stddev() const { return m_impl->stddev; }
const std::vector<std::string>& DatasetFile::class_names() const { return m_impl->class_names; }
const SplitInfo& DatasetFile::info(Split split) const { return m_impl->info[static_cast<int>(split)]; }
std::int64_t DatasetFile::sample_bytes() const { return m_impl->info[0].sample_bytes(); }
Storage DatasetFile::storage() const { return m_impl->storage; }
std::int64_t DatasetFile::channels() const { return m_impl->info[0].channels; }
const JpegStoreSpec& DatasetFile::jpeg_spec() const { return m_impl->jpeg; }
const std::vector<std::int32_t>& DatasetFile::jpeg_shapes(Split split) const {
  return m_impl->split[static_cast<int>(split)].shapes;
}

void DatasetFile::read(Split split, std::int64_t start, std::int64_t count, std::uint8_t* images,
                       std::int32_t* labels) const {
  const auto lock = hdf5_lock();
  hdf5_init();
  Impl& m = *m_impl;
  const int si = static_cast<int>(split);
  const SplitInfo& info = m.info[si];
  if (start < 0 || count < 0 || start > info.count || count > info.count - start)
    RN_IO_FAIL(ds_ctx(m.path, split, "images"), "indices run from 0 to the split size - 1",
               "samples [{}, {}) out of range: the split has {} samples", start, start + count, info.count);
  if (count == 0) return;
  if (!images) {  // labels alone (validation, histograms): straight from their dataset
    if (labels)
      rows_io(false, m.split[si].labels, H5T_NATIVE_INT32, start, count, labels, ds_ctx(m.path, split, "labels"),
              rows_what(start, count, 0));
    m.check_size(split, start, count);
    return;
  }
  if (m.storage == Storage::jpeg)
    RN_IO_FAIL(m.path, "a JPEG store's images are read encoded (DatasetFile::read_encoded) and decoded by the loader",
               "samples [{}, {}) of a JPEG store read as raw pixels", start, start + count);
  // Images go through verified blocks: each is read once (whole chunks), checked, and cached.
  const std::string request = rows_what(start, count, info.chunk_samples);
  const std::int64_t sb = info.sample_bytes(), bs = m.split[si].block;
  for (std::int64_t k = start / bs; k <= (start + count - 1) / bs; ++k) {
    const std::shared_ptr<Impl::Block> b = m.block(split, k, request);
    const std::int64_t lo = std::max(start, b->first), hi = std::min(start + count, b->first + b->count);
    std::memcpy(images + (lo - start) * sb, b->images.data() + (lo - b->first) * sb, static_cast<std::size_t>((hi - lo) * sb));
    if (labels) std::copy(b->labels.begin() + (lo - b->first), b->labels.begin() + (hi - b->first), labels + (lo - start));
  }
}

void DatasetFile::read_indices(Split split, const std::vector<std::int64_t>& idx, std::uint8_t* images,
                               std::int32_t* labels) const {
  const Impl& m = *m_impl;
  const SplitInfo& info = m.info[static_cast<int>(split)];
  const size_t n = idx.size();
  for (size_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= info.count)
      RN_IO_FAIL(ds_ctx(m.path, split, "images"), "indices run from 0 to the split size - 1",
                 "index idx[{}] = {} out of range: the split has {} samples", i, idx[i], info.count);
  }
  if (n == 0) return;
  const std::int64_t sb = info.sample_bytes();
  // Sorted by index is sorted by chunk: each chunk is visited once per batch, while it is hot in the cache.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return idx[a] < idx[b]; });
  // Caps the staging buffer when a long run arrives in an order that cannot be read in place.
  const std::int64_t max_run = std::max<std::int64_t>(1, (64 << 20) / sb);
  std::vector<std::uint8_t> stage_images;
  std::vector<std::int32_t> stage_labels;

  // One hyperslab read per run of consecutive indices. (A single read of the union of the runs was measured
  // ~50x slower with HDF5 1.10: irregular selections take a slow path.)
  size_t i = 0;
  while (i < n) {
    const std::int64_t first = idx[order[i]];
    std::int64_t last = first;
    size_t j = i;
    bool in_place = true;  // distinct, and the output positions are consecutive too: read straight into them
    while (j + 1 < n) {
      const std::int64_t next = idx[order[j + 1]];
      if (next != last && (next != last + 1 || next - first >= max_run)) break;
      if (next == last || order[j + 1] != order[j] + 1) in_place = false;
      last = next;
      ++j;
    }
    const std::int64_t run = last - first + 1;
    if (in_place) {
      read(split, first, run, images ? images + order[i] * sb : nullptr, labels ? labels + order[i] : nullptr);
    } else {
      if (images) stage_images.resize(static_cast<size_t>(run * sb));
      if (labels) stage_labels.resize(static_cast<size_t>(run));
      read(split, first, run, images ? stage_images.data() : nullptr, labels ? stage_labels.data() : nullptr);
      for (size_t k = i; k <= j; ++k) {
        const std::int64_t r = idx[order[k]] - first;
        if (images) std::memcpy(images + order[k] * sb, stage_images.data() + r * sb, static_cast<size_t>(sb));
        if (labels) labels[order[k]] = stage_labels[static_cast<size_t>(r)];
      }
    }
    i = j + 1;
  }
}

void DatasetFile::read_encoded(Split split, const std::vector<std::int64_t>& idx, EncodedBatch& out) const {
  const auto lock = hdf5_lock();
  hdf5_init();
  Impl& m = *m_impl;
  const int si = static_cast<int>(split);
  const SplitInfo& info = m.info[si];
  if (m.storage != Storage::jpeg)
    RN_IO_FAIL(m.path, "read a raw store with read()/read_indices()", "read_encoded() on a raw store");
  for (std::size_t i = 0; i < idx.size(); ++i)
    if (idx[i] < 0 || idx[i] >= info.count)
      RN_IO_FAIL(ds_ctx(m.path, split, "jpeg"), "indices run from 0 to the split size - 1",
                 "index idx[{}] = {} out of range: the split has {} samples", i, idx[i], info.count);
  const auto& d = m.split[si];
  std::int64_t total = 0;
  for (std::int64_t i : idx)
    total += d.offsets[static_cast<std::size_t>(i) + 1] - d.offsets[static_cast<std::size_t>(i)];
  out.bytes.resize(static_cast<std::size_t>(total));
  out.offsets.assign(1, 0);
  out.heights.resize(idx.size());
  out.widths.resize(idx.size());
  out.labels.resize(idx.size());
  std::int64_t at = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const std::int64_t j = idx[i];
    const auto u = static_cast<std::size_t>(j);
    const std::shared_ptr<Impl::Block> b = m.block(split, j / d.block, rows_what(j, 1, 0));
    const std::int64_t from = d.offsets[u] - d.offsets[static_cast<std::size_t>(b->first)];
    const std::int64_t len = d.offsets[u + 1] - d.offsets[u];
    std::memcpy(out.bytes.data() + at, b->images.data() + from, static_cast<std::size_t>(len));
    at += len;
    out.offsets.push_back(at);
    out.heights[i] = d.shapes[2 * u];
    out.widths[i] = d.shapes[2 * u + 1];
    out.labels[i] = b->labels[static_cast<std::size_t>(j - b->first)];
  }
}

namespace {
template <typename F>
void for_each_label_block(const DatasetFile& f, Split split, F&& fn) {
  const std::int64_t n = f.size(split);
  const std::int64_t block = 1 << 20;
  std::vector<std::int32_t> buf;
  for (std::int64_t start = 0; start < n; start += block) {
    const std::int64_t count = std::min(block, n - start);
    buf.resize(static_cast<size_t>(count));
    f.read(split, start, count, nullptr, buf.data());
    fn(start, buf);
  }
}
}  // namespace

void DatasetFile::validate_labels(Split split) const {
  const int k = m_impl->num_classes;
  for_each_label_block(*this, split, [&](std::int64_t start, const std::vector<std::int32_t>& buf) {
    for (size_t i = 0; i < buf.size(); ++i) {
      if (buf[i] < 0 || buf[i] >= k)
        RN_IO_FAIL(ds_ctx(m_impl->path, split, "labels"),
                   "labels must match the num_classes attribute; re-import with the right --classes",
                   "label {} at index {} is outside [0, {})", buf[i], start + std::int64_t(i), k);
    }
  });
}

void DatasetFile::validate_labels() const {
  for (Split s : kAllSplits) validate_labels(s);
}

void DatasetFile::verify(Split split) const {
  validate_labels(split);
  const auto lock = hdf5_lock();
  const Impl& m = *m_impl;
  const int si = static_cast<int>(split);
  // Every block once, not cached: each chunk is decompressed and checked (Fletcher32, the file size, the content
  // checksum), and a failure names its samples.
  for (std::int64_t k = 0; k < m.split[si].blocks(m.info[si].count); ++k) (void)m.load(split, k, {}, true);
}

std::uint64_t DatasetFile::content_fingerprint() const {
  const auto lock = hdf5_lock();
  const Impl& m = *m_impl;
  // Two CRC-32s of the same bytes with different starts: 64 bits, so a difference slips by with odds of 2^-64.
  std::uint32_t a = 0, b = 0x9e3779b9u;
  auto add = [&](const void* p, std::size_t n) {
    a = content_crc(a, static_cast<const std::uint8_t*>(p), n);
    b = content_crc(b, static_cast<const std::uint8_t*>(p), n);
  };
  add(&m.version, sizeof m.version);
  add(&m.num_classes, sizeof m.num_classes);
  add(m.mean.data(), m.mean.size() * sizeof(float));
  add(m.stddev.data(), m.stddev.size() * sizeof(float));
  for (Split s : kAllSplits) {
    const int si = static_cast<int>(s);
    const SplitInfo& in = m.info[si];
    const std::int64_t shape[4] = {in.count, in.height, in.width, in.channels};
    add(shape, sizeof shape);
    if (!m.split[si].checksums.empty()) {
      add(m.split[si].checksums.data(), m.split[si].checksums.size() * sizeof(std::uint32_t));
      continue;
    }
    std::vector<std::int32_t> labels;
    for (std::int64_t first = 0; first < in.count; first += 1 << 20) {
      labels.resize(static_cast<std::size_t>(std::min<std::int64_t>(1 << 20, in.count - first)));
      read(s, first, static_cast<std::int64_t>(labels.size()), nullptr, labels.data());
      add(labels.data(), labels.size() * sizeof(std::int32_t));
    }
    const std::int64_t nb = m.split[si].blocks(in.count);
    for (std::int64_t k : {std::int64_t(0), nb - 1}) {
      if (k < 0 || (k == nb - 1 && nb == 1 && k != 0)) continue;
      const auto blk = m.load(s, k, {});
      add(blk->images.data(), blk->images.size());
      if (nb == 1) break;
    }
  }
  return (static_cast<std::uint64_t>(a) << 32) | b;
}

std::vector<std::int64_t> DatasetFile::label_histogram(Split split) const {
  std::vector<std::int64_t> hist(static_cast<size_t>(m_impl->num_classes), 0);
  for_each_label_block(*this, split, [&](std::int64_t, const std::vector<std::int32_t>& buf) {
    for (std::int32_t l : buf)
      if (l >= 0 && l < m_impl->num_classes) ++hist[static_cast<size_t>(l)];
  });
  return hist;
}

}  // namespace renaissance::io
