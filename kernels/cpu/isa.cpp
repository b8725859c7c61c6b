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
  // The very levels the variants are compiled for (isa_target.h: arch=x86-64-v3 / x86-64-v4; GCC >= 12 names them).
  __builtin_cpu_init();
  if (isa == VectorIsa::Avx2) return __builtin_cpu_supports("x86-64-v3");
  return __builtin_cpu_supports("x86-64-v4");
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
