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
#define EXPECT_CLEAN_ERROR(run, ...)                                                                            \
  do {                                                                                                          \
    EXPECT_EQ((run).code, 1) << (run).out;                                                                      \
    for (const std::string& rn_frag_ : std::initializer_list<std::string>{__VA_ARGS__})                         \
      EXPECT_NE((run).out.find(rn_frag_), std::string::npos) << "'" << rn_frag_ << "' not in:\n" << (run).out;  \
  } while (0)

}  // namespace hardening
