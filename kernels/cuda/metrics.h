// Per-batch metrics on the GPU (the METRICS op), mirroring kernels/cpu/metrics.h; accumulated across batches by
// range_metric_accumulate and read once per epoch. Bad labels are clamped and counted (see softmax_ce.h).
#pragma once

#include <kernels/cuda/common.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace renaissance::cuda {

/// Device scratch bytes of batch_metrics for a batch of n samples (12·n, rounded up).
std::size_t metrics_workspace_bytes(std::int64_t batch);

/// Overwrites result[4] = {Σ per-sample loss, top-1 correct, top-5 correct, N} for this batch, with the per-sample
/// loss of softmax_ce_forward at smoothing `label_smoothing` (a plan constant, 0 for METRICS) and
/// rank(t) = #{k : z_k > z_t, or z_k = z_t and k < t, or z_k is NaN}, a NaN z_t never correct (the CPU's rule):
/// top-1 iff rank 0, top-5 iff rank < 5. predicted (nullable,
/// N int32) = argmax z, first maximum (0 when z_0 is NaN, as the CPU's scan). Sums in sample order (deterministic).
void batch_metrics(cudaStream_t stream, const TensorRef& logits, const std::int32_t* labels, float label_smoothing,
                   float* result, std::int32_t* predicted, void* workspace, std::size_t workspace_bytes,
                   std::int32_t* label_errors);

}  // namespace renaissance::cuda
