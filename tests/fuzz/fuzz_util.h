// Shared by the libFuzzer targets: the input as a temporary file (our readers take paths), and the rule for
// exceptions. A renaissance::Error is the expected answer to bad input; any other exception escaping a reader
// means input reached code that does not validate it (a std::out_of_range from deep inside, say) and is reported
// as a finding by aborting, so the fuzzer keeps the input.
#pragma once

#include <renaissance/core/error.h>

#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>
#include <string>

#include <unistd.h>

namespace renaissance::fuzz {

/// A per-process file under $TMPDIR (or /dev/shm, which is memory) holding the fuzz input.
inline std::string input_file(const std::uint8_t* data, std::size_t size, const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("RENAISSANCE_FUZZ_TMP");
    if (!dir) dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/renaissance-fuzz-" + std::to_string(::getpid()) + suffix;
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

/// HDF5 keeps freed blocks on free lists: libFuzzer then sees more mallocs than frees after every input and runs a
/// full leak check each time (a few executions per second). Limit 0 makes HDF5 free them at once.
inline void hdf5_no_free_lists() { H5set_free_list_limits(0, 0, 0, 0, 0, 0); }

/// Runs fn; renaissance::Error is fine, std::bad_alloc is a finding unless allowed, anything else is a finding.
template <typename F>
void expect_clean(F&& fn, const char* target) {
  try {
    fn();
  } catch (const renaissance::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: a %s escaped instead of renaissance::Error: %s\n", target, typeid(e).name(), e.what());
    std::abort();
  }
}

}  // namespace renaissance::fuzz
