// One convolution pass as a cuDNN graph through cudnn-frontend (NVIDIA's header-only C++ library over cuDNN's
// graph API; DESIGN §11 lever 5). Only conv_graph.cpp includes cudnn-frontend: it takes about a minute to compile.
//
// A GraphConv is one pass (forward, data gradient or weight gradient; the gradients optionally accumulating into
// their output through a pointwise add in the epilogue) of one layer shape. Its candidates are the engine
// configurations cuDNN's heuristics offer for the graph, filtered by the numerics rules:
//   - deterministic: no engine with the NONDETERMINISTIC numerical note;
//   - strict FP32 (FP32 storage without TF32): no TENSOR_CORE, DOWN_CONVERT_INPUTS, FFT or WINOGRAD engines;
//   - always: no REDUCED_PRECISION_REDUCTION, no runtime-compiled engines (NVRTC, seconds per plan at start-up),
//     none over the workspace limit.
// Each candidate's plan is built on request (`build`); a cached choice is replayed by its engine id and knobs
// (`replay`), without heuristics. Building and timing are setup work; `execute` only enqueues on the handle's
// stream, so it can be captured into a CUDA graph.
#pragma once

#include <kernels/cuda/dnn_handles.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::cuda {

enum class ConvPass : std::uint8_t;  // conv.h

/// Everything a pass's graph depends on. x/dx share x's shape and row stride, y/dy share y's.
struct GraphConvDesc {
  ConvPass pass{};
  bool accumulate = false;   ///< data/weight gradient: the output is added to (out = old + result)
  /// Forward, FP16 only: cuDNN's GEN_STATS in the epilogue also writes Σy and Σy² per output channel (FP32 [y.c]) of
  /// the y it stores, for the batch-norm statistics that follow the convolution (issue 15: conv + BN-statistics
  /// epilogue; an experiment until measured: bench_gpu_kernels `ConvStats`, GpuConvEngines.Genstats*).
  bool genstats = false;
  Shape x, y;
  std::int64_t x_cs = 0, y_cs = 0;  ///< row strides in elements (>= channels)
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, groups = 1;
  DType dtype = DType::F32;  ///< storage of x, w, y (F32 or F16); arithmetic is FP32
  bool strict_fp32 = true;   ///< FP32 storage: no TF32 / down-converting / FFT / Winograd engines
  bool deterministic = true;
  std::size_t workspace_limit = 0;
};

/// A chosen engine configuration: cuDNN's global engine index, its knob choices as cudnn-frontend names them
/// (fe::KnobType_t, value) and cuDNN's tag. The tag ("eng47_k2=2_k6=2_k13=1_k14=0_k22=2", backend knob numbers) is
/// the exact identity: cudnn-frontend maps backend knob types it has no name for (LDGB = 6, LDGC = 22, ...) to
/// NOT_SET (0) and keeps one of them, so two configs that differ only there have equal knob lists (issue 11: a
/// cached start-up found eng47 with k6=3 for a timed choice of k6=2 and computed the stem's FP16 fprop otherwise).
struct EngineConfig {
  std::int64_t engine = -1;
  std::vector<std::pair<std::int64_t, std::int64_t>> knobs;
  std::string name;  ///< cuDNN's tag, e.g. "eng62_k2=1_k13=1"; empty where cuDNN gave none
  bool valid() const { return engine >= 0; }
  /// The knob list names every knob (none NOT_SET), so create_execution_plan can rebuild exactly this config.
  bool exact() const {
    for (const auto& k : knobs)
      if (k.first == 0) return false;
    return true;
  }
};

class GraphConv {
 public:
  /// Builds the graph's tensors and operation and validates them (host only). `fallback_heuristics`: query cuDNN's
  /// FALLBACK list instead of heuristics mode A (for when mode A offers nothing usable).
  GraphConv(const GraphConvDesc& desc, bool fallback_heuristics = false);
  ~GraphConv();
  GraphConv(const GraphConv&) = delete;
  GraphConv& operator=(const GraphConv&) = delete;

  /// Queries cuDNN's heuristics and applies the filters; returns the number of candidates (0: none, `why` says
  /// why). Setup only.
  int query(cudnnHandle_t handle, std::string* why);
  /// Builds candidate i's execution plan; false (with `why`) when the engine refuses the graph or the limits.
  bool build(int i, std::string* why);
  /// After query(): the candidate that is exactly this config (by cuDNN's tag where the config has one, else by an
  /// exact knob list), or -1.
  int find(const EngineConfig& config) const;
  /// Replays a cached choice without the heuristics: a plan for exactly this engine and these knobs (cuDNN's
  /// create_execution_plan). Returns its index (for execute and workspace), or -1 with `why`. A config that is not
  /// exact() is refused (its knobs cannot be named to cudnn-frontend); ConvOp first looks for the choice among the
  /// heuristics' candidates.
  int replay(cudnnHandle_t handle, const EngineConfig& config, std::string* why);
  int candidates() const;
  EngineConfig config(int i) const;
  std::int64_t workspace(int i) const;

  /// Enqueues plan i on the handle's stream. x/w/y are the pass's tensors (dgrad: x = dx out, y = dy in; wgrad:
  /// w = dw out); an accumulating pass reads its output's old values from the same pointer. A genstats graph also
  /// writes `sum` and `sqsum` (FP32, y.c each; required there, ignored otherwise).
  void execute(cudnnHandle_t handle, int i, const void* x, const void* w, const void* y, void* workspace,
               float* sum = nullptr, float* sqsum = nullptr) const;
  const GraphConvDesc& desc() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m;
};

/// "cudnn-frontend 1.32.0" (the headers this was built with).
std::string cudnn_frontend_version();

}  // namespace renaissance::cuda
