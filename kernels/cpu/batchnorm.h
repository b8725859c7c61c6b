// Batch normalisation over NHWC (2-D: statistics over N·H·W per channel; 1-D: shape (N,1,1,C)).
#pragma once

#include <renaissance/core/shape.h>

#include <cstdint>

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

// ---- fused element-wise passes (the CPU side of DESIGN §11 lever 1; the GPU's kernels/cuda/batchnorm.cu) ----------
// Each equals its plain parts bit for bit: the same formulas in the same order, rounded where the parts store.

/// The training forward's statistics alone: save_mean/save_invstd and (when not null) the running statistics,
/// exactly as batchnorm_forward_train computes them (it is this, then the normalisation).
void batchnorm_train_statistics(const float* x, const Shape& s, float* save_mean, float* save_invstd,
                                float* running_mean, float* running_var, float momentum = 0.1f, float eps = 1e-5f);

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

/// One pass for the element-wise tail of a layer: y = [relu](BN(a) [+ shortcut | + BN(b)]) over the NHWC shape s,
/// replacing BN → [ADD2 →] [RELU] (and a shortcut BN's own apply). `round_f16`: the parts store binary16 (AMP), so
/// each BN output and the sum are rounded to binary16 where the parts round them (y is then a binary16 value).
/// y may alias a.x or the shortcut (the parts run in place).
void batchnorm_apply_fused(const BnApply& a, const Shape& s, BnShortcut kind, const float* shortcut,
                           const BnApply* b, bool relu, bool round_f16, float* y);

/// batchnorm_backward with the ReLU backward before it folded in: the BN output's gradient [BN(x) > 0]·dy is formed
/// on the fly, the mask recomputed from x with the forward's formula (train scale, β; rounded to binary16 first
/// with round_f16), so neither the ReLU output nor that gradient is read or written. Same bits as relu_backward
/// (from y = relu(BN(x))) followed by batchnorm_backward.
void batchnorm_relu_backward(const float* x, const float* dy, const Shape& s, const float* gamma, const float* beta,
                             const float* save_mean, const float* save_invstd, bool round_f16, float* dx,
                             float* dgamma, float* dbeta, bool accumulate_dx, bool accumulate_params);

}  // namespace renaissance::cpu
