// Shared by the issue-13 hardening tests: run the real `renaissance` executable as a user would (a shell command
// line, output captured, exit status and wall time measured), temporary directories per test, tiny datasets.
#pragma once

#include <renaissance/io/importers.h>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace hardening {

namespace fs = std::filesystem;

/// A fresh directory for the running test.
inline fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d = fs::temp_directory_path() / ("rn_hardening_" + std::to_string(::getpid()) + "_" +
                                                  (info ? std::string(info->test_suite_name()) + "." + info->name() : "x"));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct CliResult {
  int code = -1;        ///< exit status, or 128 + signal
  std::string out;      ///< stdout and stderr together
  double seconds = 0;
};

/// `sh -c "<prefix> renaissance <args>"` with a wall-clock limit (timeout(1) sends SIGKILL after `limit_s`).
inline CliResult run_shell(const std::string& line, double limit_s = 120) {
  static int n = 0;
  const fs::path log = fs::temp_directory_path() / ("rn_hardening_" + std::to_string(::getpid()) + "_" +
                                                    std::to_string(n++) + ".log");
  const std::string cmd = "timeout -s KILL " + std::to_string(static_cast<int>(limit_s)) + " sh -c '" + line +
                          "' > '" + log.string() + "' 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  r.out = ss.str();
  fs::remove(log);
  return r;
}

inline std::string cli() { return RENAISSANCE_CLI; }

/// renaissance <args>
inline CliResult run(const std::string& args, double limit_s = 120) { return run_shell("exec " + cli() + " " + args, limit_s); }

/// A tiny synthetic dataset (28x28x1, 10 classes) shared by the tests of this process.
inline std::string tiny_data() {
  const fs::path p = fs::temp_directory_path() / ("rn_hardening_syn_" + std::to_string(::getpid()) + ".h5");
  if (!fs::exists(p)) renaissance::io::make_synthetic(p.string(), 200, 64, 28, 28, 1, 10, 5);
  return p.string();
}

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

/// The failure every bad input must give: exit status 1 (not a crash, not a signal) and a message naming `what`.
#define EXPECT_CLEAN_ERROR(run, ...)                                                                               \
  do {                                                                                                             \
    /* Evaluated once: `run` is often the command itself, run("..."). */                                           \
    const auto& rn_run_ = (run);                                                                                   \
    EXPECT_EQ(rn_run_.code, 1) << rn_run_.out;                                                                     \
    for (const std::string& rn_frag_ : std::initializer_list<std::string>{__VA_ARGS__})                            \
      EXPECT_NE(rn_run_.out.find(rn_frag_), std::string::npos) << "'" << rn_frag_ << "' not in:\n" << rn_run_.out; \
  } while (0)

}  // namespace hardening

#include <hdf5.h>

#include <cstring>
#include <vector>

namespace hardening {

/// Overwrites bytes [offset, offset + n) of a file with zeros (a zeroed disk block).
inline void zero_bytes(const fs::path& p, std::uint64_t offset, std::uint64_t n) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << p;
  f.seekp(static_cast<std::streamoff>(offset));
  const std::vector<char> z(static_cast<std::size_t>(n), 0);
  f.write(z.data(), static_cast<std::streamsize>(n));
}

/// File offset and size of the chunk of `link` whose first sample is `first` (HDF5's own answer, which also holds for
/// a file with a user block: HDF5 reports addresses from the superblock).
inline std::pair<std::uint64_t, std::uint64_t> chunk_at(const fs::path& p, const std::string& link, hsize_t first) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, link.c_str(), H5P_DEFAULT);
  hsize_t off[4] = {first, 0, 0, 0};
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  EXPECT_GE(H5Dget_chunk_info_by_coord(d, off, &mask, &addr, &size), 0);
  H5Dclose(d);
  H5Fclose(f);
  return {addr, size};
}

/// Grows the extent of `link` along dimension 0 without writing anything (a header that claims samples).
inline void claim_extent(const fs::path& p, const std::string& link, hsize_t n) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << p;
  const hid_t d = H5Dopen2(f, link.c_str(), H5P_DEFAULT);
  const hid_t sp = H5Dget_space(d);
  hsize_t dims[4] = {0};
  const int rank = H5Sget_simple_extent_dims(sp, dims, nullptr);
  ASSERT_GT(rank, 0);
  dims[0] = n;
  EXPECT_GE(H5Dset_extent(d, dims), 0);
  H5Sclose(sp);
  H5Dclose(d);
  H5Fclose(f);
}

/// Where `needle` (some of a tensor's values) lies in a file: found by content, independent of any header.
inline std::uint64_t find_bytes(const fs::path& p, const void* needle, std::size_t n) {
  const std::string bytes = read_text(p);
  const auto pos = bytes.find(std::string(static_cast<const char*>(needle), n));
  EXPECT_NE(pos, std::string::npos);
  EXPECT_EQ(bytes.find(std::string(static_cast<const char*>(needle), n), pos + 1), std::string::npos) << "not unique";
  return pos == std::string::npos ? 0 : pos;
}

}  // namespace hardening
