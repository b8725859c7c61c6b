// Optimizer updates over a whole arena region on the GPU (one pass each, DESIGN §6), mirroring
// kernels/cpu/optimizer.h: PyTorch's update rules, each formula evaluated left to right in FP32 with no fused
// multiply-add (this file's kernels are built with -fmad=false), so results match the CPU kernels to the last bit
// or within 1e-6 relative (Adam's double pow, LARS's FP64 norm order). Hyper-parameters are read through a device
// pointer (they change per step inside a captured graph) and every update is skipped when *skip != 0 (AMP overflow).
#pragma once

#include <cuda_runtime.h>

#include <renaissance/core/optimizer_scalars.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::cuda {

// The arena layouts are shared with the other backend and the planner (core/optimizer_scalars.h).
using renaissance::LarsSegment;
using renaissance::OptimizerScalars;

/// Elements per LARS norm chunk (the CPU's kLarsNormBlock: part of the summation order).
constexpr std::int64_t kLarsChunk = 4096;

// g' = g + wd·w when apply_weight_decay, else g (BN and bias parameters). s and skip are device pointers; skip may
// be null (never skip).

/// SGD: w = w − lr·g'.
void sgd_update(cudaStream_t stream, float* w, const float* g, std::int64_t n, const OptimizerScalars* s,
                bool apply_weight_decay, const std::int32_t* skip);
/// Momentum (dampening 0): v = μ·v + g'; w = w − lr·v.
void momentum_update(cudaStream_t stream, float* w, const float* g, float* v, std::int64_t n,
                     const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip);
/// Nesterov: v = μ·v + g'; w = w − lr·(g' + μ·v).
void nesterov_update(cudaStream_t stream, float* w, const float* g, float* v, std::int64_t n,
                     const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip);
/// Adam (L2 in g'): m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·(g'·g'); w = w − lr·(m/bc1) / (√(v/bc2) + eps),
/// bc = 1 − β^t from FP64 pow (once per block).
void adam_update(cudaStream_t stream, float* w, const float* g, float* m, float* v, std::int64_t n,
                 const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip);
/// AdamW: w = w·(1 − lr·wd) when apply_weight_decay, then Adam with g' = g.
void adamw_update(cudaStream_t stream, float* w, const float* g, float* m, float* v, std::int64_t n,
                  const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip);

/// LARS (You et al.) in two kernels over the same chunk grid (chunk = kLarsChunk elements of one segment):
///   lars_norms:  Σw², Σg² of every chunk in FP64 into the workspace;
///   lars_update: each block adds its segment's chunk sums (FP64, fixed order), ‖w‖ = float(√Σw²), ‖g‖ likewise,
///                trust = η·‖w‖/(‖g‖ + wd·‖w‖) (1 when either norm is 0), v = μ·v + (lr·trust)·(g + wd·w), w = w − v.
/// `segments` is a DEVICE array of num_segments {offset, count} pairs the caller uploads once at setup;
/// num_chunks = lars_num_chunks(the same pairs on the host), also computed once.
std::int64_t lars_num_chunks(const LarsSegment* host_segments, std::size_t num_segments);
std::size_t lars_workspace_bytes(std::int64_t num_chunks);
void lars_norms(cudaStream_t stream, const float* w, const float* g, const LarsSegment* segments,
                std::size_t num_segments, std::int64_t num_chunks, void* workspace, std::size_t workspace_bytes);
/// norms (nullable): norms[i·norm_stride + 0/1] = ‖w‖, ‖g‖ of segment i (the LARS_NORMS outputs), written even on a
/// skipped step. The workspace must hold this step's lars_norms.
void lars_update(cudaStream_t stream, float* w, const float* g, float* v, const LarsSegment* segments,
                 std::size_t num_segments, std::int64_t num_chunks, const OptimizerScalars* s,
                 bool apply_weight_decay, const std::int32_t* skip, const void* workspace,
                 std::size_t workspace_bytes, float* norms, std::int64_t norm_stride);

}  // namespace renaissance::cuda
