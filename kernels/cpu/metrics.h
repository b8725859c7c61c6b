// Training/validation metrics accumulated in place (the R_RESULT_ACCUMULATED range), read once per epoch.
#pragma once

#include <cstdint>

namespace renaissance::cpu {

/// Adds this batch into result[4] = {Σ per-sample loss, top-1 correct, top-5 correct, samples}, with the
/// per-sample loss of softmax_ce_forward (label smoothing ε) and rank(t) = #{k : z_k > z_t, or z_k = z_t
/// and k < t, or z_k is NaN}: top-1 iff rank 0, top-5 iff rank < 5; a NaN z_t is never counted correct (a model
/// whose logits are NaN scores 0, not 1). predicted (nullable) gets argmax z (first maximum).
/// A label outside [0, classes) throws Error naming the sample.
void accumulate_metrics(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                        float label_smoothing, float* result, std::int32_t* predicted);

}  // namespace renaissance::cpu
