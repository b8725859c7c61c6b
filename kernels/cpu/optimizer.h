// Optimizer updates over a whole region (one pass, DESIGN §6), with PyTorch's published update rules.
// Hyper-parameters are read through a pointer at call time (they live in the arena and change per step
// without re-planning), and every update is skipped when *skip != 0 (an AMP overflow step).
//
// Operation order is part of the contract (the GPU kernels and the tests repeat it): each formula below
// is evaluated left to right as written, in FP32, with no fused multiply-add. g' = g + wd·w when
// apply_weight_decay, else g' = g (BN and bias parameters).
#pragma once

#include <renaissance/core/optimizer_scalars.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::cpu {

// The arena layouts are shared with the other backend and the planner (core/optimizer_scalars.h).
using renaissance::LarsSegment;
using renaissance::OptimizerScalars;

/// SGD: w = w − lr·g'.
void sgd_update(float* w, const float* g, std::int64_t n, const OptimizerScalars* s, bool apply_weight_decay,
                const std::int32_t* skip);
/// Momentum (PyTorch, dampening 0): v = μ·v + g'; w = w − lr·v.
void momentum_update(float* w, const float* g, float* v, std::int64_t n, const OptimizerScalars* s,
                     bool apply_weight_decay, const std::int32_t* skip);
/// Nesterov (PyTorch): v = μ·v + g'; w = w − lr·(g' + μ·v).
void nesterov_update(float* w, const float* g, float* v, std::int64_t n, const OptimizerScalars* s,
                     bool apply_weight_decay, const std::int32_t* skip);
/// Adam (Kingma & Ba, L2 penalty in g'): m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·(g'·g');
/// m̂ = m / (1−β1^t); v̂ = v / (1−β2^t); w = w − lr·m̂ / (√v̂ + eps); bias corrections from double pow.
void adam_update(float* w, const float* g, float* m, float* v, std::int64_t n, const OptimizerScalars* s,
                 bool apply_weight_decay, const std::int32_t* skip);
/// AdamW (Loshchilov & Hutter, PyTorch form): w = w·(1 − lr·wd) when apply_weight_decay, then Adam with g' = g.
void adamw_update(float* w, const float* g, float* m, float* v, std::int64_t n, const OptimizerScalars* s,
                  bool apply_weight_decay, const std::int32_t* skip);
/// LARS (You et al.), per segment: ‖w‖, ‖g‖ (double sums over fixed 4096-element blocks, blocks added in
/// order, sqrt, then float); trust = η·‖w‖ / (‖g‖ + wd·‖w‖), or 1 when either norm is 0;
/// v = μ·v + (lr·trust)·(g + wd·w); w = w − v.
void lars_update(float* w, const float* g, float* v, const LarsSegment* segments, std::size_t num_segments,
                 const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip);

/// Elements per block of the LARS norm sums (part of the operation order above).
constexpr std::int64_t kLarsNormBlock = 4096;

}  // namespace renaissance::cpu
