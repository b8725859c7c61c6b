#include <renaissance/io/hdf5_util.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

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

void write_string_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& ctx) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5_CHECK(H5Tset_size(type, value.empty() ? 1 : value.size()), ctx, "string type");
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "create attribute '{}'", name),
                H5Aclose);
  H5_CHECK(H5Awrite(attr, type, value.empty() ? "" : value.c_str()), ctx, "write attribute '{}'", name);
}

void write_f32_dataset(hid_t parent, const std::string& name, const std::vector<hsize_t>& dims, const float* values,
                       const std::string& ctx) {
  H5Handle space(H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), ctx, "dataspace"),
                 H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  std::vector<hsize_t> chunk(dims);
  for (hsize_t& c : chunk) c = std::max<hsize_t>(c, 1);  // filters need chunks; a chunk dimension cannot be 0
  H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), ctx, "chunking");
  H5_CHECK(H5Pset_fletcher32(dcpl), ctx, "checksum filter");
  H5Handle ds(H5_CHECK(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), ctx,
                       "create dataset"),
              H5Dclose);
  H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), ctx, "write");
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

namespace detail {

void throw_h5_error(const char* file, int line, const std::string& context, const std::string& what, std::string hint) {
  std::string h5 = hdf5_error_text();
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
