// Batch normalisation over NHWC (2-D: statistics over N·H·W per channel; 1-D: shape (N,1,1,C)).
#pragma once

#include <renaissance/core/shape.h>

namespace renaissance::cpu {

/// Training forward: mean_c and biased var_c over the R = N·H·W values of channel c;
/// y = (x − mean)·invstd·γ + β with invstd = 1/√(var + eps). Writes save_mean/save_invstd (for the
/// backward pass) and, when not null, running_mean = (1−m)·running_mean + m·mean and
/// running_var = (1−m)·running_var + m·var·R/(R−1) (unbiased, as PyTorch). R must be > 1.
void batchnorm_forward_train(const float* x, const Shape& s, const float* gamma, const float* beta, float* y,
                             float* save_mean, float* save_invstd, float* running_mean, float* running_var,
                             float momentum = 0.1f, float eps = 1e-5f);

/// Inference forward: y = (x − running_mean)·(1/√(running_var + eps))·γ + β.
void batchnorm_forward_inference(const float* x, const Shape& s, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y, float eps = 1e-5f);

/// Backward of the training forward, with x̂ = (x − mean)·invstd:
/// dβ = Σ dy; dγ = Σ dy·x̂; dx = γ·invstd·(dy − dβ/R − x̂·dγ/R).
/// Any of dx, dgamma, dbeta may be null (not computed). accumulate_dx / accumulate_params add into dx /
/// into dγ and dβ instead of overwriting.
void batchnorm_backward(const float* x, const float* dy, const Shape& s, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, bool accumulate_dx,
                        bool accumulate_params);

}  // namespace renaissance::cpu
