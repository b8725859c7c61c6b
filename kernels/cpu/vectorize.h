// Loop hints for the kernels (internal to kernels/cpu).
#pragma once

// RN_IVDEP before an elementwise loop: iterations are independent even when outputs alias inputs at the
// same index (in-place ReLU backward, BN in place). Without it GCC's run-time alias check sends in-place
// calls to the scalar, branchy fallback loop (measured 30x slower for ReLU backward).
#if defined(__clang__)
#define RN_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define RN_IVDEP _Pragma("GCC ivdep")
#else
#define RN_IVDEP
#endif
