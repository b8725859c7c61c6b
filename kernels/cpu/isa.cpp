#include <kernels/cpu/isa.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace renaissance::cpu {

namespace {

bool cpu_runs(VectorIsa isa) {
  if (isa == VectorIsa::Generic) return true;
#if defined(RN_HAVE_ISA_VARIANTS) && defined(__GNUC__) && defined(__x86_64__)
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
                  __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe");
  if (isa == VectorIsa::Avx2) return v3;
  return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
#else
  return false;
#endif
}

VectorIsa initial() {
  VectorIsa best = VectorIsa::Generic;
  for (VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512})
    if (cpu_runs(isa)) best = isa;
  if (const char* env = std::getenv("RENAISSANCE_CPU_ISA")) {
    for (VectorIsa isa : {VectorIsa::Generic, VectorIsa::Avx2, VectorIsa::Avx512})
      if (std::strcmp(env, vector_isa_name(isa)) == 0 && static_cast<int>(isa) <= static_cast<int>(best)) best = isa;
  }
  return best;
}

std::atomic<int>& slot() {
  static std::atomic<int> s{static_cast<int>(initial())};
  return s;
}

}  // namespace

VectorIsa vector_isa() { return static_cast<VectorIsa>(slot().load(std::memory_order_relaxed)); }

const char* vector_isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::Avx512: return "avx512";
    case VectorIsa::Avx2: return "avx2";
    case VectorIsa::Generic: break;
  }
  return "generic";
}

bool vector_isa_available(VectorIsa isa) { return cpu_runs(isa); }

bool set_vector_isa(VectorIsa isa) {
  if (!cpu_runs(isa)) return false;
  slot().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace renaissance::cpu
