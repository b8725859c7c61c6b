#include "environment.h"

#include <renaissance/core/error.h>
#include <renaissance/runtime/devices.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace renaissance::app {

namespace {

bool one_of(const std::string& v, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (v == w) return true;
  return false;
}

/// A whole decimal integer in [lo, hi].
bool integer_in(const std::string& v, long long lo, long long hi) {
  if (v.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0' && x >= lo && x <= hi;
}

/// A whole finite number in (0, 1e9).
bool positive_seconds(const std::string& v) {
  if (v.empty()) return false;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  return end && *end == '\0' && std::isfinite(x) && x > 0 && x < 1e9;
}

}  // namespace

const std::vector<EnvVariable>& environment_variables() {
  static const std::vector<EnvVariable> vars = {
      // At most 1024, the CPUs an affinity mask (cpu_set_t) can hold: the pool's workers spin between kernels, so
      // threads beyond the CPUs take turns (65536 on 2 CPUs made a 0.4 s eval run for minutes in 6.5 GB).
      {"RENAISSANCE_CPU_THREADS", "a thread count from 1 to 1024",
       [](const std::string& v) { return integer_in(v, 1, 1024); }},
      {"RENAISSANCE_CPU_WINOGRAD", "on, off, 1 or 0",
       [](const std::string& v) { return one_of(v, {"on", "off", "1", "0"}); }},
      {"RENAISSANCE_CPU_ISA", "generic, avx2 or avx512",
       [](const std::string& v) { return one_of(v, {"generic", "avx2", "avx512"}); }},
      // openblas in a build without OpenBLAS fell back to the own GEMM without a word.
      {"RENAISSANCE_GEMM", runtime::cpu_openblas_available() ? "own or openblas" : "own; this build has no OpenBLAS",
       [](const std::string& v) { return v == "own" || (v == "openblas" && runtime::cpu_openblas_available()); }},
      {"RENAISSANCE_GEMM_ISA", "generic, avx2 or avx512",
       [](const std::string& v) { return one_of(v, {"generic", "avx2", "avx512"}); }},
      {"RENAISSANCE_COMM_TIMEOUT", "seconds, a number above 0", positive_seconds},
      {"RENAISSANCE_HDF5_OPEN_TIMEOUT", "seconds, a number above 0", positive_seconds},
      {"RENAISSANCE_DATASET_CACHE_MB", "a whole number of MiB, 0 or more",
       [](const std::string& v) { return integer_in(v, 0, 1LL << 40); }},
      {"RENAISSANCE_JPEG_DIRECT_READ", "0 or 1", [](const std::string& v) { return one_of(v, {"0", "1"}); }},
      {"RENAISSANCE_NCCL_LANES", "1 or 2", [](const std::string& v) { return one_of(v, {"1", "2"}); }},
      {"RENAISSANCE_SPACE_CHECK", "on or off", [](const std::string& v) { return one_of(v, {"on", "off"}); }},
      {"RENAISSANCE_MPI", "always, never or auto",
       [](const std::string& v) { return one_of(v, {"always", "never", "auto"}); }},
  };
  return vars;
}

void check_environment() {
  for (const EnvVariable& var : environment_variables()) {
    const char* value = std::getenv(var.name);
    if (!value || !*value) continue;
    RN_CHECK_CTX(var.valid(value), var.name, "'{}' is not a value it takes ({}; unset it for the default)", value,
                 var.takes);
  }
  if (const char* threads = std::getenv("RENAISSANCE_CPU_THREADS"); threads && *threads) {
    const int n = std::atoi(threads), cpus = runtime::cpu_affinity_count();
    if (n > cpus)
      spdlog::warn(
          "RENAISSANCE_CPU_THREADS={} is more than the {} CPU{} this process may run on: the CPU kernels' "
          "threads will take turns on them (slower than {})",
          n, cpus, cpus == 1 ? "" : "s", cpus);
  }
}

std::string cpu_kernel_env_settings() {
  // The GEMM as it is picked (cpu::default_backend: OpenBLAS only when asked for and present, else our own): unset
  // on one rank and RENAISSANCE_GEMM=own on another, the same kernel, was refused as a difference.
  const char* gemm = std::getenv("RENAISSANCE_GEMM");
  const bool openblas = gemm && std::string(gemm) == "openblas" && runtime::cpu_openblas_available();
  std::string lines = fmt::format("cpu gemm={}\n", openblas ? "openblas" : "own");
  for (const auto& [name, label] : {std::pair<const char*, const char*>{"RENAISSANCE_CPU_ISA", "cpu isa cap"},
                                    {"RENAISSANCE_GEMM_ISA", "gemm isa cap"}}) {
    const char* value = std::getenv(name);
    lines += fmt::format("{}={}\n", label, value && *value ? value : "default");
  }
  return lines;
}

}  // namespace renaissance::app
