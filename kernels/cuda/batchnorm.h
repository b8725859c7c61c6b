// Batch normalisation over NHWC on the GPU (2-D: statistics over N·H·W per channel; 1-D: shape (N,1,1,C)),
// mirroring kernels/cpu/batchnorm.h. Per-channel parameters and statistics are FP32 arrays of C floats; x, y, dy,
// dx are FP32 or FP16 storage with one layout (shape, dtype, c_stride). Reductions are deterministic: a fixed
// two-stage scheme (per-block FP32 partials, combined in FP64 in a fixed order) whose blocking depends only on the
// shape, the dtype and the alignment, never on the device or on timing.
#pragma once

#include <kernels/cuda/common.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace renaissance::cuda {

/// Synchronised BatchNorm (--sync-bn on GPU ranks, DESIGN §9): the statistics of the global batch of every rank.
/// `sum(data, count)` must sum `count` floats of device memory over the ranks in place, enqueued on the launch's
/// stream (ncclAllReduce, captured with the step); `global_rows` is R_g = this rank's rows × ranks (equal shards).
/// Forward: Σx → sum → mean = Σx/R_g; Σ(x − mean)² → sum → var = ·/R_g (two passes, as runtime/cpu_ops.cpp's
/// sync_bn_forward). Backward: this rank's Σdy and Σdy·x̂ go into dβ, dγ (averaged with the other gradients
/// later) and, summed over the ranks, into dx. Three sums per BN layer and step: C, C and 2·c_stride floats.
struct SyncReduce {
  std::function<void(float* data, std::int64_t count)> sum;
  double global_rows = 0;
};

/// Device scratch bytes that batchnorm_forward_train and batchnorm_backward need for tensors laid out like x
/// (at most a few MiB). Callers allocate it once (no allocation happens in a launcher); kernels that may run
/// concurrently need separate workspaces.
std::size_t batchnorm_workspace_bytes(const TensorRef& x);
/// The same with `sync` (SyncReduce): 2·c_stride floats more for the sums that are all-reduced.
std::size_t batchnorm_sync_workspace_bytes(const TensorRef& x);

/// Training statistics alone (the first half of batchnorm_forward_train): batch_mean, batch_var_unbiased and
/// save_invstd of x, for a later batchnorm_apply_fused.
void batchnorm_train_statistics(cudaStream_t stream, const TensorRef& x, const float* eps, float* batch_mean,
                                float* batch_var_unbiased, float* save_invstd, void* workspace,
                                std::size_t workspace_bytes, const SyncReduce* sync = nullptr);

/// The training statistics from a convolution's GEN_STATS epilogue (ConvOp::forward_stats): batch_mean holds Σx and
/// batch_var_unbiased Σx² over the `rows` = N·H·W values of each of the `channels` (FP32, as cuDNN wrote them); they
/// are replaced in place by the batch mean and the unbiased variance, and save_invstd = 1/√(var + eps) is written,
/// var = max(Σx²/R − mean², 0) in FP64 (the formulas of batchnorm_train_statistics, without its shift by the first
/// row: these sums carry cuDNN's FP32 rounding, not the own kernels' order). rows must be > 1.
void batchnorm_statistics_from_sums(cudaStream_t stream, std::int64_t channels, std::int64_t rows, const float* eps,
                                    float* batch_mean, float* batch_var_unbiased, float* save_invstd);

/// One batch-norm apply: x with its per-channel parameters and statistics. Training: mean = batch mean, spread =
/// save_invstd. Inference: mean = running mean, spread = running variance, eps from device memory.
struct BnApply {
  TensorRef x;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* mean = nullptr;
  const float* spread = nullptr;
  const float* eps = nullptr;
};

/// What a fused apply adds before its ReLU: nothing, a tensor, or the batch-norm apply of a tensor (the projection
/// shortcut of a residual block, whose statistics were computed earlier).
enum class Shortcut { kNone = 0, kTensor = 1, kBatchNorm = 2 };

/// The element-wise tail of a fused layer in one pass over memory: y = [relu](round(round(BN(x)) + s')) with s' the
/// shortcut tensor or round(BN₂(shortcut x)), or y = [relu](BN(x)) without a shortcut. Every intermediate is rounded
/// to the storage type exactly where the plain parts (BN, ADD2, RELU) store it, so the result equals theirs bit for
/// bit. y may alias x or the shortcut. `mask` (plan_relu_masks; relu, FP16, 16-byte aligned, c_stride a multiple of
/// 8): also writes the sign of the stored y as bits, byte row·c_stride/8 + ch/8, bit ch % 8 (padding channels 0).
void batchnorm_apply_fused(cudaStream_t stream, bool inference, const BnApply& main, Shortcut shortcut,
                           const TensorRef& s, const BnApply* s_bn, bool relu, const TensorRef& y,
                           std::uint8_t* mask = nullptr);

/// Training forward: per channel c over the R = N·H·W rows, mean_c and biased var_c (sums of x − x[row 0]);
/// y = (x − mean)·(invstd·γ) + β with invstd = 1/√(var + eps). Writes batch_mean = mean, batch_var_unbiased =
/// var·R/(R−1) and save_invstd = invstd (C floats each); the running statistics are blended later by
/// range_bn_running_update. eps is read from device memory (the hyper-parameter slot). R must be > 1. y may be x.
void batchnorm_forward_train(cudaStream_t stream, const TensorRef& x, const float* gamma, const float* beta,
                             const float* eps, const TensorRef& y, float* batch_mean, float* batch_var_unbiased,
                             float* save_invstd, void* workspace, std::size_t workspace_bytes,
                             const SyncReduce* sync = nullptr);

/// Inference forward: y = (x − running_mean)·(1/√(running_var + eps))·γ + β; eps from device memory. y may be x.
void batchnorm_forward_inference(cudaStream_t stream, const TensorRef& x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, const float* eps,
                                 const TensorRef& y);

/// Backward of the training forward with x̂ = (x − mean)·invstd: dβ += Σ dy; dγ += Σ dy·x̂ (ALWAYS accumulated:
/// ZERO_GRAD clears them once per step; either may be null); dx (=|+=) γ·invstd·(dy − Σdy/R − (x − mean)·Σdy·x̂·invstd/R)
/// when dx is not null (TensorRef with ptr == nullptr: no data gradient). save_mean is the batch mean of the forward.
void batchnorm_backward(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, const float* gamma,
                        const float* save_mean, const float* save_invstd, const TensorRef& dx, bool accumulate_dx,
                        float* dgamma, float* dbeta, void* workspace, std::size_t workspace_bytes,
                        const SyncReduce* sync = nullptr);

/// The forward parameters of a BN → ReLU pair whose ReLU output the backward does not read: the mask is recomputed
/// from x as round((x − mean)·(invstd·γ) + β) > 0, the forward apply's own formula.
struct ReluMask {
  const float* invstd = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
};

/// batchnorm_backward of BN followed by ReLU, where dy is the gradient at the ReLU's output: the ReLU backward is
/// folded into both passes (its gradient is never stored). mask == nullptr: plain batchnorm_backward.
void batchnorm_relu_backward(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, const float* gamma,
                             const float* save_mean, const float* save_invstd, const ReluMask* mask,
                             const TensorRef& dx, bool accumulate_dx, float* dgamma, float* dbeta, void* workspace,
                             std::size_t workspace_bytes, const SyncReduce* sync = nullptr);

/// The projection shortcut's BN of a block end whose backward reads the same gradient g (plan ADD_RELU_BN_BN_BWD):
/// its input x' (g's layout), parameters and saved statistics, its data gradient dx' (written, never accumulated) and
/// parameter gradients (accumulated, either may be null).
struct ShortcutBnBackward {
  TensorRef x;
  const float* gamma = nullptr;
  const float* save_mean = nullptr;
  const float* save_invstd = nullptr;
  TensorRef dx;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
};

/// relu_backward_sum (elementwise.h) followed by batchnorm_backward of the BN whose output fed the residual sum
/// (plan ADD_RELU_BN_BWD): g = relu'(y)·round(dy + addend) is formed and stored into g (the shortcut reads it too)
/// by the BN backward's statistics pass, then read by its dx pass, instead of written by one pass and read back by
/// another. Results equal the two calls' bit for bit. x, y, dy, addend, g and dx share one layout; g may not alias
/// x, y, dy or addend. `mask` (FP16 only): y's sign as batchnorm_apply_fused wrote it, read instead of y where the
/// statistics pass runs 8-channel vectors (y is read otherwise, so it must still hold the same values).
/// `shortcut`: then batchnorm_backward(shortcut->x, g, ...) too, its statistics summed in the same pass and both data
/// gradients written by one apply pass reading g once, when the tensors are 16-byte vectors, dx is not accumulated,
/// there is no `sync` and the workspace holds twice batchnorm_workspace_bytes(x); else as the two calls. Either way
/// the results equal the two calls' bit for bit.
void batchnorm_add_relu_backward(cudaStream_t stream, const TensorRef& y, const TensorRef& dy, const TensorRef& addend,
                                 const TensorRef& g, const TensorRef& x, const float* gamma, const float* save_mean,
                                 const float* save_invstd, const TensorRef& dx, bool accumulate_dx, float* dgamma,
                                 float* dbeta, void* workspace, std::size_t workspace_bytes,
                                 const SyncReduce* sync = nullptr, const std::uint8_t* mask = nullptr,
                                 const ShortcutBnBackward* shortcut = nullptr);

}  // namespace renaissance::cuda
