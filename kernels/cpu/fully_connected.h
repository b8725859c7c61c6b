// Fully connected layer: x [batch × in] row-major, W [out × in] (PyTorch's Linear layout).
#pragma once

#include <cstdint>

namespace renaissance::cpu {

/// y = x·Wᵀ + b, y [batch × out]; `bias` may be null.
void fc_forward(const float* x, std::int64_t batch, std::int64_t in, const float* w, const float* bias, float* y,
                std::int64_t out);
/// dx = dy·W.
void fc_backward_data(const float* dy, std::int64_t batch, std::int64_t out, const float* w, float* dx,
                      std::int64_t in, bool accumulate);
/// dW = dyᵀ·x; db = Σ_batch dy (when db is not null).
void fc_backward_weights(const float* x, const float* dy, std::int64_t batch, std::int64_t in, std::int64_t out,
                         float* dw, float* db, bool accumulate);

}  // namespace renaissance::cpu
