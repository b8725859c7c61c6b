// Batch normalisation over NHWC (2-D: statistics over N·H·W per channel; 1-D: shape (N,1,1,C)).
#pragma once

#include <renaissance/core/shape.h>

#include <cstdint>

namespace renaissance::cpu {

/// The normalisation of one BN in a fused pass, y = (x − mean)·scale + β with the plain forward's scale:
/// training (running_var null): scale = invstd·γ; inference: scale = (float)(1/√(running_var + eps))·γ.
struct BnApply {
  const float* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* mean = nullptr;         ///< batch mean (training) or running mean (inference)
  const float* invstd = nullptr;       ///< training: the saved invstd
  const float* running_var = nullptr;  ///< inference: invstd from the running variance and eps
  float eps = 1e-5f;
};
enum class BnShortcut : std::uint8_t { kNone, kTensor, kBatchNorm };

// The kernels (one variant per instruction-set level, dispatched: isa.h).
#include <kernels/cpu/batchnorm_api.inc>

}  // namespace renaissance::cpu
