// 2-D convolution through cuDNN: NHWC activations with explicit row strides (padded FP16 channels), OHWI weights
// ([out][kh][kw][in/groups]), zero padding, groups. The same formulas as kernels/cpu/conv2d.h; arithmetic in FP32
// (FP16 storage uses FP32 compute), so FP32 matches the CPU kernels to ~1e-6 of max|y|.
//
// Engines (DESIGN §11 lever 5): each pass runs through cuDNN's graph API (cudnn-frontend, conv_graph.h): the
// engine configurations of cuDNN's heuristics, restricted by the numerics rules and the determinism setting, the
// best few built and timed once on the real shapes, the fastest kept. cuDNN's legacy cudnnConvolution* API is the
// fallback for a pass no graph plan supports (describe() and the profile say which). Depthwise forward and data
// gradient passes also time the project's own kernels (depthwise.h, deterministic) and keep them where they are
// faster than cuDNN's choice. Choices are remembered in the
// EngineCache (engine_cache.h) per shape, GPU and library version, so identical layers share one timing and a
// saved cache makes the next start-up choose the same engines without timing again.
//
// Life cycle: construct once per layer shape at setup (descriptors only), `choose` the engines of the passes that
// will run (setup only: builds plans, times, synchronises), size one workspace from `workspace_bytes()`, then run
// the passes as often as needed, also inside CUDA graph captures: the passes never allocate, synchronise or search.
// Run every pass once outside a capture before the first capture (cuDNN loads its kernels lazily).
#pragma once

#include <kernels/cuda/common.h>
#include <kernels/cuda/dnn_handles.h>

#include <cstddef>
#include <cstdint>
#include <functional>
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
/// A pass as it will run: the gradients either overwrite their output or accumulate into it (dx of a residual
/// branch). Each combination that will run gets its own engine (an accumulating graph adds the old output in the
/// epilogue).
constexpr unsigned conv_pass_bit(ConvPass p, bool accumulate = false) {
  return 1u << (static_cast<unsigned>(p) + (accumulate && p != ConvPass::Forward ? 3u : 0u));
}
/// Every pass, overwriting and accumulating.
constexpr unsigned kAllConvPasses = 0x37u;

/// Which cuDNN API the passes may use.
enum class ConvEngine : std::uint8_t {
  Auto,    ///< the graph API, the legacy API where no graph plan supports a pass
  Graph,   ///< the graph API only: a pass without a graph plan is an error (tests)
  Legacy,  ///< the legacy cudnnConvolution* API only (comparisons: `--conv-api legacy`)
};
const char* conv_engine_name(ConvEngine e);

/// Real device tensors of the op's shape that choose() may time on (their contents are overwritten: setup only).
/// x: x (dx), w: w (dw), y: y (dy). Null members: not available.
struct ConvTensors {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
};

/// Whether choose() considers the own kernels (depthwise.h) for the passes they cover.
enum class OwnKernels : std::uint8_t {
  Timed,   ///< timed beside cuDNN's choice, the faster kept (with ConvEngine::Auto only; untimed: cuDNN's choice)
  Off,     ///< cuDNN only
  Always,  ///< wherever they cover the pass, without timing (tests)
};

/// How choose() picks.
struct ConvChoose {
  bool deterministic = true;           ///< only engines cuDNN marks deterministic
  ConvEngine engine = ConvEngine::Auto;
  OwnKernels own = OwnKernels::Timed;
  bool time = true;                    ///< time the best candidates (false: the heuristics' first that builds)
  /// Tensors to time on. Null: carved from the front of the setup workspace (see find_scratch_bytes); when they do
  /// not fit, nothing is timed.
  const ConvTensors* tensors = nullptr;
};

/// y = conv(x, w) + b, dx (+)= conv_bwd_data(dy, w), dw (+)= conv_bwd_filter(x, dy), db (+)= Σ_{n,h,w} dy; formulas
/// in kernels/cpu/conv2d.h. Strict FP32 (the default) uses no tensor-core (TF32), FFT or Winograd engines, whose
/// reduced-precision inputs or transforms lose precision.
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

  /// Bytes of the setup scratch for timing on carved tensors (x, w and y, then up to `workspace_limit` bytes of
  /// engine workspace): pass a buffer of this size to `choose` when no real tensors are given.
  std::size_t find_scratch_bytes(std::size_t workspace_limit) const;

  /// Chooses the engine of every pass in `passes` (a mask of conv_pass_bit(pass, accumulate); setup only: builds
  /// plans, times them, synchronises). `workspace_ptr`/`workspace_bytes`: a device buffer for timing; every chosen
  /// engine needs at most `workspace_bytes` (less the carved tensors when `how.tensors` is null). Without
  /// `workspace_ptr`, nothing is timed and `workspace_bytes` is only the limit. Choices are looked up in and stored
  /// into EngineCache::global(). `handles` must outlive the op; the passes rebind its cuDNN handle to their stream.
  /// A pass not in `passes` cannot run (a first layer needs no data gradient).
  void choose(DnnHandles& handles, void* workspace_ptr, std::size_t workspace_bytes, const ConvChoose& how,
              unsigned passes = kAllConvPasses);
  /// choose() with ConvChoose{deterministic}, timing when workspace_ptr is given.
  void choose(DnnHandles& handles, void* workspace_ptr, std::size_t workspace_bytes, bool deterministic,
              unsigned passes = kAllConvPasses);
  bool chosen() const;

  /// Workspace the passes need (valid after choose): the largest of all chosen, or one pass's (both of its
  /// accumulate variants).
  std::size_t workspace_bytes() const;
  std::size_t workspace_bytes(ConvPass pass) const;
  /// The engine of a pass for logs and the profile: "backward data: graph eng63_k25=1, 0.128 ms, 2.1 MB workspace,
  /// deterministic" or "... legacy ALGO_1 (fallback: <why>) ...". `accumulate`: that variant's engine.
  std::string describe(ConvPass pass, bool accumulate = false) const;
  /// The short form for the profile table: "graph eng63_k25=1" / "legacy ALGO_1 (fallback)".
  std::string engine_label(ConvPass pass, bool accumulate = false) const;
  /// True when the pass (variant) runs through the graph API.
  bool uses_graph(ConvPass pass, bool accumulate = false) const;
  /// True when the pass (variant) runs the own kernel (depthwise.h).
  bool uses_own(ConvPass pass, bool accumulate = false) const;

  /// y = conv(x, w) + bias. `w` [out][kh][kw][in/groups] in the op's dtype; `bias` FP32 [out] or null.
  /// y's padding channels are not written.
  void forward(cudaStream_t stream, const TensorRef& x, const void* w, const float* bias, const TensorRef& y,
               Workspace workspace) const;
  /// dx = ∂L/∂x (accumulate: dx += ...). Without accumulate, dx is not read.
  void backward_data(cudaStream_t stream, const TensorRef& dy, const void* w, const TensorRef& dx, bool accumulate,
                     Workspace workspace) const;
  /// dw = ∂L/∂w and, when db is not null, db = Σ dy over N·H·W (accumulate: add into both). dw in the op's dtype,
  /// db FP32 [out]. The bias gradient is an own deterministic reduction.
  void backward_filter(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, void* dw, float* db,
                       bool accumulate, Workspace workspace) const;

  /// The forward with the batch-norm statistics of y in its epilogue (issue 15: conv + BN statistics; cuDNN's
  /// GEN_STATS after CONVOLUTION_FORWARD, conv_graph.h): one graph plan writes y and, per output channel, Σy and Σy²
  /// (FP32). Kept only where it is faster, by more than timing noise, than the chosen forward followed by `unfused`
  /// (the caller's own statistics kernel on y, launched on the legacy default stream); that decision is cached like
  /// the passes' engines, so a second start-up makes the same one. Setup only, after choose() with the forward among
  /// its passes and timing on real tensors (`t`: x, w, y; `sum`/`sqsum`: y.c floats each; `workspace_ptr` the engine
  /// workspace of `workspace_bytes`). FP16 storage, ungrouped, unstaged, graph API (`how.engine` not Legacy);
  /// anything else keeps the plain forward. Returns uses_stats().
  bool choose_stats(void* workspace_ptr, std::size_t workspace_bytes, const ConvChoose& how, const ConvTensors& t,
                    float* sum, float* sqsum, const std::function<void()>& unfused);
  /// True when choose_stats kept the fused plan: then forward_stats replaces forward + the statistics kernel.
  bool uses_stats() const;
  /// "graph eng2_k2=4 (0.136 ms; plain + statistics 0.174 ms)" or why the plain forward stays.
  std::string stats_label() const;
  /// y = conv(x, w) with sum[c] = Σy and sqsum[c] = Σy² over the N·H·W rows of the stored (FP16) y, both FP32 [y.c]
  /// and overwritten. Only after choose_stats returned true.
  void forward_stats(cudaStream_t stream, const TensorRef& x, const void* w, const TensorRef& y, float* sum,
                     float* sqsum, Workspace workspace) const;

  /// Entries in the process-wide engine cache (for tests and logs).
  static std::size_t algo_cache_size();
  /// Seconds spent in choose() by all ConvOps of this process (building plans and timing: start-up figures).
  static double choose_seconds();

 private:
  struct Impl;
  std::unique_ptr<Impl> m;
};

}  // namespace renaissance::cuda
