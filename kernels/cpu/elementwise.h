// Activations, residual addition and channel padding: elementwise passes over NHWC tensors.
#pragma once

#include <renaissance/ops/activations.h>

#include <cstdint>

namespace renaissance::cpu {

/// y = max(x, 0).
void relu_forward(const float* x, float* y, std::int64_t n);
/// dx = dy · [y > 0], from the forward OUTPUT y (so the input can be overwritten in place).
void relu_backward(const float* y, const float* dy, float* dx, std::int64_t n, bool accumulate);
/// dx = (dy + addend) · [y > 0]: a residual sum folded into the ReLU backward that consumes it (plan ADD_RELU_BWD).
/// `round_f16`: the sum is rounded to binary16 first, as the ACCUMULATE it replaces stores it (same bits).
void relu_backward_sum(const float* y, const float* dy, const float* addend, float* dx, std::int64_t n, bool round_f16);

/// y = tanh(x).
void tanh_forward(const float* x, float* y, std::int64_t n);
/// dx = dy · (1 − y²), from the forward output y.
void tanh_backward(const float* y, const float* dy, float* dx, std::int64_t n, bool accumulate);

/// y = f(x) for an activation of ops/activations.h (the functor's forward map, element by element).
void activation_forward(ops::Activation a, const float* x, float* y, std::int64_t n);
/// dx = dy · f'(x) (or dx += with `accumulate`), from the forward INPUT x.
void activation_backward(ops::Activation a, const float* x, const float* dy, float* dx, std::int64_t n,
                         bool accumulate);

/// y = a + b (residual join; its backward hands dy to both branches, which the runtime does by aliasing).
void add2_forward(const float* a, const float* b, float* y, std::int64_t n);

/// Channel padding (e.g. a shortcut from c to c_out > c channels): y[r, 0:c] = x[r, :], y[r, c:c_out] = 0,
/// for rows r < rows (= N·H·W).
void channel_pad_forward(const float* x, std::int64_t rows, std::int64_t c, std::int64_t c_out, float* y);
/// dx[r, :] = dy[r, 0:c] (the padded channels have no input).
void channel_pad_backward(const float* dy, std::int64_t rows, std::int64_t c_out, std::int64_t c, float* dx,
                          bool accumulate);

}  // namespace renaissance::cpu
