// Softmax cross-entropy with label smoothing (PyTorch semantics), mean over the batch.
#pragma once

#include <cstdint>

namespace renaissance::cpu {

/// p = softmax(logits) per row (written to `probs`, [batch × classes]); returns
/// loss = (1/N) Σ_n [(1−ε)·(−log p[n, t_n]) + ε·(1/K) Σ_k (−log p[n, k])], ε = label_smoothing, K = classes.
/// A label outside [0, classes) throws Error naming the sample and the label.
float softmax_ce_forward(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                         float label_smoothing, float* probs);

/// dlogits = (p − q)/N · loss_scale, q = (1−ε)·onehot(t) + ε/K (the smoothed target).
void softmax_ce_backward(const float* probs, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                         float label_smoothing, float loss_scale, float* dlogits, bool accumulate);

namespace detail {
/// Throws Error for the first label outside [0, classes).
void check_labels(const std::int32_t* labels, std::int64_t batch, std::int64_t classes, const char* what);
/// One row's smoothed cross-entropy from its logits (log-sum-exp in double).
double sample_ce(const float* logits, std::int64_t classes, std::int32_t label, float label_smoothing);
}  // namespace detail

}  // namespace renaissance::cpu
