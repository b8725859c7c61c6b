// Instruction-set variants of the CPU's element-wise kernels (batch norm, activations, residual sums).
//
// batchnorm.cpp and elementwise.cpp are compiled once per level (CMake: the baseline x86-64/any target, and on
// x86-64 with GCC ≥ 12 also `arch=x86-64-v3` and `arch=x86-64-v4`, each into its own namespace isa_<level>), and the
// public functions of batchnorm.h / elementwise.h call the best level this CPU runs (isa_dispatch.cpp). The loops
// are the same source and -ffp-contract=off holds in every variant, so every level gives the same bits; only the
// vector width changes (measured in docs/kernels-cpu.md, checked by KernelIsa.EveryLevelGivesTheSameBits).
#pragma once

namespace renaissance::cpu {

enum class VectorIsa : int { Generic = 0, Avx2 = 1, Avx512 = 2 };

/// The level the element-wise kernels run: the best this build has and this CPU supports, or a lower one
/// named in RENAISSANCE_CPU_ISA (generic|avx2|avx512; a level the CPU lacks is ignored), or set_vector_isa's.
VectorIsa vector_isa();
const char* vector_isa_name(VectorIsa isa);
/// Whether this build has the level and this CPU runs it (Generic: always).
bool vector_isa_available(VectorIsa isa);
/// Selects a level (tests and benchmarks); false, and no change, where it is not available.
bool set_vector_isa(VectorIsa isa);

}  // namespace renaissance::cpu
