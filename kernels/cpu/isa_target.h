// Included by a kernel source compiled once per instruction-set level (isa.h), AFTER all its other includes: the
// code that follows is compiled for the level CMake names (RN_ISA_AVX2 / RN_ISA_AVX512, else the baseline) and
// lives in namespace RN_ISA_NS. Headers included before keep the baseline, so the inline functions and templates
// they define (std::vector, fmt, parallel_for) are the same in every variant: no AVX-512 copy of a shared inline
// function can be picked by the linker for a CPU that lacks it.
#pragma once

#if defined(RN_ISA_AVX512)
#pragma GCC target("arch=x86-64-v4,prefer-vector-width=512")
#define RN_ISA_NS isa_avx512
#elif defined(RN_ISA_AVX2)
#pragma GCC target("arch=x86-64-v3")
#define RN_ISA_NS isa_avx2
#else
#define RN_ISA_NS isa_generic
#endif
