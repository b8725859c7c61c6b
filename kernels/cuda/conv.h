// 2-D convolution through cuDNN: NHWC activations with explicit row strides (padded FP16 channels), OHWI weights
// ([out][kh][kw][in/groups]), zero padding, groups. The same formulas as kernels/cpu/conv2d.h; arithmetic in FP32
// (FP16 storage uses FP32 compute), so FP32 matches the CPU kernels to ~1e-6 of max|y|.
//
// Life cycle (DESIGN §7, §11.5): construct once per layer shape at setup (descriptors only), `choose` the three
// algorithms once (timed search or heuristics, cached process-wide per shape), size one workspace from
// `workspace_bytes()`, then run the passes as often as needed, also inside CUDA graph captures: the passes never
// allocate, synchronise or search. Run every pass once outside a capture before the first capture (cuDNN loads
// its kernels lazily).
#pragma once

#include <kernels/cuda/common.h>
#include <kernels/cuda/dnn_handles.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace renaissance::cuda {

struct ConvParams {
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;  ///< zero padding on both sides
  int groups = 1;            ///< groups == in channels: depthwise (out = in · multiplier)
};

/// Everything a convolution's algorithms depend on. dx has x's shape and row stride, dy has y's.
struct ConvSpec {
  Shape x;                       ///< NHWC input
  std::int64_t x_c_stride = 0;   ///< elements per (n,h,w) row of x and dx; 0: compact (x.c)
  Shape y;                       ///< NHWC output, C = out channels
  std::int64_t y_c_stride = 0;   ///< elements per row of y and dy; 0: compact (y.c)
  ConvParams params;
  DType dtype = DType::F32;      ///< storage of x, w, y, dx, dw, dy (F32 or F16); bias and db are always FP32
  bool allow_tf32 = false;       ///< FP32 only: let cuDNN use TF32 tensor cores (breaks the 1e-5 match with the CPU)
  /// Always run through compact copies of padded tensors (normally only the fallback when no cuDNN algorithm takes
  /// the strided layout); for tests.
  bool force_staging = false;
};

enum class ConvPass : std::uint8_t { Forward = 0, BackwardData = 1, BackwardFilter = 2 };
constexpr unsigned conv_pass_bit(ConvPass p) { return 1u << static_cast<unsigned>(p); }
constexpr unsigned kAllConvPasses = 7u;

/// y = alpha · conv(x, w) + b, dx (+)= alpha · conv_bwd_data(dy, w), dw (+)= alpha · conv_bwd_filter(x, dy),
/// db (+)= alpha · Σ_{n,h,w} dy; formulas in kernels/cpu/conv2d.h. Strict FP32 (the default) uses FMA math and only
/// the GEMM-like and direct algorithms (no FFT or Winograd, whose transforms lose precision).
class ConvOp {
 public:
  /// Builds and checks the descriptors (y must be the shape the parameters give). No device work.
  explicit ConvOp(const ConvSpec& spec);
  ~ConvOp();
  ConvOp(ConvOp&&) noexcept;
  ConvOp& operator=(ConvOp&&) noexcept;
  ConvOp(const ConvOp&) = delete;
  ConvOp& operator=(const ConvOp&) = delete;

  const ConvSpec& spec() const;
  /// out · kernel_h · kernel_w · (in / groups)
  std::int64_t weight_elems() const;

  /// Bytes of the setup scratch for a timed search (x, w and y tensors, then up to `workspace_limit` bytes of
  /// algorithm workspace): pass a buffer of this size to `choose`.
  std::size_t find_scratch_bytes(std::size_t workspace_limit) const;

  /// Chooses the forward, backward-data and backward-filter algorithms (setup only; synchronises).
  /// With `workspace_ptr`: a timed search (cudnnFind*AlgorithmEx) on tensors carved from the front of that device
  /// buffer of `workspace_bytes`; the rest is the algorithm workspace limit (see find_scratch_bytes). Without:
  /// cuDNN's heuristics, `workspace_bytes` being the limit. `deterministic` keeps only algorithms cuDNN reports as
  /// deterministic. Results are cached per (device, spec, limit, mode), so identical layers share one search.
  /// `handles` must outlive the op; the passes rebind its cuDNN handle to their stream.
  /// `passes`: a mask of conv_pass_bit(...) — only those passes get an algorithm (and may run); a layer whose
  /// data gradient is never needed (the first layer) need not have a backward-data algorithm at all.
  void choose(DnnHandles& handles, void* workspace_ptr, std::size_t workspace_bytes, bool deterministic,
              unsigned passes = kAllConvPasses);
  bool chosen() const;

  /// Workspace the passes need (valid after choose): the largest of the three, or one pass's.
  std::size_t workspace_bytes() const;
  std::size_t workspace_bytes(ConvPass pass) const;
  /// "IMPLICIT_PRECOMP_GEMM, tensor-op math, 1.5 MB workspace, strided" for logs.
  std::string describe(ConvPass pass) const;

  /// y = alpha · conv(x, w) + bias. `w` [out][kh][kw][in/groups] in the op's dtype; `bias` FP32 [out] or null.
  /// y's padding channels are not written.
  void forward(cudaStream_t stream, const TensorRef& x, const void* w, const float* bias, const TensorRef& y,
               Workspace workspace, float alpha = 1.0f) const;
  /// dx = alpha · ∂L/∂x (accumulate: dx += ...). Without accumulate, dx is not read.
  void backward_data(cudaStream_t stream, const TensorRef& dy, const void* w, const TensorRef& dx, bool accumulate,
                     Workspace workspace, float alpha = 1.0f) const;
  /// dw = alpha · ∂L/∂w and, when db is not null, db = alpha · Σ dy over N·H·W (accumulate: add into both).
  /// dw in the op's dtype, db FP32 [out]. The bias gradient is an own deterministic reduction.
  void backward_filter(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, void* dw, float* db,
                       bool accumulate, Workspace workspace, float alpha = 1.0f) const;

  /// Entries in the process-wide algorithm cache (for tests and logs).
  static std::size_t algo_cache_size();

 private:
  struct Impl;
  std::unique_ptr<Impl> m;
};

}  // namespace renaissance::cuda
