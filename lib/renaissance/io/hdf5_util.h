// Thin layer over the HDF5 C API: RAII handles, failures turned into renaissance::Error, and the
// process-wide settings (no error-stack printing, file locking off) every HDF5 user of ours needs.
#pragma once

#include <renaissance/core/error.h>

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::io {

/// Call before the first HDF5 call in every thread (cheap after the first time): silences HDF5's own
/// error printing (per thread in thread-safe builds, hence per thread) and turns file locking off
/// (env HDF5_USE_FILE_LOCKING=FALSE unless the user set it), which NFS/Lustre/GPFS need.
void hdf5_init();

/// Serialises HDF5 use inside this process when the library is not thread-safe (Spack's hdf5 defaults to
/// ~threadsafe): hold it around every HDF5 call sequence that may run beside another thread's (the BatchLoader
/// thread reads while the main thread writes a checkpoint). A no-op lock with a thread-safe HDF5.
std::unique_lock<std::recursive_mutex> hdf5_lock();

/// A file-access property list with file locking off (unless the user's env asks for it).
hid_t make_file_access_plist();

/// The HDF5 error stack of this thread as one line (innermost cause first), then cleared.
/// Empty when the stack is empty.
std::string hdf5_error_text();

/// True when the last failure text says a filter (Fletcher32) detected corrupt data.
bool is_checksum_failure(const std::string& hdf5_text);

/// Owns one hid_t and closes it with the matching H5*close; movable, not copyable.
class H5Handle {
 public:
  using CloseFn = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, CloseFn close) : m_id(id), m_close(close) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& o) noexcept : m_id(std::exchange(o.m_id, H5I_INVALID_HID)), m_close(o.m_close) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      m_id = std::exchange(o.m_id, H5I_INVALID_HID);
      m_close = o.m_close;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;

  hid_t get() const { return m_id; }
  operator hid_t() const { return m_id; }  // NOLINT: handles are passed straight to the C API
  bool valid() const { return m_id >= 0; }
  /// Closes now; a failed close is reported through the return value (destructors must not throw).
  herr_t reset() noexcept {
    herr_t r = 0;
    if (m_id >= 0 && m_close) r = m_close(m_id);
    m_id = H5I_INVALID_HID;
    if (r < 0) H5Eclear2(H5E_DEFAULT);
    return r;
  }

 private:
  hid_t m_id = H5I_INVALID_HID;
  CloseFn m_close = nullptr;
};

/// Writes a scalar variable-length UTF-8 string attribute (every file of ours since issue 17, like the datasets;
/// h5py reads it as str). Readers still accept the fixed-length ASCII strings older files hold.
void write_string_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& ctx);
/// A scalar 64-bit signed integer attribute.
void write_int_attr(hid_t obj, const std::string& name, std::int64_t value, const std::string& ctx);
/// A 1-D attribute of doubles (written as 64-bit floats) or floats (32-bit), e.g. a dataset's mean/std.
void write_f32_array_attr(hid_t obj, const std::string& name, const std::vector<float>& values, const std::string& ctx);
/// A 1-D attribute of variable-length UTF-8 strings (class names).
void write_string_array_attr(hid_t obj, const std::string& name, const std::vector<std::string>& values,
                             const std::string& ctx);
/// Any attribute as text: strings (fixed or variable length), integers, floats; 1-D arrays as "[a, b]" (strings
/// quoted in arrays). For inspection and for attributes that changed type between versions.
std::string read_attr_text(hid_t obj, const std::string& name, const std::string& ctx);

/// Every value finite (checkpoint and weights tensors as read): a NaN or an infinity, written by a diverged run or
/// left by damage to a format 1 file (no checksums), would make every result NaN. Throws Error at `ctx` naming the
/// first such value and its element.
void require_finite(const std::vector<float>& values, const std::string& ctx);

/// For files HDF5 reads without our checksum header (format 1 checkpoints and weights; harmless on the others), a
/// tensor as our writers make it. Before it is opened: `name` of `group` is a hard link (a soft or external link made
/// one tensor silently another's, or another file's: a FIFO there stalled the reader).
void require_hard_link(hid_t group, const std::string& name, const std::string& ctx);
/// Once opened: no second name of another tensor, a floating-point type, and every chunk stored (a chunk never
/// written reads as the fill value; a byte count let an edge chunk or a fill-value quarter through). Errors name ctx.
void require_plain_stored_tensor(hid_t ds, const std::string& ctx);
/// A BN running variance (a tensor named "*.running_var") must be >= 0: a negative one made every normalised value
/// NaN, which the ReLU after it turned into zeros, so an evaluation returned a plausible-looking, meaningless score.
void require_valid_statistics(const std::string& name, const std::vector<float>& values, const std::string& ctx);
/// The memory layout of a tensor stored as [N, H, W, C]: "[C]" for a vector (1x1x1xC: BN parameters and statistics,
/// biases), else "OHWI" (convolution weights; FC weights as [out, 1, 1, in]).
const char* tensor_layout(std::int64_t n, std::int64_t h, std::int64_t w);
/// One FP32 dataset of shape `dims`, chunked (one chunk) with the Fletcher32 filter, so corruption is detected on
/// read. `layout` (optional): its "layout" attribute (tensor_layout).
void write_f32_dataset(hid_t parent, const std::string& name, const std::vector<hsize_t>& dims, const float* values,
                       const std::string& ctx, const char* layout = nullptr);
/// fsync of a file or a directory (after a rename: the directory entry). Returns 0 or the errno of the open or the
/// fsync: a directory's is best effort (callers ignore it), a file about to be renamed into place must be on disk.
int fsync_path(const std::string& path, bool directory);

/// A property list of class `cls` (H5P_DATASET_CREATE, H5P_GROUP_CREATE, H5P_FILE_CREATE) whose objects carry no
/// creation and modification times: the same content then makes the same bytes (two imports of one source, two
/// `--save`s of one run compare equal with cmp or a checksum).
H5Handle untimed_plist(hid_t cls, const std::string& ctx);

// ---- files written in memory, with a checksum header (checkpoint and weights format 2) --------------------------
//
// A file of ours is built as an HDF5 image in memory (core driver), then written with plain write(2) calls: HDF5
// never meets a disk error (a full disk made HDF5's exit handler crash on the half-closed file), and every error of
// the write is ours to report. The file on disk is a checksum header of H bytes (a power of two >= 512, which HDF5
// and h5py see as a user block and skip) followed by the HDF5 image:
//
//   offset  bytes  (little-endian)
//   0       8      magic "RNSUMS1\n"
//   8       4      header bytes H
//   12      4      entry count K
//   16      8      file bytes (H + the image)
//   24      4      CRC-32 (zlib) of bytes [H, file bytes): the whole HDF5 image, metadata and data
//   28      4      table bytes T
//   32      4      CRC-32 of the table, bytes [40, 40 + T)
//   36      4      CRC-32 of bytes [0, 36)
//   40      T      K entries: u64 offset, u64 length, u32 CRC-32 of the file bytes [offset, offset + length) (one
//                  tensor's stored chunk), u16 name length, the name ("/params/conv1.w")
//
// A reader verifies the header, the size and the image before HDF5 parses a byte of it (a corrupt file cannot reach
// HDF5's own parsers), and names the tensor whose stored bytes changed (a zeroed chunk, which Fletcher32 accepts).

inline constexpr char kChecksumMagic[8] = {'R', 'N', 'S', 'U', 'M', 'S', '1', '\n'};

/// An HDF5 file being built in memory; finish() closes it and returns header + image.
class MemoryH5File {
 public:
  /// `ctx` names the file in errors.
  explicit MemoryH5File(std::string ctx);
  ~MemoryH5File();
  MemoryH5File(const MemoryH5File&) = delete;
  MemoryH5File& operator=(const MemoryH5File&) = delete;
  hid_t file() const { return m_file; }
  /// Closes the file (every handle into it must be closed) and returns the bytes to write. `tensors` are the paths
  /// of the datasets whose stored chunk gets an entry in the table.
  std::vector<std::uint8_t> finish(const std::vector<std::string>& tensors);

 private:
  struct Capture;
  std::string m_ctx;
  std::unique_ptr<Capture> m_capture;
  H5Handle m_fapl;
  H5Handle m_file;
};

/// A file read whole and, when it has the checksum header, verified (every mismatch is an Error naming `path` and,
/// where the header's table locates it, the tensor). Without the header (format 1 files) `checksummed` is false and
/// the bytes are not kept.
struct VerifiedFile {
  bool checksummed = false;
  std::vector<std::uint8_t> bytes;
  std::size_t image_offset = 0;  ///< where the HDF5 image starts
};
/// One tensor of the header's table and whether its stored bytes still match (filled when the image fails).
struct ChecksumEntry {
  std::string name;
  bool ok = false;
};
VerifiedFile read_verified_file(const std::string& path, std::vector<ChecksumEntry>* entries = nullptr);

/// What an existing file of data is, from its first bytes (never parsed by HDF5): "an HDF5 file" (a dataset, or
/// another tool's), "a checkpoint or weights file" (the checksum header with a tensor table), "a file with a checksum
/// header" (predict's logits, whose table is empty);
/// empty for anything else (text, a missing or unreadable file). Outputs check it before they replace a file.
std::string data_file_kind(const std::string& path);

/// Runs `fn` in a child process (fork) and returns what it returned; an Error it throws comes back as an Error with
/// the same text. For files HDF5 must parse without our checksums (format 1 checkpoints and weights): HDF5 1.10
/// crashes inside its own code on some corrupt metadata (docs/fuzzing.md), and a crash in the child is an Error
/// here ("HDF5 crashed reading ..."), never a crash of this process. The child's stderr goes to /dev/null.
std::string run_contained(const std::string& path, const std::function<std::string()>& fn);

/// Opens the HDF5 file: from the verified bytes in memory, or from disk for a file without the header.
H5Handle open_verified(const VerifiedFile& f, const std::string& path);

/// Writes `bytes` to `path` atomically: a temporary in the same directory (temporary_name), fsync, rename, fsync of
/// the directory. A symlink at `path` is followed (its target is replaced, the link stays); anything but a regular
/// file there is refused. A failed write removes the temporary and names the file ("no space left on device").
/// `halfway` (optional) runs once half the bytes are on disk (the crash-safety test hook).
void write_file_atomically(const std::string& path, const std::vector<std::uint8_t>& bytes,
                           const std::function<void()>& halfway = {});

/// "<path>.tmp-<host>-<pid>": the temporary a writer in this process uses for `path`.
std::string temporary_name(const std::string& path);
/// For a file name holding ".tmp-<host>-<pid>" (or an older ".tmp-<pid>"): true when its writer is a process of
/// this host that no longer exists. A live writer's file, or another host's, is never stale.
bool is_stale_temporary(const std::string& filename);
/// Removes the stale temporaries of `path` ("<path>.tmp-..." in its directory, is_stale_temporary): what an import or
/// a write killed before its rename left behind (a 292 MB dataset temporary stayed after the rerun finished).
/// Writers call it before they create their own temporary.
void remove_stale_temporaries(const std::string& path);

/// A temporary this process is writing, on the list that the interrupt handlers (install_interrupt_cleanup) remove
/// before the process dies: Ctrl-C or a `kill` of an import left its temporary, as large as the dataset, until the
/// next write of the same file. Registered for the object's lifetime (none once kMaxTemporaries are: then the next
/// writer's remove_stale_temporaries is what removes it).
class InterruptibleTemporary {
 public:
  static constexpr int kMaxTemporaries = 16;
  explicit InterruptibleTemporary(const std::string& path);
  ~InterruptibleTemporary();
  InterruptibleTemporary(const InterruptibleTemporary&) = delete;
  InterruptibleTemporary& operator=(const InterruptibleTemporary&) = delete;

 private:
  int m_slot = -1;
};

/// SIGINT, SIGTERM and SIGHUP, where they have their default action (an ignored one stays ignored; a handler
/// installed before, such as train's preemption handlers, stays): unlink every InterruptibleTemporary, then die of
/// the signal as before (the same exit status for the shell or the launcher).
void install_interrupt_cleanup();

namespace detail {
/// Throws an Error "<what>: <HDF5 error stack>" with `context` (file/dataset) and a hint.
[[noreturn]] void throw_h5_error(const char* file, int line, const std::string& context, const std::string& what,
                                 std::string hint = {});
/// Throws an Error with a hint (RN_FAIL_CTX has none).
[[noreturn]] void throw_hinted(const char* file, int line, const std::string& context, std::string message,
                               std::string hint);
}  // namespace detail

}  // namespace renaissance::io

/// H5_CHECK(expr, context, fmt, args...): evaluates an HDF5 call; a negative result (every hid_t, herr_t and
/// htri_t failure) throws renaissance::Error naming the context (file, dataset) plus HDF5's own reason.
/// Yields the call's value, so `hid_t d = H5_CHECK(H5Dopen2(...), ctx, "opening")` works.
#define H5_CHECK(expr, ctx, ...)                                                                        \
  ([&]() {                                                                                              \
    auto rn_h5_result_ = (expr);                                                                        \
    if (rn_h5_result_ < 0)                                                                              \
      ::renaissance::io::detail::throw_h5_error(__FILE__, __LINE__, (ctx), ::fmt::format(__VA_ARGS__)); \
    return rn_h5_result_;                                                                               \
  }())

/// RN_IO_FAIL(context, hint, fmt, args...): throw an Error with context and hint.
#define RN_IO_FAIL(ctx, hint, ...) \
  ::renaissance::io::detail::throw_hinted(__FILE__, __LINE__, (ctx), ::fmt::format(__VA_ARGS__), (hint))
