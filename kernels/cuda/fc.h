// Fully connected layer through cuBLASLt: x [batch × in] (row stride x_ld), W [out × in] (PyTorch's Linear
// layout, compact), y [batch × out] (row stride y_ld). The formulas of kernels/cpu/fully_connected.h; FP32
// accumulation always (FP16 storage uses CUBLAS_COMPUTE_32F), no TF32 unless asked for.
//
// Life cycle as ConvOp (conv.h): construct and `choose` at setup (cuBLASLt heuristics within a workspace limit),
// size the workspace from `workspace_bytes()`, then run the passes, also inside CUDA graph captures.
#pragma once

#include <kernels/cuda/common.h>
#include <kernels/cuda/dnn_handles.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace renaissance::cuda {

struct FcSpec {
  std::int64_t batch = 0, in = 0, out = 0;
  std::int64_t x_ld = 0;      ///< elements between rows of x and dx; 0: compact (in)
  std::int64_t y_ld = 0;      ///< elements between rows of y and dy; 0: compact (out)
  DType dtype = DType::F32;   ///< storage of x, W, y, dx, dW, dy (F32 or F16); bias and db are FP32
  bool allow_tf32 = false;    ///< FP32 only: CUBLAS_COMPUTE_32F_FAST_TF32 (breaks the 1e-5 match with the CPU)
  bool fuse_bias = true;      ///< FP32: add the bias in cuBLASLt's epilogue; FP16 (and false) use an own kernel
};

enum class FcPass : std::uint8_t { Forward = 0, BackwardData = 1, BackwardWeights = 2 };

/// y = alpha · x·Wᵀ + b; dx (+)= alpha · dy·W; dW (+)= alpha · dyᵀ·x, db (+)= alpha · Σ_batch dy.
/// x/dx as TensorRef: (batch, 1, 1, in) with row stride x_ld, or a compact (batch, h, w, c) with h·w·c = in
/// (flattened NHWC, x_ld == in). y/dy: (batch, 1, 1, out) with row stride y_ld.
class FcOp {
 public:
  explicit FcOp(const FcSpec& spec);
  ~FcOp();
  FcOp(FcOp&&) noexcept;
  FcOp& operator=(FcOp&&) noexcept;
  FcOp(const FcOp&) = delete;
  FcOp& operator=(const FcOp&) = delete;

  const FcSpec& spec() const;

  /// Picks each pass's cuBLASLt algorithm by heuristics (setup only). `deterministic` excludes split-K schemes
  /// that reduce in place through counters. `handles` must outlive the op.
  void choose(DnnHandles& handles, std::size_t workspace_limit, bool deterministic);
  bool chosen() const;
  std::size_t workspace_bytes() const;
  std::size_t workspace_bytes(FcPass pass) const;
  std::string describe(FcPass pass) const;

  /// `w` [out × in] and `bias` FP32 [out] (or null). y's padding columns are not written.
  void forward(cudaStream_t stream, const TensorRef& x, const void* w, const float* bias, const TensorRef& y,
               Workspace workspace, float alpha = 1.0f) const;
  /// Without accumulate dx is not read.
  void backward_data(cudaStream_t stream, const TensorRef& dy, const void* w, const TensorRef& dx, bool accumulate,
                     Workspace workspace, float alpha = 1.0f) const;
  /// dw [out × in] in the op's dtype; db FP32 [out] or null (own deterministic reduction).
  void backward_weights(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, void* dw, float* db,
                        bool accumulate, Workspace workspace, float alpha = 1.0f) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m;
};

}  // namespace renaissance::cuda
