#include <renaissance/io/hdf5_util.h>

#include <fmt/format.h>

#include <renaissance/core/paths.h>

#include <zlib.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>

/// Weak: present only in sanitizer builds (scripts/sanitize, scripts/fuzz), where run_contained's child clears it.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace renaissance::io {

namespace {

// The user's explicit HDF5_USE_FILE_LOCKING wins; otherwise we set FALSE (shared file systems often lack
// the flock() HDF5 wants, and the dataset is opened read-only by many ranks at once).
bool g_user_set_locking = false;

#if defined(__SANITIZE_ADDRESS__)
#define RN_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RN_UNDER_ASAN 1
#endif
#endif

void init_process() {
  g_user_set_locking = std::getenv("HDF5_USE_FILE_LOCKING") != nullptr;
  if (!g_user_set_locking) setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);
  // No HDF5 clean-up at exit: after a failed close (a full disk) HDF5's exit handler closed the half-closed file
  // again and crashed (SIGSEGV in H5F__close_cb). Every handle of ours is closed by its owner before exit.
  H5dont_atexit();
  H5open();
#ifdef RN_UNDER_ASAN
  // Sanitizer builds (scripts/sanitize, scripts/fuzz): HDF5's free lists hand recycled blocks out again without
  // malloc, so a leak report would name the block's first user instead of the leaking one. No free lists: true
  // allocation stacks, and the narrow HDF5 suppressions in tests/*/lsan.supp can match them.
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
#endif
}

struct WalkState {
  std::vector<std::string> parts;
};

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* err, void* client) {
  auto* st = static_cast<WalkState*>(client);
  std::string text = err->desc ? err->desc : "";
  char minor[256] = {0};
  // H5Eget_msg clears the *default* stack; we walk a copy, so that is harmless.
  if (H5Eget_msg(err->min_num, nullptr, minor, sizeof(minor)) > 0 && text.find(minor) == std::string::npos) {
    text = text.empty() ? std::string(minor) : text + " [" + minor + "]";
  }
  if (!text.empty()) {
    for (const auto& p : st->parts)
      if (p == text) return 0;
    st->parts.push_back(std::move(text));
  }
  return 0;
}

}  // namespace

void hdf5_init() {
  static std::once_flag once;
  std::call_once(once, init_process);
  // Auto-printing is a per-thread setting in thread-safe builds: set it once in each thread.
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

std::unique_lock<std::recursive_mutex> hdf5_lock() {
#ifdef H5_HAVE_THREADSAFE
  return {};
#else
  static std::recursive_mutex mutex;
  return std::unique_lock<std::recursive_mutex>(mutex);
#endif
}

hid_t make_file_access_plist() {
  hdf5_init();
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) detail::throw_h5_error(__FILE__, __LINE__, "HDF5", "creating a file-access property list");
#if H5_VERSION_GE(1, 10, 7)
  if (!g_user_set_locking && H5Pset_file_locking(fapl, false, true) < 0) {
    H5Pclose(fapl);
    detail::throw_h5_error(__FILE__, __LINE__, "HDF5", "turning file locking off");
  }
#endif
  return fapl;
}

std::string hdf5_error_text() {
  hid_t stack = H5Eget_current_stack();  // copies and clears this thread's stack
  if (stack < 0) return {};
  WalkState st;
  H5Ewalk2(stack, H5E_WALK_UPWARD, collect_error, &st);  // innermost (the root cause) first
  H5Eclose_stack(stack);
  H5Eclear2(H5E_DEFAULT);
  std::string out;
  // The innermost few entries say why; the outer ones only repeat "read failed" up the call chain.
  const size_t keep = st.parts.size() < 2 ? st.parts.size() : 2;
  for (size_t i = 0; i < keep; ++i) out += (i ? "; " : "") + st.parts[i];
  return out;
}

bool is_checksum_failure(const std::string& t) {
  return t.find("Fletcher32") != std::string::npos || t.find("fletcher32") != std::string::npos ||
         t.find("checksum") != std::string::npos;
}

namespace {
H5Handle utf8_string_type(std::size_t size) {
  H5Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, size);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}
}  // namespace

void write_string_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& ctx) {
  H5Handle type = utf8_string_type(H5T_VARIABLE);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "create attribute '{}'", name),
                H5Aclose);
  const char* p = value.c_str();
  H5_CHECK(H5Awrite(attr, type, &p), ctx, "write attribute '{}'", name);
}

void write_int_attr(hid_t obj, const std::string& name, std::int64_t value, const std::string& ctx) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "create attribute '{}'", name),
                H5Aclose);
  const long long v = value;
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_LLONG, &v), ctx, "write attribute '{}'", name);
}

void write_f32_array_attr(hid_t obj, const std::string& name, const std::vector<float>& values,
                          const std::string& ctx) {
  const hsize_t n = values.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "create attribute '{}'", name),
                H5Aclose);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_FLOAT, values.data()), ctx, "write attribute '{}'", name);
}

void write_string_array_attr(hid_t obj, const std::string& name, const std::vector<std::string>& values,
                             const std::string& ctx) {
  H5Handle type = utf8_string_type(H5T_VARIABLE);
  const hsize_t n = values.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "create attribute '{}'", name),
                H5Aclose);
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  H5_CHECK(H5Awrite(attr, type, ptrs.data()), ctx, "write attribute '{}'", name);
}

std::string read_attr_text(hid_t obj, const std::string& name, const std::string& ctx) {
  H5Handle attr(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT), ctx, "open attribute '{}'", name), H5Aclose);
  H5Handle type(H5_CHECK(H5Aget_type(attr), ctx, "attribute '{}' type", name), H5Tclose);
  H5Handle space(H5_CHECK(H5Aget_space(attr), ctx, "attribute '{}' space", name), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  RN_CHECK_CTX(n >= 1 && n <= 65536, ctx, "attribute '{}' has {} elements", name, n);
  const bool scalar = H5Sget_simple_extent_type(space) == H5S_SCALAR;
  auto join = [&](std::vector<std::string> parts, bool quote) {
    if (scalar) return parts[0];
    std::string out = "[";
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + (quote ? "\"" + parts[i] + "\"" : parts[i]);
    return out + "]";
  };
  const auto count = static_cast<std::size_t>(n);
  switch (H5Tget_class(type)) {
    case H5T_STRING: {
      std::vector<std::string> parts;
      if (H5Tis_variable_str(type) > 0) {
        H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(mem, H5T_VARIABLE);
        H5Tset_cset(mem, H5Tget_cset(type));
        std::vector<char*> v(count, nullptr);
        H5_CHECK(H5Aread(attr, mem, v.data()), ctx, "read attribute '{}'", name);
        for (char* p : v) parts.emplace_back(p ? p : "");
        H5Dvlen_reclaim(mem, space, H5P_DEFAULT, v.data());
      } else {
        const std::size_t size = H5Tget_size(type);
        RN_CHECK_CTX(size >= 1 && size <= (std::size_t(1) << 26), ctx, "attribute '{}': string size {}", name, size);
        std::string buf(size * count, '\0');
        H5_CHECK(H5Aread(attr, type, buf.data()), ctx, "read attribute '{}'", name);
        for (std::size_t i = 0; i < count; ++i) {
          std::string one = buf.substr(i * size, size);
          parts.push_back(one.substr(0, one.find('\0')));
        }
      }
      return join(parts, true);
    }
    case H5T_INTEGER: {
      std::vector<std::string> parts;
      if (H5Tget_sign(type) == H5T_SGN_NONE) {
        std::vector<unsigned long long> v(count);
        H5_CHECK(H5Aread(attr, H5T_NATIVE_ULLONG, v.data()), ctx, "read attribute '{}'", name);
        for (auto x : v) parts.push_back(std::to_string(x));
      } else {
        std::vector<long long> v(count);
        H5_CHECK(H5Aread(attr, H5T_NATIVE_LLONG, v.data()), ctx, "read attribute '{}'", name);
        for (auto x : v) parts.push_back(std::to_string(x));
      }
      return join(parts, false);
    }
    case H5T_FLOAT: {
      std::vector<double> v(count);
      H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()), ctx, "read attribute '{}'", name);
      std::vector<std::string> parts;
      for (double x : v) parts.push_back(fmt::format("{}", x));
      return join(parts, false);
    }
    default: return "<unsupported type>";
  }
}

const char* tensor_layout(std::int64_t n, std::int64_t h, std::int64_t w) {
  return n == 1 && h == 1 && w == 1 ? "[C]" : "OHWI";
}

void write_f32_dataset(hid_t parent, const std::string& name, const std::vector<hsize_t>& dims, const float* values,
                       const std::string& ctx, const char* layout) {
  H5Handle space(H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), ctx, "dataspace"),
                 H5Sclose);
  H5Handle dcpl = untimed_plist(H5P_DATASET_CREATE, ctx);
  std::vector<hsize_t> chunk(dims);
  for (hsize_t& c : chunk) c = std::max<hsize_t>(c, 1);  // filters need chunks; a chunk dimension cannot be 0
  H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), ctx, "chunking");
  H5_CHECK(H5Pset_fletcher32(dcpl), ctx, "checksum filter");
  H5Handle ds(H5_CHECK(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), ctx,
                       "create dataset"),
              H5Dclose);
  H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), ctx, "write");
  if (layout) write_string_attr(ds, "layout", layout, ctx);
}

H5Handle untimed_plist(hid_t cls, const std::string& ctx) {
  H5Handle p(H5_CHECK(H5Pcreate(cls), ctx, "creating a property list"), H5Pclose);
  H5_CHECK(H5Pset_obj_track_times(p, false), ctx, "turning off object times");
  return p;
}

int fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return errno;
  const int err = ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  return err;
}

// ---- files written in memory, with a checksum header --------------------------------------------------------------

namespace {

constexpr std::size_t kHeaderFixed = 40;

std::uint32_t crc32_of(const std::uint8_t* p, std::size_t n) {
  return static_cast<std::uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), p, n));
}

template <typename T>
void put_le(std::vector<std::uint8_t>& b, std::size_t at, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    b[at + i] = static_cast<std::uint8_t>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
}
template <typename T>
T get_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

std::string host_name() {
  char h[256] = {0};
  if (::gethostname(h, sizeof h - 1) != 0 || !h[0]) return "localhost";
  std::string s(h);
  for (char& c : s)
    if (c == '/' || c == '-') c = '_';  // the pid follows the last '-'
  return s;
}

/// "disk full" and friends, in words a user acts on.
std::string describe_write_errno(int err) {
  switch (err) {
    case ENOSPC: return "no space left on device (the disk is full)";
    case EDQUOT: return "disk quota exceeded";
    case EFBIG: return "file too large (a file-size limit, ulimit -f?)";
    default: return std::strerror(err);
  }
}

}  // namespace

/// The core driver's file-image callbacks: HDF5 allocates the image through them and, when the file closes, hands
/// the final buffer to image_free, which keeps it instead of freeing it.
struct MemoryH5File::Capture {
  void* kept = nullptr;
  static void* alloc(size_t size, H5FD_file_image_op_t, void*) { return std::malloc(size); }
  static void* copy(void* dst, const void* src, size_t size, H5FD_file_image_op_t, void*) {
    return std::memcpy(dst, src, size);
  }
  static void* grow(void* ptr, size_t size, H5FD_file_image_op_t, void*) { return std::realloc(ptr, size); }
  static herr_t release(void* ptr, H5FD_file_image_op_t op, void* udata) {
    auto* c = static_cast<Capture*>(udata);
    if (op == H5FD_FILE_IMAGE_OP_FILE_CLOSE && c && !c->kept) {
      c->kept = ptr;
      return 0;
    }
    std::free(ptr);
    return 0;
  }
  static void* udata_copy(void* u) { return u; }
  static herr_t udata_free(void*) { return 0; }
  ~Capture() { std::free(kept); }
};

MemoryH5File::MemoryH5File(std::string ctx) : m_ctx(std::move(ctx)), m_capture(std::make_unique<Capture>()) {
  hdf5_init();
  m_fapl = H5Handle(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), m_ctx, "file-access properties"), H5Pclose);
  H5_CHECK(H5Pset_fapl_core(m_fapl, std::size_t(1) << 20, 0), m_ctx, "the in-memory driver");
  // Checksummed metadata (superblock 2, object header 2: HDF5 1.8 and later), as h5py reads it.
  H5_CHECK(H5Pset_libver_bounds(m_fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST), m_ctx, "format version bounds");
  H5FD_file_image_callbacks_t cb{&Capture::alloc,      &Capture::copy,       &Capture::grow, &Capture::release,
                                 &Capture::udata_copy, &Capture::udata_free, m_capture.get()};
  H5_CHECK(H5Pset_file_image_callbacks(m_fapl, &cb), m_ctx, "file-image callbacks");
  const std::string name = fmt::format("{}#image-{}", m_ctx, static_cast<const void*>(this));  // never a file on disk
  const H5Handle fcpl = untimed_plist(H5P_FILE_CREATE, m_ctx);  // the root group's object header too
  m_file = H5Handle(H5_CHECK(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, fcpl, m_fapl), m_ctx, "create (in memory)"),
                    H5Fclose);
}

MemoryH5File::~MemoryH5File() {
  m_file.reset();
  m_fapl.reset();
}

std::vector<std::uint8_t> MemoryH5File::finish(const std::vector<std::string>& tensors) {
  struct Span {
    std::string name;
    std::uint64_t addr, size;
  };
  std::vector<Span> spans;
  for (const std::string& t : tensors) {
    H5Handle ds(H5_CHECK(H5Dopen2(m_file, t.c_str(), H5P_DEFAULT), m_ctx + ": " + t, "open"), H5Dclose);
    H5Handle space(H5_CHECK(H5Dget_space(ds), m_ctx + ": " + t, "dataspace"), H5Sclose);
    hsize_t origin[H5S_MAX_RANK] = {0};
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    // One chunk per tensor (write_f32_dataset); an empty tensor has none.
    if (H5Dget_chunk_info_by_coord(ds, origin, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF) {
      H5Eclear2(H5E_DEFAULT);
      continue;
    }
    spans.push_back({t, static_cast<std::uint64_t>(addr), static_cast<std::uint64_t>(size)});
  }
  H5_CHECK(H5Fflush(m_file, H5F_SCOPE_GLOBAL), m_ctx, "flush (in memory)");
  RN_CHECK_CTX(m_file.reset() >= 0, m_ctx, "closing the in-memory file failed");
  m_fapl.reset();
  const auto* img = static_cast<const std::uint8_t*>(m_capture->kept);
  RN_CHECK_CTX(img, m_ctx, "internal: HDF5 returned no file image");
  // The image's size is the end-of-file address in its superblock (version 2 or 3, 8-byte addresses): the buffer
  // itself is allocated in increments.
  RN_CHECK_CTX(img[8] >= 2 && img[9] == 8, m_ctx, "internal: unexpected superblock version {}", int(img[8]));
  const std::uint64_t image_bytes = get_le<std::uint64_t>(img + 28);
  std::size_t table = 0;
  for (const Span& sp : spans) table += 8 + 8 + 4 + 2 + sp.name.size();
  std::size_t header = 512;
  while (header < kHeaderFixed + table) header *= 2;
  std::vector<std::uint8_t> out(header + image_bytes, 0);
  std::memcpy(out.data() + header, img, image_bytes);
  std::free(m_capture->kept);
  m_capture->kept = nullptr;
  std::memcpy(out.data(), kChecksumMagic, 8);
  put_le<std::uint32_t>(out, 8, static_cast<std::uint32_t>(header));
  put_le<std::uint32_t>(out, 12, static_cast<std::uint32_t>(spans.size()));
  put_le<std::uint64_t>(out, 16, out.size());
  put_le<std::uint32_t>(out, 24, crc32_of(out.data() + header, image_bytes));
  put_le<std::uint32_t>(out, 28, static_cast<std::uint32_t>(table));
  std::size_t at = kHeaderFixed;
  for (const Span& sp : spans) {
    const std::uint64_t off = header + sp.addr;
    RN_CHECK_CTX(off + sp.size <= out.size(), m_ctx, "internal: tensor {} lies outside the image", sp.name);
    put_le<std::uint64_t>(out, at, off);
    put_le<std::uint64_t>(out, at + 8, sp.size);
    put_le<std::uint32_t>(out, at + 16, crc32_of(out.data() + off, sp.size));
    put_le<std::uint16_t>(out, at + 20, static_cast<std::uint16_t>(sp.name.size()));
    std::memcpy(out.data() + at + 22, sp.name.data(), sp.name.size());
    at += 22 + sp.name.size();
  }
  put_le<std::uint32_t>(out, 32, crc32_of(out.data() + kHeaderFixed, table));
  put_le<std::uint32_t>(out, 36, crc32_of(out.data(), 36));
  return out;
}

std::string data_file_kind(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {};
  struct stat st {};
  std::uint8_t head[16] = {0};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const ssize_t got = regular ? ::pread(fd, head, sizeof head, 0) : -1;
  ::close(fd);
  if (got != static_cast<ssize_t>(sizeof head)) return {};
  static constexpr std::uint8_t kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (std::memcmp(head, kHdf5Signature, 8) == 0) return "an HDF5 file";
  if (std::memcmp(head, kChecksumMagic, 8) != 0) return {};
  return get_le<std::uint32_t>(head + 12) > 0 ? "a checkpoint or weights file" : "a file with a checksum header";
}

VerifiedFile read_verified_file(const std::string& path, std::vector<ChecksumEntry>* entries) {
  VerifiedFile v;
  require_input_file(path, "file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RN_CHECK_CTX(fd >= 0, path, "cannot open: {}", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::uint8_t head[kHeaderFixed] = {0};
  const ssize_t got = ::pread(fd, head, sizeof head, 0);
  if (got < static_cast<ssize_t>(sizeof head) || std::memcmp(head, kChecksumMagic, 8) != 0) return v;  // format 1
  struct stat st {};
  RN_CHECK_CTX(::fstat(fd, &st) == 0, path, "cannot stat: {}", std::strerror(errno));
  const std::uint64_t actual = static_cast<std::uint64_t>(st.st_size);
  const std::uint32_t header = get_le<std::uint32_t>(head + 8);
  const std::uint64_t want = get_le<std::uint64_t>(head + 16);
  const std::uint32_t table = get_le<std::uint32_t>(head + 28);
  const char* kHint = "the file is corrupted or truncated; use an older checkpoint or re-create it";
  if (get_le<std::uint32_t>(head + 36) != crc32_of(head, 36) || header < 512 || (header & (header - 1)) != 0 ||
      kHeaderFixed + table > header || want < header)
    RN_IO_FAIL(path, kHint, "the checksum header is corrupted");
  if (actual != want)
    RN_IO_FAIL(path, kHint, "the file has {} bytes but was written with {} ({})", actual, want,
               actual < want ? "truncated" : "bytes were appended");
  v.bytes.resize(static_cast<std::size_t>(actual));
  std::size_t done = 0;
  while (done < v.bytes.size()) {
    const ssize_t r = ::pread(fd, v.bytes.data() + done, v.bytes.size() - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    RN_CHECK_CTX(r > 0, path, "read failed after {} of {} bytes: {}", done, v.bytes.size(),
                 r == 0 ? "the file shrank" : std::strerror(errno));
    done += static_cast<std::size_t>(r);
  }
  const std::uint8_t* b = v.bytes.data();
  if (std::memcmp(b, head, kHeaderFixed) != 0) RN_IO_FAIL(path, kHint, "the file changed while it was read");
  if (get_le<std::uint32_t>(b + 32) != crc32_of(b + kHeaderFixed, table))
    RN_IO_FAIL(path, kHint, "the checksum table in the header is corrupted");
  if (get_le<std::uint32_t>(b + 24) != crc32_of(b + header, v.bytes.size() - header)) {
    // Which tensor? Each entry checks one tensor's stored bytes; none failing means the HDF5 metadata changed.
    std::size_t at = kHeaderFixed;
    std::string first_bad, detail;
    for (std::uint32_t i = 0, n = get_le<std::uint32_t>(b + 12); i < n && at + 22 <= kHeaderFixed + table; ++i) {
      const std::uint64_t off = get_le<std::uint64_t>(b + at), len = get_le<std::uint64_t>(b + at + 8);
      const std::uint32_t crc = get_le<std::uint32_t>(b + at + 16);
      const std::size_t nlen = get_le<std::uint16_t>(b + at + 20);
      if (at + 22 + nlen > kHeaderFixed + table) break;
      const std::string name(reinterpret_cast<const char*>(b + at + 22), nlen);
      at += 22 + nlen;
      const bool in_file = off >= header && off <= v.bytes.size() && len <= v.bytes.size() - off;
      const bool ok = in_file && crc32_of(b + off, len) == crc;
      if (entries) entries->push_back({name, ok});
      if (ok || !first_bad.empty()) continue;
      first_bad = name;
      std::size_t zeros = 0;
      for (std::uint64_t k = 0; in_file && k < len; ++k) zeros += b[off + k] == 0;
      detail =
          fmt::format("the tensor's stored bytes [{}, {}) of the file fail their content checksum{}", off, off + len,
                      in_file && zeros == len ? " (they are all zero: a zeroed or never-written chunk)" : "");
    }
    if (!first_bad.empty()) RN_IO_FAIL(path + ": " + first_bad, kHint, "{}", detail);
    RN_IO_FAIL(path, kHint, "the file fails its content checksum outside every tensor (corrupted HDF5 metadata)");
  }
  v.checksummed = true;
  v.image_offset = header;
  return v;
}

H5Handle open_verified(const VerifiedFile& f, const std::string& path) {
  hdf5_init();
  H5Handle fapl(make_file_access_plist(), H5Pclose);
  if (!f.checksummed)
    return H5Handle(
        H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), path, "open (not an HDF5 file, or truncated?)"),
        H5Fclose);
  H5_CHECK(H5Pset_fapl_core(fapl, std::size_t(1) << 20, 0), path, "the in-memory driver");
  H5_CHECK(H5Pset_file_image(fapl, const_cast<std::uint8_t*>(f.bytes.data() + f.image_offset),
                             f.bytes.size() - f.image_offset),
           path, "the file image");
  // A name that is no file on disk: the core driver would otherwise look at the file of that name.
  const std::string name = fmt::format("{}#verified-image-{}", path, static_cast<const void*>(f.bytes.data()));
  return H5Handle(H5_CHECK(H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl), path, "open (in memory)"), H5Fclose);
}

std::string run_contained(const std::string& path, const std::function<std::string()>& fn) {
  int fds[2];
  RN_CHECK_CTX(::pipe(fds) == 0, path, "pipe: {}", std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    RN_FAIL_CTX(path, "fork: {}", std::strerror(errno));
  }
  if (pid == 0) {  // the child: one byte of outcome, then the payload or the error text; _exit (no atexit, no LSan)
    ::close(fds[0]);
    // A crash here must end just this process, as a plain signal the parent reports: no crash handler inherited
    // from a sanitizer or a fuzzer (libFuzzer would save the input as its own crash) may run.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
    if (&__sanitizer_set_death_callback) __sanitizer_set_death_callback(nullptr);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
    std::string out;
    char outcome = 'O';
    try {
      out = fn();
    } catch (const std::exception& e) {
      outcome = 'E';
      out = e.what();
    }
    auto put = [&](const void* p, std::size_t n) {
      const char* c = static_cast<const char*>(p);
      while (n > 0) {
        const ssize_t w = ::write(fds[1], c, n);
        if (w <= 0) ::_exit(3);
        c += w;
        n -= static_cast<std::size_t>(w);
      }
    };
    put(&outcome, 1);
    put(out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  // A deadline: HDF5 can loop forever on corrupt metadata (found by fuzz_dataset), and a hang is worse than an
  // error. RENAISSANCE_HDF5_OPEN_TIMEOUT (seconds, default 60; the fuzz script sets less) bounds the child.
  double limit_s = 60;
  if (const char* e = std::getenv("RENAISSANCE_HDF5_OPEN_TIMEOUT"); e && std::atof(e) > 0) limit_s = std::atof(e);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  std::string got;
  char buf[65536];
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int pr = ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) continue;
    const ssize_t r = ::read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fds[0]);
  if (timed_out) {
    ::kill(pid, SIGKILL);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    RN_IO_FAIL(path, "the file is corrupted; use an older checkpoint or re-create it",
               "HDF5 did not finish reading this file's metadata in {:g} s (RENAISSANCE_HDF5_OPEN_TIMEOUT): its "
               "metadata is corrupt, or the file system stalls",
               limit_s);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || got.empty())
    RN_IO_FAIL(path, "the file is corrupted; use an older checkpoint or re-create it",
               "HDF5 crashed reading this file ({}): its metadata is corrupt (nothing checksums it before HDF5 reads "
               "it: a file of format 1, or written by another tool)",
               WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status)) : std::string("no answer"));
  if (got[0] == 'E') throw Error(got.substr(1));
  return got.substr(1);
}

std::string temporary_name(const std::string& path) {
  return fmt::format("{}.tmp-{}-{}", path, host_name(), static_cast<long>(::getpid()));
}

void require_finite(const std::vector<float>& values, const std::string& ctx) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      RN_FAIL_CTX(ctx, "holds a non-finite value ({} at element {}): written by a diverged run, or damaged", values[i],
                  i);
}

void require_hard_link(hid_t group, const std::string& name, const std::string& ctx) {
#if H5_VERSION_GE(1, 12, 0)
  H5L_info2_t li;
  H5_CHECK(H5Lget_info2(group, name.c_str(), &li, H5P_DEFAULT), ctx, "link info");
#else
  H5L_info_t li;
  H5_CHECK(H5Lget_info(group, name.c_str(), &li, H5P_DEFAULT), ctx, "link info");
#endif
  RN_CHECK_CTX(li.type == H5L_TYPE_HARD, ctx, "a {} link, not a tensor of its own (edited by another tool?)",
               li.type == H5L_TYPE_SOFT       ? "soft"
               : li.type == H5L_TYPE_EXTERNAL ? "external"
                                              : "user-defined");
}

void require_plain_stored_tensor(hid_t ds, const std::string& ctx) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t oi;
  H5_CHECK(H5Oget_info3(ds, &oi, H5O_INFO_BASIC), ctx, "object info");
#else
  H5O_info_t oi;
  H5_CHECK(H5Oget_info2(ds, &oi, H5O_INFO_BASIC), ctx, "object info");
#endif
  RN_CHECK_CTX(oi.rc == 1, ctx, "the same dataset as another name of the file ({} names; edited by another tool?)",
               oi.rc);
  H5Handle type(H5_CHECK(H5Dget_type(ds), ctx, "type"), H5Tclose);
  RN_CHECK_CTX(H5Tget_class(type) == H5T_FLOAT, ctx, "the tensor is not floating point");
  H5Handle dcpl(H5_CHECK(H5Dget_create_plist(ds), ctx, "creation properties"), H5Pclose);
  if (H5Pget_layout(dcpl) != H5D_CHUNKED) return;  // contiguous or compact: the caller's byte count decides
  H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "dataspace"), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  RN_CHECK_CTX(rank >= 1 && rank <= 8, ctx, "the tensor has rank {}", rank);
  hsize_t dims[8] = {0}, cdims[8] = {0};
  H5Sget_simple_extent_dims(space, dims, nullptr);
  H5_CHECK(H5Pget_chunk(dcpl, rank, cdims), ctx, "chunk shape");
  hsize_t expected = 1;
  for (int i = 0; i < rank; ++i) {
    RN_CHECK_CTX(cdims[i] > 0, ctx, "a chunk dimension of 0");
    expected *= (dims[i] + cdims[i] - 1) / cdims[i];
  }
  hsize_t stored = 0;
  H5_CHECK(H5Dget_num_chunks(ds, space, &stored), ctx, "chunk count");
  RN_CHECK_CTX(stored >= expected, ctx,
               "only {} of its {} chunks are stored (a chunk never written reads as the fill value: a truncated or "
               "edited file)",
               stored, expected);
}

void require_valid_statistics(const std::string& name, const std::vector<float>& values, const std::string& ctx) {
  const std::string suffix = ".running_var";
  if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] < 0.0f)
      RN_FAIL_CTX(ctx, "a running variance of {} at element {}: a variance is never negative (a damaged file)",
                  values[i], i);
}

bool is_stale_temporary(const std::string& filename) {
  const auto at = filename.rfind(".tmp-");
  if (at == std::string::npos) return false;
  const std::string tail = filename.substr(at + 5);
  const auto dash = tail.rfind('-');
  const std::string host = dash == std::string::npos ? host_name() : tail.substr(0, dash);
  const std::string pid_text = dash == std::string::npos ? tail : tail.substr(dash + 1);
  if (host != host_name() || pid_text.empty() || pid_text.size() > 9 ||
      pid_text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const long pid = std::stol(pid_text);
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".tmp-";
  std::error_code ec;
  // Exactly "<this host>-<pid>" after the prefix, as temporary_name() writes it: the PID-only form of old checkpoint
  // temporaries, accepted in checkpoint directories, matched user files here ("run.h5.tmp-20261207" and
  // "run.h5.tmp-x.tmp-4000000" beside --out run.h5 were removed).
  const std::string host = host_name() + "-";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code rec;
    if (name.size() > prefix.size() + host.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        name.compare(prefix.size(), host.size(), host) == 0 &&
        name.find_first_not_of("0123456789", prefix.size() + host.size()) == std::string::npos &&
        is_stale_temporary(name) && it->is_regular_file(rec))
      fs::remove(it->path(), rec);
  }
}

namespace {

// The interrupt handler's list: a path is written, then its slot published (release); the handler reads published
// slots only. Lock-free atomics and unlink() are async-signal-safe.
struct TemporarySlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 published
  char path[PATH_MAX] = {};
};
TemporarySlot g_temporaries[InterruptibleTemporary::kMaxTemporaries];

extern "C" void on_interrupt_remove_temporaries(int sig) {
  const int saved = errno;
  for (TemporarySlot& t : g_temporaries)
    if (t.state.load(std::memory_order_acquire) == 2) ::unlink(t.path);
  errno = saved;
  // SA_RESETHAND restored the default action and SA_NODEFER leaves the signal unblocked: this ends the process as
  // the signal would have without the handler.
  ::raise(sig);
}

}  // namespace

InterruptibleTemporary::InterruptibleTemporary(const std::string& path) {
  if (path.size() >= PATH_MAX) return;
  for (int i = 0; i < kMaxTemporaries; ++i) {
    int free = 0;
    if (!g_temporaries[i].state.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) continue;
    std::memcpy(g_temporaries[i].path, path.c_str(), path.size() + 1);
    g_temporaries[i].state.store(2, std::memory_order_release);
    m_slot = i;
    return;
  }
}

InterruptibleTemporary::~InterruptibleTemporary() {
  if (m_slot >= 0) g_temporaries[m_slot].state.store(0, std::memory_order_release);
}

void install_interrupt_cleanup() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction was {};
    if (sigaction(sig, nullptr, &was) != 0 || was.sa_handler != SIG_DFL || (was.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt_remove_temporaries;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigaction(sig, &sa, nullptr);
  }
}

void write_file_atomically(const std::string& path, const std::vector<std::uint8_t>& bytes,
                           const std::function<void()>& halfway) {
  const std::string target = resolve_output_file(path, "output", /*probe=*/false);  // the temporary is the probe
  remove_stale_temporaries(target);
  const std::string tmp = temporary_name(target);
  const InterruptibleTemporary interruptible(tmp);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RN_CHECK_CTX(fd >= 0, path, "cannot create '{}': {}", tmp, describe_write_errno(errno));
  auto fail = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    RN_FAIL_CTX(path, "{} failed: {}", what, describe_write_errno(err));
  };
  // Half, fsync, the test hook, the rest: a process killed in the hook leaves a partial temporary, never a file
  // under the final name.
  const std::size_t half = halfway ? bytes.size() / 2 : bytes.size();
  std::size_t done = 0;
  for (int part = 0; part < 2; ++part) {
    const std::size_t end = part == 0 ? half : bytes.size();
    while (done < end) {
      const ssize_t w = ::write(fd, bytes.data() + done, std::min<std::size_t>(end - done, std::size_t(8) << 20));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        fail(fmt::format("writing '{}' ({} of {} bytes written)", tmp, done, bytes.size()), w < 0 ? errno : ENOSPC);
      done += static_cast<std::size_t>(w);
    }
    if (part == 0 && halfway) {
      ::fsync(fd);
      halfway();
    }
  }
  if (::fsync(fd) != 0) fail("fsync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    RN_FAIL_CTX(path, "closing '{}' failed: {}", tmp, describe_write_errno(err));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    RN_FAIL_CTX(path, "renaming '{}' into place failed: {}", tmp, std::strerror(err));
  }
  fsync_path(std::filesystem::absolute(target).parent_path().string(), true);
}

namespace detail {

void throw_h5_error(const char* file, int line, const std::string& context, const std::string& what, std::string hint) {
  std::string h5 = hdf5_error_text();
  // HDF5's file-driver failures carry a multi-line dump ("file write failed: time = ..., errno = 28, error message =
  // 'No space left on device', buf = 0x...") of which the errno is what a user needs.
  if (const auto e = h5.find("errno = "); e != std::string::npos && h5.find("file ") != std::string::npos) {
    const int err = std::atoi(h5.c_str() + e + 8);
    const bool write = h5.find("write failed") != std::string::npos;
    h5 = fmt::format("{} {}", write ? "writing the file failed:" : "reading the file failed:",
                     err > 0 ? describe_write_errno(err) : std::string("unknown error"));
  }
  // HDF5 out of memory (a ulimit -v, a job's memory limit): "memory allocation failed for chunk", "unable to allocate
  // memory block". Said as what it is by main, and never taken for a bad file (a resume skipped valid checkpoints as
  // invalid and started afresh).
  if (h5.find("memory allocation failed") != std::string::npos ||
      h5.find("unable to allocate memory block") != std::string::npos)
    throw std::bad_alloc();
  if (hint.empty()) {
    if (h5.find("metadata checksum") != std::string::npos)
      hint = "the file is corrupted (its metadata failed a checksum); re-create or re-copy it";
    else if (is_checksum_failure(h5))
      hint = "the file is corrupted (a chunk failed its Fletcher32 checksum); re-create or re-copy it";
    else if (h5.find("truncated") != std::string::npos)
      hint = "the file is truncated (an interrupted copy or download?); re-create or re-copy it";
  }
  std::string msg = h5.empty() ? what + " failed" : what + " failed: " + h5;
  throw Error(std::move(msg), context, std::move(hint), fmt::format("{}:{}", file, line));
}

void throw_hinted(const char* file, int line, const std::string& context, std::string message, std::string hint) {
  throw Error(std::move(message), context, std::move(hint), fmt::format("{}:{}", file, line));
}

}  // namespace detail

}  // namespace renaissance::io
