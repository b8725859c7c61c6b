#include <kernels/cuda/conv.h>

#include <kernels/cuda/conv_graph.h>
#include <kernels/cuda/depthwise.h>
#include <kernels/cuda/dnn_bias.h>
#include <kernels/cuda/engine_cache.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace renaissance::cuda {

namespace {

constexpr std::size_t kAlign = 256;

std::size_t align256(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// ---- RAII descriptors -----------------------------------------------------------------------------------------------

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(d)); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { CUDNN_CHECK_NOTHROW(cudnnDestroyFilterDescriptor(d)); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { CUDNN_CHECK_NOTHROW(cudnnDestroyConvolutionDescriptor(d)); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

int to_int(std::int64_t v, const char* what) {
  RN_CHECK(v >= 0 && v <= INT_MAX, "conv: {} = {} does not fit the 32-bit cuDNN descriptor", what, v);
  return static_cast<int>(v);
}

/// NHWC with an explicit row stride: cuDNN's (n, c, h, w) strides are (h·w·cs, 1, w·cs, cs).
void set_nhwc(cudnnTensorDescriptor_t d, cudnnDataType_t t, const Shape& s, std::int64_t cs) {
  to_int(s.n * s.h * s.w * cs, "tensor elements");
  CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d, t, to_int(s.n, "n"), to_int(s.c, "c"), to_int(s.h, "h"),
                                           to_int(s.w, "w"), to_int(s.h * s.w * cs, "n stride"), 1,
                                           to_int(s.w * cs, "h stride"), to_int(cs, "w stride")));
}

// ---- one pass's algorithm -------------------------------------------------------------------------------------------

struct PassChoice {
  int algo = -1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t algo_ws = 0;
  bool staged = false;          // compact copies of the padded tensors
  bool timed = false;           // found by cudnnFind*Ex (else heuristics)
  float time_ms = -1.0f;
  bool deterministic = false;
};

/// The descriptors one pass runs with (strided or compact).
struct PassDescs {
  cudnnTensorDescriptor_t x, y;  // x/dx and y/dy
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
};

/// Tensors for a timed search.
struct FindBuffers {
  void* x;
  void* w;
  void* y;
  void* ws;
};

struct FwdTraits {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static bool precise(Algo a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
  }
  static cudnnStatus_t find(cudnnHandle_t h, const PassDescs& d, const FindBuffers& b, std::size_t ws, int* n,
                            Perf* perf) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, d.x, b.x, d.w, b.w, d.conv, d.y, b.y, kCount, n, perf, b.ws,
                                                  ws);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const PassDescs& d, int* n, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kCount, n, perf);
  }
  static cudnnStatus_t ws_size(cudnnHandle_t h, const PassDescs& d, Algo a, std::size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a, bytes);
  }
};

struct BwdDataTraits {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static bool precise(Algo a) { return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1; }
  static cudnnStatus_t find(cudnnHandle_t h, const PassDescs& d, const FindBuffers& b, std::size_t ws, int* n,
                            Perf* perf) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, b.w, d.y, b.y, d.conv, d.x, b.x, kCount, n, perf,
                                                       b.ws, ws);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const PassDescs& d, int* n, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kCount, n, perf);
  }
  static cudnnStatus_t ws_size(cudnnHandle_t h, const PassDescs& d, Algo a, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, a, bytes);
  }
};

struct BwdFilterTraits {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static bool precise(Algo a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  }
  static cudnnStatus_t find(cudnnHandle_t h, const PassDescs& d, const FindBuffers& b, std::size_t ws, int* n,
                            Perf* perf) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, b.x, d.y, b.y, d.conv, d.w, b.w, kCount, n, perf,
                                                         b.ws, ws);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const PassDescs& d, int* n, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kCount, n, perf);
  }
  static cudnnStatus_t ws_size(cudnnHandle_t h, const PassDescs& d, Algo a, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, a, bytes);
  }
};

struct SearchRules {
  std::size_t limit = 0;
  bool deterministic = false;
  bool strict_fp32 = false;               // FMA math, precise algorithms only
  cudnnMathType_t request = CUDNN_DEFAULT_MATH;
};

/// Candidates come sorted by cuDNN (time for a timed search, expected speed for heuristics); the first that passes
/// the rules wins. `notes` collects why a search came back empty.
template <typename T>
std::optional<PassChoice> search(cudnnHandle_t h, const PassDescs& d, const FindBuffers* find, const SearchRules& r,
                                 std::string* notes) {
  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, r.request));
  typename T::Perf perf[T::kCount];
  int n = 0;
  const cudnnStatus_t st = find ? T::find(h, d, *find, r.limit, &n, perf) : T::heuristic(h, d, &n, perf);
  if (st != CUDNN_STATUS_SUCCESS) {
    char msg[512] = {0};
    cudnnGetLastErrorString(msg, sizeof msg);
    *notes += fmt::format(" [{}: {} {}]", find ? "find" : "heuristics", cudnnGetErrorString(st), msg);
    (void)cudaGetLastError();  // a failed search must not leave a (non-sticky) error for the next check
    return std::nullopt;
  }
  int supported = 0;
  for (int i = 0; i < n; ++i) {
    const auto& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    ++supported;
    if (r.deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    cudnnMathType_t math = p.mathType;
    if (r.strict_fp32) {
      if (!T::precise(p.algo) || math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
        continue;
      math = CUDNN_FMA_MATH;
    }
    if (p.memory > r.limit) continue;
    if (cudnnSetConvolutionMathType(d.conv, math) != CUDNN_STATUS_SUCCESS) continue;
    std::size_t bytes = 0;
    if (T::ws_size(h, d, p.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > r.limit) continue;
    PassChoice c;
    c.algo = static_cast<int>(p.algo);
    c.math = math;
    c.algo_ws = std::max(bytes, p.memory);
    c.timed = find != nullptr;
    c.time_ms = find ? p.time : -1.0f;
    c.deterministic = p.determinism == CUDNN_DETERMINISTIC;
    return c;
  }
  *notes += fmt::format(" [{}: {} candidates, {} supported, none within the rules]", find ? "find" : "heuristics", n,
                        supported);
  return std::nullopt;
}

const char* algo_name(ConvPass pass, int algo) {
  static const char* const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                    "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const bwd_data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const bwd_filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3",
                                           "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  switch (pass) {
    case ConvPass::Forward: return algo >= 0 && algo < 8 ? fwd[algo] : "?";
    case ConvPass::BackwardData: return algo >= 0 && algo < 6 ? bwd_data[algo] : "?";
    case ConvPass::BackwardFilter: return algo >= 0 && algo < 7 ? bwd_filter[algo] : "?";
  }
  return "?";
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default math";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op math (conversion)";
    case CUDNN_FMA_MATH: return "FMA math";
  }
  return "? math";
}

const char* pass_name(ConvPass p) {
  switch (p) {
    case ConvPass::Forward: return "forward";
    case ConvPass::BackwardData: return "backward data";
    case ConvPass::BackwardFilter: return "backward filter";
  }
  return "?";
}

/// Bump-allocates 256-byte-aligned pieces of a workspace.
struct Carve {
  char* p;
  void* take(std::size_t bytes) {
    char* r = p;
    p += align256(bytes);
    return r;
  }
};

// ---- pass variants --------------------------------------------------------------------------------------------------
// 0 forward, 1 backward data, 2 backward filter, 3 backward data accumulating, 4 backward filter accumulating.
constexpr int kVariants = 5;
int variant_of(ConvPass p, bool accumulate) {
  return p == ConvPass::Forward ? 0 : static_cast<int>(p) + (accumulate ? 2 : 0);
}
ConvPass pass_of(int v) { return v == 0 ? ConvPass::Forward : static_cast<ConvPass>(v > 2 ? v - 2 : v); }
bool accumulates(int v) { return v > 2; }
unsigned bit_of(int v) { return conv_pass_bit(pass_of(v), accumulates(v)); }

// ---- timing ------------------------------------------------------------------------------------------------------------
constexpr int kTimedCandidates = 4;   // graph plans timed per pass (the heuristics' best that build)
constexpr int kScannedCandidates = 24;  // heuristics entries tried for them
/// RN_DEBUG_ENGINE_CANDIDATES=N times the best N that build instead (an experiment knob: the engine cache keys do
/// not carry it, so compare with --engine-cache off).
int timed_candidates() {
  static const int n = [] {
    const char* v = std::getenv("RN_DEBUG_ENGINE_CANDIDATES");
    const int k = v != nullptr ? std::atoi(v) : 0;
    return k > 0 ? k : kTimedCandidates;
  }();
  return n;
}
constexpr int kWarmups = 2, kTimedRuns = 5;
/// A later candidate replaces the best so far only when it is faster by more than this: timing noise alone must
/// not flip a choice between near-equal engines.
constexpr float kMinGain = 0.97f;

/// Median milliseconds of `run` on the legacy default stream (setup: nothing else runs).
float median_ms(const std::function<void()>& run) {
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  try {
    for (int i = 0; i < kWarmups; ++i) run();
    for (int i = 0; i < kTimedRuns; ++i) {
      CUDA_CHECK(cudaEventRecord(a, nullptr));
      run();
      CUDA_CHECK(cudaEventRecord(b, nullptr));
      CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
  } catch (...) {
    CUDA_CHECK_NOTHROW(cudaEventDestroy(a));
    CUDA_CHECK_NOTHROW(cudaEventDestroy(b));
    throw;
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// The fastest of the first `want` candidates of `g` (n listed) that build, of at most max(kScannedCandidates,
/// 4 * timed_candidates()) heuristics entries, each timed by `time(i)` in ms (< 0: untimed, the first that builds
/// stays; an Error while timing skips the candidate): a later one replaces the best only when faster than kMinGain
/// of it. Returns its index (-1: none built, `last` says why) and its time in *best_ms.
int fastest_candidate(GraphConv& g, int n, int want, const std::function<float(int)>& time, float* best_ms,
                      std::string* last) {
  int best = -1, built = 0;
  *best_ms = 0;
  const int scan = std::max(kScannedCandidates, 4 * timed_candidates());
  for (int i = 0; i < n && i < scan && built < want; ++i) {
    if (!g.build(i, last)) continue;
    ++built;
    float ms = -1.0f;
    try {
      ms = time(i);
    } catch (const Error& e) {
      (void)cudaGetLastError();
      *last = e.what();
      continue;
    }
    if (best < 0 || (ms >= 0 && ms < *best_ms * kMinGain)) {
      best = i;
      *best_ms = ms;
    }
  }
  return best;
}

/// A cached graph choice made real for the graph `d`: found among the heuristics' candidates (mode A, then FALLBACK:
/// the lists it was chosen from, same filters, same library) by cuDNN's tag and built, else rebuilt from its engine
/// id and knobs alone. Returns its plan index in *g, or -1 with `why`. cudnn-frontend may throw (the caller catches).
int rebuild_choice(cudnnHandle_t h, const GraphConvDesc& d, const EngineConfig& c, std::unique_ptr<GraphConv>* g,
                   std::string* why) {
  int i = -1;
  for (const bool fallback_list : {false, true}) {
    *g = std::make_unique<GraphConv>(d, fallback_list);
    std::string unused;
    if ((*g)->query(h, &unused) > 0) i = (*g)->find(c);
    if (i >= 0) return (*g)->build(i, why) ? i : -1;
  }
  *g = std::make_unique<GraphConv>(d);
  return (*g)->replay(h, c, why);
}

/// "NVIDIA H200 sm90 x132" for cache keys: a choice holds for this GPU model only.
const std::string& device_key(int device) {
  static std::mutex m;
  static std::map<int, std::string> keys;
  std::lock_guard<std::mutex> lock(m);
  auto it = keys.find(device);
  if (it != keys.end()) return it->second;
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return keys[device] = fmt::format("{} sm{}{} x{}", p.name, p.major, p.minor, p.multiProcessorCount);
}

std::mutex& seconds_mutex() {
  static std::mutex m;
  return m;
}
double& seconds_total() {
  static double s = 0;
  return s;
}

}  // namespace

const char* conv_engine_name(ConvEngine e) {
  switch (e) {
    case ConvEngine::Auto: return "auto";
    case ConvEngine::Graph: return "graph";
    case ConvEngine::Legacy: return "legacy";
  }
  return "?";
}

// ---- ConvOp ------------------------------------------------------------------------------------------------------------

struct ConvOp::Impl {
  ConvSpec spec;
  std::int64_t x_cs = 0, y_cs = 0;
  std::size_t esize = 4;
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;
  TensorDesc x_strided, y_strided, x_compact, y_compact;
  FilterDesc w;
  ConvDesc conv[3];  // legacy: one per pass, each carrying the math type of its algorithm
  struct Variant {
    bool has = false;
    EngineChoice choice;
    std::unique_ptr<GraphConv> graph;  ///< Api::Graph: the graph with its built plan
    int plan = -1;                     ///< that plan's index in `graph`
    std::string note;                  ///< why the legacy fallback was taken
  };
  Variant var[kVariants];
  Variant stats;            ///< choose_stats: the forward with GEN_STATS (has: in use)
  std::string stats_note;   ///< choose_stats: what it chose, or why not
  bool chosen = false;
  DnnHandles* handles = nullptr;

  std::int64_t x_rows() const { return spec.x.n * spec.x.h * spec.x.w; }
  std::int64_t y_rows() const { return spec.y.n * spec.y.h * spec.y.w; }
  bool x_padded() const { return x_cs != spec.x.c; }
  bool y_padded() const { return y_cs != spec.y.c; }
  std::size_t x_bytes() const { return static_cast<std::size_t>(x_rows() * x_cs) * esize; }
  std::size_t y_bytes() const { return static_cast<std::size_t>(y_rows() * y_cs) * esize; }
  std::size_t w_bytes() const {
    const ConvParams& p = spec.params;
    return static_cast<std::size_t>(spec.y.c * p.kernel_h * p.kernel_w * (spec.x.c / p.groups)) * esize;
  }
  std::size_t x_stage_bytes() const { return x_padded() ? align256(x_rows() * spec.x.c * esize) : 0; }
  std::size_t y_stage_bytes() const { return y_padded() ? align256(y_rows() * spec.y.c * esize) : 0; }
  /// Workspace bytes of the staging copies a pass makes (every pass stages whichever of x/dx and y/dy is padded).
  std::size_t stage_bytes(ConvPass) const { return x_stage_bytes() + y_stage_bytes(); }

  PassDescs descs(ConvPass p, bool staged) const {
    return PassDescs{staged ? x_compact.d : x_strided.d, staged ? y_compact.d : y_strided.d, w.d,
                     conv[static_cast<int>(p)].d};
  }

  std::size_t variant_bytes(int v) const {
    const Variant& x = var[v];
    if (!x.has) return 0;
    const ConvPass p = pass_of(v);
    const auto engine_ws = static_cast<std::size_t>(x.choice.workspace);
    std::size_t b = x.choice.staged ? stage_bytes(p) + engine_ws : engine_ws;
    if (p == ConvPass::BackwardFilter) b = std::max(b, bias_grad_workspace_bytes(y_rows(), spec.y.c));
    return b;
  }

  DepthwiseSpec depthwise_spec() const {
    DepthwiseSpec d;
    d.x = spec.x, d.y = spec.y, d.x_cs = x_cs, d.y_cs = y_cs, d.dtype = spec.dtype;
    const ConvParams& p = spec.params;
    d.kernel_h = p.kernel_h, d.kernel_w = p.kernel_w, d.stride_h = p.stride_h, d.stride_w = p.stride_w;
    d.pad_h = p.pad_h, d.pad_w = p.pad_w;
    return d;
  }
  /// The own kernels cover the depthwise forward and data gradient (not the weight gradient: a reduction).
  bool own_covers(int v) const {
    return pass_of(v) != ConvPass::BackwardFilter && spec.params.groups == spec.x.c && !spec.force_staging &&
           depthwise_unsupported(depthwise_spec()).empty();
  }
  EngineChoice own_choice(float ms) const {
    EngineChoice c;
    c.api = EngineChoice::Api::Own;
    c.deterministic = true;
    c.time_ms = ms;
    return c;
  }
  void run_own(int v, cudaStream_t stream, const void* x, const void* w, const void* y, bool accumulate) const {
    if (pass_of(v) == ConvPass::Forward)
      depthwise_forward(stream, depthwise_spec(), x, w, const_cast<void*>(y));
    else
      depthwise_backward_data(stream, depthwise_spec(), y, w, const_cast<void*>(x), accumulate);
  }
  std::string signature() const {
    const ConvSpec& s = spec;
    const ConvParams& p = s.params;
    return fmt::format("{}/{}:{}/{}:k{}x{} s{}x{} p{}x{} g{} {} tf32={} staged={}", s.x.str(), x_cs, s.y.str(), y_cs,
                       p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.groups,
                       dtype_name(s.dtype), s.allow_tf32, s.force_staging);
  }

  GraphConvDesc graph_desc(int v, bool staged, bool deterministic, std::size_t limit) const {
    GraphConvDesc d;
    d.pass = pass_of(v);
    // A staged data gradient of a padded dx accumulates in the copy back; a weight gradient is never staged itself.
    d.accumulate = accumulates(v) && !(staged && d.pass == ConvPass::BackwardData && x_padded());
    d.x = spec.x;
    d.y = spec.y;
    d.x_cs = staged ? spec.x.c : x_cs;
    d.y_cs = staged ? spec.y.c : y_cs;
    const ConvParams& p = spec.params;
    d.kernel_h = p.kernel_h, d.kernel_w = p.kernel_w, d.stride_h = p.stride_h, d.stride_w = p.stride_w;
    d.pad_h = p.pad_h, d.pad_w = p.pad_w, d.groups = p.groups;
    d.dtype = spec.dtype;
    d.strict_fp32 = spec.dtype == DType::F32 && !spec.allow_tf32;
    d.deterministic = deterministic;
    d.workspace_limit = limit;
    return d;
  }

  void check_ref(const char* what, const TensorRef& t, const Shape& s, std::int64_t cs) const {
    RN_CHECK(t.ptr != nullptr, "conv {}: {} is null", signature(), what);
    RN_CHECK(t.shape == s, "conv {}: {} has shape {}, the op was set up for {}", signature(), what, t.shape.str(),
             s.str());
    RN_CHECK(t.dtype == spec.dtype, "conv {}: {} is {}, the op was set up for {}", signature(), what,
             dtype_name(t.dtype), dtype_name(spec.dtype));
    const std::int64_t got = t.c_stride ? t.c_stride : t.shape.c;
    RN_CHECK(got == cs, "conv {}: {} has row stride {}, the op was set up for {}", signature(), what, got, cs);
  }

  const Variant& check_run(int v, const Workspace& ws) const {
    const ConvPass p = pass_of(v);
    RN_CHECK(chosen && handles, "conv {}: {} before choose()", signature(), pass_name(p));
    RN_CHECK(var[v].has, "conv {}: {}{} was not among the passes given to choose()", signature(), pass_name(p),
             accumulates(v) ? " (accumulating)" : "");
    const std::size_t need = variant_bytes(v);
    RN_CHECK(ws.bytes >= need && (need == 0 || ws.ptr != nullptr), "conv {}: {} needs {} bytes of workspace, got {}",
             signature(), pass_name(p), need, ws.bytes);
    RN_CHECK(reinterpret_cast<std::uintptr_t>(ws.ptr) % kAlign == 0, "conv {}: workspace not 256-byte aligned",
             signature());
    return var[v];
  }

  /// Runs variant v's conv on (already staged) pointers. x: x or dx, w: w or dw, y: y or dy. `beta` is for the
  /// legacy API (the graph folds accumulation into its plan).
  void run_conv(int v, cudaStream_t stream, const void* x, const void* w, const void* y, void* engine_ws,
                float beta) const {
    const Variant& x_ = var[v];
    const ConvPass p = pass_of(v);
    if (x_.choice.api == EngineChoice::Api::Own) {
      run_own(v, stream, x, w, y, beta != 0.0f);
      return;
    }
    handles->set_stream(stream);
    if (x_.choice.api == EngineChoice::Api::Graph) {
      x_.graph->execute(handles->cudnn(), x_.plan, x, w, y, engine_ws);
      return;
    }
    const float alpha = 1.0f;
    const PassDescs d = descs(p, x_.choice.staged);
    const std::size_t ws = static_cast<std::size_t>(x_.choice.workspace);
    void* wsp = ws ? engine_ws : nullptr;
    switch (p) {
      case ConvPass::Forward:
        CUDNN_CHECK(cudnnConvolutionForward(handles->cudnn(), &alpha, d.x, x, d.w, w, d.conv,
                                            static_cast<cudnnConvolutionFwdAlgo_t>(x_.choice.algo), wsp, ws, &beta,
                                            d.y, const_cast<void*>(y)));
        break;
      case ConvPass::BackwardData:
        CUDNN_CHECK(cudnnConvolutionBackwardData(handles->cudnn(), &alpha, d.w, w, d.y, y, d.conv,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(x_.choice.algo), wsp, ws,
                                                 &beta, d.x, const_cast<void*>(x)));
        break;
      case ConvPass::BackwardFilter:
        CUDNN_CHECK(cudnnConvolutionBackwardFilter(handles->cudnn(), &alpha, d.x, x, d.y, y, d.conv,
                                                   static_cast<cudnnConvolutionBwdFilterAlgo_t>(x_.choice.algo), wsp,
                                                   ws, &beta, d.w, const_cast<void*>(w)));
        break;
    }
  }

  // ---- choosing ------------------------------------------------------------------------------------------------------

  struct Setup {
    DnnHandles* handles = nullptr;
    ConvChoose how;
    std::size_t limit = 0;          ///< engine workspace limit
    void* engine_ws = nullptr;      ///< where timed engines get their workspace (null: no timing)
    ConvTensors t;                  ///< the tensors to time on
    bool can_time = false;
  };

  /// The tensors a timed run of a (staged) pass uses, as the real run would: a staged run reads and writes compact
  /// copies at the front of the workspace (never the padded tensors themselves, whose padding lanes must stay
  /// zero), the engine's workspace after them.
  ConvTensors timing_tensors(const Setup& st, bool staged, void** engine_ws) const {
    ConvTensors t = st.t;
    Carve carve{static_cast<char*>(st.engine_ws)};
    if (staged) {
      if (x_padded()) t.x = carve.take(x_stage_bytes());
      if (y_padded()) t.y = carve.take(y_stage_bytes());
    }
    *engine_ws = carve.p;
    return t;
  }

  /// The graph API for variant v: the first (heuristics mode A, else FALLBACK) list that has candidates, the best few
  /// of them built and, when timing, timed. Tries the strided layout first, then compact staging copies.
  bool choose_graph(int v, const Setup& st, bool deterministic, std::string* notes) {
    // cudnn-frontend reports through error_t, but some of its paths throw: a throw is an unsupported graph here.
    try {
      return choose_graph_impl(v, st, deterministic, notes);
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      *notes += fmt::format(" [graph: {}]", e.what());
      return false;
    }
  }
  bool choose_graph_impl(int v, const Setup& st, bool deterministic, std::string* notes) {
    const ConvPass p = pass_of(v);
    const bool can_stage = x_padded() || y_padded();
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool staged = attempt == 1 || spec.force_staging;
      if (attempt == 1 && (spec.force_staging || !can_stage)) break;
      const std::size_t stage = staged ? stage_bytes(p) : 0;
      if (stage > st.limit) continue;
      for (const bool fallback_list : {false, true}) {
        auto g = std::make_unique<GraphConv>(graph_desc(v, staged, deterministic, st.limit - stage), fallback_list);
        std::string why;
        const int n = g->query(st.handles->cudnn(), &why);
        if (n == 0) {
          *notes += fmt::format(" [graph{}{}: {}]", staged ? " staged" : "", fallback_list ? " fallback" : "", why);
          continue;
        }
        float best_ms = 0;
        std::string last;
        const bool timing = st.can_time && st.how.time;
        const int best = fastest_candidate(
            *g, n, timing ? timed_candidates() : 1,
            [&](int i) {
              if (!timing) return -1.0f;
              // staged engines are timed without the copies (their cost is the same for every candidate)
              void* ews = nullptr;
              const ConvTensors t = timing_tensors(st, staged, &ews);
              return median_ms([&] { g->execute(st.handles->cudnn(), i, t.x, t.w, t.y, ews); });
            },
            &best_ms, &last);
        if (best < 0) {
          *notes += fmt::format(" [graph{}{}: {} candidates, none built: {}]", staged ? " staged" : "",
                                fallback_list ? " fallback" : "", n, last);
          continue;
        }
        Variant& x = var[v];
        x.choice = EngineChoice{};
        x.choice.api = EngineChoice::Api::Graph;
        x.choice.staged = staged;
        x.choice.graph = g->config(best);
        x.choice.deterministic = deterministic;
        x.choice.time_ms = best_ms;
        x.choice.workspace = g->workspace(best);
        x.plan = best;
        x.graph = std::move(g);
        return true;
      }
    }
    return false;
  }

  /// The legacy API for variant v (one choice per pass, shared by its accumulate variants).
  bool choose_legacy(int v, const Setup& st, bool deterministic, std::string* notes) {
    const ConvPass p = pass_of(v);
    for (int other : {1, 2, 3, 4}) {  // the other accumulate variant of the same pass already chose
      if (other == v || pass_of(other) != p || !var[other].has || var[other].choice.api != EngineChoice::Api::Legacy)
        continue;
      var[v].choice = var[other].choice;
      return true;
    }
    SearchRules rules;
    rules.deterministic = deterministic;
    rules.strict_fp32 = spec.dtype == DType::F32 && !spec.allow_tf32;
    rules.request = spec.dtype == DType::F16 ? CUDNN_TENSOR_OP_MATH
                    : rules.strict_fp32      ? CUDNN_FMA_MATH
                                             : CUDNN_DEFAULT_MATH;  // FP32 with TF32 allowed
    const bool can_stage = x_padded() || y_padded();
    std::optional<PassChoice> found;
    for (int attempt = 0; attempt < 2 && !found; ++attempt) {
      const bool staged = attempt == 1 || spec.force_staging;
      if (attempt == 1 && (spec.force_staging || !can_stage)) break;
      const std::size_t stage = staged ? stage_bytes(p) : 0;
      if (stage > st.limit) continue;
      rules.limit = st.limit - stage;
      void* ews = nullptr;
      const ConvTensors t = st.can_time ? timing_tensors(st, staged, &ews) : ConvTensors{};
      FindBuffers fb{t.x, t.w, t.y, ews};
      const PassDescs d = descs(p, staged);
      const FindBuffers* f = st.can_time && st.how.time ? &fb : nullptr;
      switch (p) {
        case ConvPass::Forward: found = search<FwdTraits>(st.handles->cudnn(), d, f, rules, notes); break;
        case ConvPass::BackwardData: found = search<BwdDataTraits>(st.handles->cudnn(), d, f, rules, notes); break;
        case ConvPass::BackwardFilter: found = search<BwdFilterTraits>(st.handles->cudnn(), d, f, rules, notes); break;
      }
      if (found) found->staged = staged;
    }
    if (!found) return false;
    EngineChoice& c = var[v].choice;
    c = EngineChoice{};
    c.api = EngineChoice::Api::Legacy;
    c.staged = found->staged;
    c.algo = found->algo;
    c.math = static_cast<int>(found->math);
    c.deterministic = found->deterministic;
    c.time_ms = found->time_ms;
    c.workspace = static_cast<std::int64_t>(found->algo_ws);
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv[static_cast<int>(p)].d, found->math));
    return true;
  }

  /// After cuDNN's choice for variant v (`cudnn_ok`: there is one): the own kernel replaces it where it covers the
  /// pass and is faster by more than timing noise (or cuDNN has nothing). Untimed, cuDNN's choice stays.
  bool consider_own(int v, const Setup& st, bool cudnn_ok) {
    Variant& x = var[v];
    const bool timing = st.can_time && st.how.time;
    if (!timing) {
      if (!cudnn_ok) x.choice = own_choice(-1.0f);
      return true;
    }
    const float ms = median_ms([&] { run_own(v, nullptr, st.t.x, st.t.w, st.t.y, accumulates(v)); });
    if (!cudnn_ok || (x.choice.time_ms >= 0 && ms < x.choice.time_ms * kMinGain)) {
      const float theirs = cudnn_ok ? x.choice.time_ms : -1.0f;
      x.choice = own_choice(ms);
      x.graph.reset();
      x.plan = -1;
      x.note = cudnn_ok ? fmt::format(" [cuDNN's choice took {:.3f} ms]", theirs) : x.note;
    }
    return true;
  }

  /// A cached choice made real: the graph plan rebuilt from its engine and knobs, or the legacy algorithm set.
  bool adopt(int v, const EngineChoice& c, const Setup& st, bool deterministic, std::string* why) {
    Variant& x = var[v];
    const ConvPass p = pass_of(v);
    if (c.api == EngineChoice::Api::Own) {
      if (!own_covers(v)) {
        *why = "the own kernel does not cover this pass";
        return false;
      }
      x.choice = c;
      x.choice.workspace = 0;
      return true;
    }
    if (c.api == EngineChoice::Api::Legacy) {
      for (int other : {1, 2, 3, 4})  // the accumulate variants of a pass share its legacy descriptor
        if (other != v && pass_of(other) == p && var[other].has && var[other].choice.api == EngineChoice::Api::Legacy &&
            (var[other].choice.algo != c.algo || var[other].choice.math != c.math)) {
          *why = "the other variant of the pass uses another legacy algorithm";
          return false;
        }
      const auto math = static_cast<cudnnMathType_t>(c.math);
      if (cudnnSetConvolutionMathType(conv[static_cast<int>(p)].d, math) != CUDNN_STATUS_SUCCESS) {
        *why = "the cached math type is not accepted";
        return false;
      }
      std::size_t bytes = 0;
      const PassDescs d = descs(p, c.staged);
      cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
      switch (p) {
        case ConvPass::Forward:
          s = FwdTraits::ws_size(st.handles->cudnn(), d, static_cast<FwdTraits::Algo>(c.algo), &bytes);
          break;
        case ConvPass::BackwardData:
          s = BwdDataTraits::ws_size(st.handles->cudnn(), d, static_cast<BwdDataTraits::Algo>(c.algo), &bytes);
          break;
        case ConvPass::BackwardFilter:
          s = BwdFilterTraits::ws_size(st.handles->cudnn(), d, static_cast<BwdFilterTraits::Algo>(c.algo), &bytes);
          break;
      }
      if (s != CUDNN_STATUS_SUCCESS || bytes > st.limit) {
        *why = "the cached legacy algorithm is not available with this workspace";
        return false;
      }
      x.choice = c;
      x.choice.workspace = static_cast<std::int64_t>(bytes);
      return true;
    }
    const std::size_t stage = c.staged ? stage_bytes(p) : 0;
    if (stage > st.limit) {
      *why = "staging does not fit the workspace";
      return false;
    }
    std::unique_ptr<GraphConv> g;
    int i = -1;
    try {
      i = rebuild_choice(st.handles->cudnn(), graph_desc(v, c.staged, deterministic, st.limit - stage), c.graph, &g,
                         why);
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      *why = e.what();
      return false;
    }
    if (i < 0) return false;
    x.choice = c;
    x.choice.workspace = g->workspace(i);
    x.plan = i;
    x.graph = std::move(g);
    return true;
  }
};

ConvOp::ConvOp(const ConvSpec& spec) : m(std::make_unique<Impl>()) {
  Impl& s = *m;
  s.spec = spec;
  const ConvParams& p = spec.params;
  RN_CHECK(spec.dtype == DType::F32 || spec.dtype == DType::F16, "conv: dtype {} (F32 or F16 expected)",
           dtype_name(spec.dtype));
  RN_CHECK(spec.x.valid() && spec.y.valid(), "conv: empty shape x={} y={}", spec.x.str(), spec.y.str());
  RN_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0 &&
               p.groups > 0,
           "conv: bad parameters k={}x{} stride={}x{} pad={}x{} groups={}", p.kernel_h, p.kernel_w, p.stride_h,
           p.stride_w, p.pad_h, p.pad_w, p.groups);
  RN_CHECK(spec.x.c % p.groups == 0 && spec.y.c % p.groups == 0,
           "conv: channels in={} out={} not divisible by groups={}", spec.x.c, spec.y.c, p.groups);
  const std::int64_t oh = (spec.x.h + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
  const std::int64_t ow = (spec.x.w + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
  RN_CHECK(spec.x.h + 2 * p.pad_h >= p.kernel_h && spec.x.w + 2 * p.pad_w >= p.kernel_w && spec.y.n == spec.x.n &&
               spec.y.h == oh && spec.y.w == ow,
           "conv: output {} does not match input {} with k={}x{} stride={}x{} pad={}x{} (expected {}x{}x{}x{})",
           spec.y.str(), spec.x.str(), p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, spec.x.n, oh,
           ow, spec.y.c);
  s.x_cs = spec.x_c_stride ? spec.x_c_stride : spec.x.c;
  s.y_cs = spec.y_c_stride ? spec.y_c_stride : spec.y.c;
  RN_CHECK(s.x_cs >= spec.x.c && s.y_cs >= spec.y.c, "conv: row strides x={} y={} smaller than the channels {} / {}",
           s.x_cs, s.y_cs, spec.x.c, spec.y.c);
  s.esize = dtype_size(spec.dtype);
  s.data_type = spec.dtype == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;

  set_nhwc(s.x_strided.d, s.data_type, spec.x, s.x_cs);
  set_nhwc(s.y_strided.d, s.data_type, spec.y, s.y_cs);
  set_nhwc(s.x_compact.d, s.data_type, spec.x, spec.x.c);
  set_nhwc(s.y_compact.d, s.data_type, spec.y, spec.y.c);
  // OHWI weights are cuDNN's NHWC filter layout: k = out, c = in / groups.
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(s.w.d, s.data_type, CUDNN_TENSOR_NHWC, to_int(spec.y.c, "out channels"),
                                         to_int(spec.x.c / p.groups, "in channels per group"), p.kernel_h,
                                         p.kernel_w));
  for (ConvDesc& c : s.conv) {
    // FP16 storage computes in FP32 (cuDNN's "pseudo half" configuration).
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c.d, p.pad_h, p.pad_w, p.stride_h, p.stride_w, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(c.d, p.groups));
  }
  int n = 0, c = 0, h = 0, w = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(s.conv[0].d, s.x_strided.d, s.w.d, &n, &c, &h, &w));
  RN_CHECK(n == spec.y.n && c == spec.y.c && h == spec.y.h && w == spec.y.w,
           "conv {}: cuDNN computes the output {}x{}x{}x{}", s.signature(), n, h, w, c);
}

ConvOp::~ConvOp() = default;
ConvOp::ConvOp(ConvOp&&) noexcept = default;
ConvOp& ConvOp::operator=(ConvOp&&) noexcept = default;

const ConvSpec& ConvOp::spec() const { return m->spec; }

std::int64_t ConvOp::weight_elems() const {
  const ConvParams& p = m->spec.params;
  return m->spec.y.c * p.kernel_h * p.kernel_w * (m->spec.x.c / p.groups);
}

std::size_t ConvOp::find_scratch_bytes(std::size_t workspace_limit) const {
  return align256(m->x_bytes()) + align256(m->w_bytes()) + align256(m->y_bytes()) + workspace_limit;
}

void ConvOp::choose(DnnHandles& handles, void* workspace_ptr, std::size_t workspace_bytes, bool deterministic,
                    unsigned passes) {
  ConvChoose how;
  how.deterministic = deterministic;
  choose(handles, workspace_ptr, workspace_bytes, how, passes);
}

void ConvOp::choose(DnnHandles& handles, void* workspace_ptr, std::size_t workspace_bytes, const ConvChoose& how,
                    unsigned passes) {
  Impl& s = *m;
  const auto t0 = std::chrono::steady_clock::now();
  RN_CHECK((passes & kAllConvPasses) != 0, "conv {}: choose() without a pass", s.signature());
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  RN_CHECK(device == handles.device(), "conv {}: handles of device {} used on device {}", s.signature(),
           handles.device(), device);
  Impl::Setup st;
  st.handles = &handles;
  st.how = how;
  if (workspace_ptr) {
    RN_CHECK(reinterpret_cast<std::uintptr_t>(workspace_ptr) % kAlign == 0,
             "conv {}: setup scratch not 256-byte aligned", s.signature());
    if (how.tensors) {
      st.t = *how.tensors;
      st.engine_ws = workspace_ptr;
      st.limit = workspace_bytes;
      st.can_time = st.t.x && st.t.w && st.t.y;
    } else {
      const std::size_t tensors = find_scratch_bytes(0);
      RN_CHECK(workspace_bytes >= tensors,
               "conv {}: setup scratch of {} bytes holds less than the {} bytes of tensors (find_scratch_bytes)",
               s.signature(), workspace_bytes, tensors);
      Carve carve{static_cast<char*>(workspace_ptr)};
      st.t.x = carve.take(s.x_bytes());
      st.t.w = carve.take(s.w_bytes());
      st.t.y = carve.take(s.y_bytes());
      st.engine_ws = carve.p;
      st.limit = workspace_bytes - tensors;
      st.can_time = true;
      // Defined contents (zeros) for the timed runs: no NaN/denormal slow paths, no uninitialised reads.
      CUDA_CHECK(cudaMemset(workspace_ptr, 0, tensors));
    }
  } else {
    st.limit = workspace_bytes;
  }
  handles.set_stream(nullptr);  // setup runs on the legacy default stream
  EngineCache& cache = EngineCache::global();
  const std::string base =
      fmt::format("{} cudnn{} {} {} det={} limit={} {} {}", device_key(device), cudnnGetVersion(),
                  cudnn_frontend_version(), s.signature(), how.deterministic, st.limit,
                  st.can_time && how.time ? "timed" : "heur", conv_engine_name(how.engine));
  for (int v = 0; v < kVariants; ++v) {
    if (!(passes & bit_of(v))) continue;  // a pass this node never runs needs no engine
    Impl::Variant& var = s.var[v];
    var = Impl::Variant{};
    // Passes the own kernels cover are keyed apart ("own=dw1": this kernel version), so a cache written before
    // they existed, or with them off, never decides for them.
    const bool own = how.own != OwnKernels::Off && how.engine == ConvEngine::Auto && s.own_covers(v);
    const std::string key = fmt::format("{} {}{}{}", base, pass_name(pass_of(v)), accumulates(v) ? " acc" : "",
                                        !own                            ? ""
                                        : how.own == OwnKernels::Always ? " own=always"
                                                                        : " own=dw1");
    std::string why;
    if (auto hit = cache.find(key); hit && s.adopt(v, *hit, st, how.deterministic, &why)) {
      var.has = true;
      cache.count(true);
      continue;
    }
    cache.count(false);
    std::string notes;
    if (!why.empty()) notes = fmt::format(" [cached choice not usable: {}]", why);
    bool ok = false;
    if (own && how.own == OwnKernels::Always) {
      var.choice = s.own_choice(-1.0f);
      ok = true;
    } else {
      ok = how.engine != ConvEngine::Legacy && s.choose_graph(v, st, how.deterministic, &notes);
      if (!ok && how.engine != ConvEngine::Graph) {
        ok = s.choose_legacy(v, st, how.deterministic, &notes);
        if (ok && how.engine == ConvEngine::Auto) {
          var.choice.fallback = true;
          var.note = notes;
        }
      }
      if (own) ok = s.consider_own(v, st, ok);
    }
    if (ok && var.note.empty() && !why.empty()) var.note = fmt::format(" [cached choice not usable: {}]", why);
    if (!why.empty()) cache.reject(fmt::format("{}: {}", key, why));
    RN_CHECK(ok, "conv {}: no cuDNN {} engine{} (deterministic={}, {} API, workspace limit {} bytes):{}",
             s.signature(), pass_name(pass_of(v)), accumulates(v) ? " for the accumulating pass" : "",
             how.deterministic, conv_engine_name(how.engine), st.limit, notes);
    var.has = true;
    cache.put(key, var.choice);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  s.handles = &handles;
  s.chosen = true;
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(seconds_mutex());
  seconds_total() += sec;
}

bool ConvOp::chosen() const { return m->chosen; }

std::size_t ConvOp::workspace_bytes(ConvPass pass) const {
  RN_CHECK(m->chosen, "conv {}: workspace_bytes() before choose()", m->signature());
  return std::max(m->variant_bytes(variant_of(pass, false)), m->variant_bytes(variant_of(pass, true)));
}

std::size_t ConvOp::workspace_bytes() const {
  return std::max({workspace_bytes(ConvPass::Forward), workspace_bytes(ConvPass::BackwardData),
                   workspace_bytes(ConvPass::BackwardFilter)});
}

bool ConvOp::uses_graph(ConvPass pass, bool accumulate) const {
  const Impl::Variant& v = m->var[variant_of(pass, accumulate)];
  return m->chosen && v.has && v.choice.api == EngineChoice::Api::Graph;
}

bool ConvOp::uses_own(ConvPass pass, bool accumulate) const {
  const Impl::Variant& v = m->var[variant_of(pass, accumulate)];
  return m->chosen && v.has && v.choice.api == EngineChoice::Api::Own;
}

std::string ConvOp::engine_label(ConvPass pass, bool accumulate) const {
  const int vi = variant_of(pass, accumulate);
  const Impl::Variant& v = m->var[vi];
  if (!m->chosen || !v.has) return "not chosen";
  const EngineChoice& c = v.choice;
  if (c.api == EngineChoice::Api::Graph)
    return fmt::format("graph {}{}", c.graph.name.empty() ? fmt::format("eng{}", c.graph.engine) : c.graph.name,
                       c.staged ? " staged" : "");
  if (c.api == EngineChoice::Api::Own) return "own depthwise";
  return fmt::format("legacy {}{}{}", algo_name(pass, c.algo), c.staged ? " staged" : "",
                     c.fallback ? " (fallback)" : "");
}

std::string ConvOp::describe(ConvPass pass, bool accumulate) const {
  const int vi = variant_of(pass, accumulate);
  const Impl::Variant& v = m->var[vi];
  if (!m->chosen || !v.has) return "not chosen";
  const EngineChoice& c = v.choice;
  std::string s = fmt::format("{}{}: {}", pass_name(pass), accumulate ? " (accumulating)" : "", engine_label(pass, accumulate));
  if (c.api == EngineChoice::Api::Legacy) s += fmt::format(", {}", math_name(static_cast<cudnnMathType_t>(c.math)));
  s += fmt::format(", {} B workspace, {}", m->variant_bytes(vi), c.staged ? "staged (compact copies)" : "strided");
  s += c.deterministic ? ", deterministic" : ", non-deterministic or unknown";
  if (c.time_ms >= 0) s += fmt::format(", {:.3f} ms", c.time_ms);
  if (!v.note.empty()) s += ";" + v.note;
  return s;
}

void ConvOp::forward(cudaStream_t stream, const TensorRef& x, const void* w, const float* bias, const TensorRef& y,
                     Workspace workspace) const {
  const Impl& s = *m;
  const int v = 0;
  const Impl::Variant& var = s.check_run(v, workspace);
  s.check_ref("x", x, s.spec.x, s.x_cs);
  s.check_ref("y", y, s.spec.y, s.y_cs);
  RN_CHECK(w != nullptr, "conv {}: null weights", s.signature());
  Carve carve{static_cast<char*>(workspace.ptr)};
  const void* xp = x.ptr;
  void* yp = y.ptr;
  if (var.choice.staged) {
    if (s.x_padded()) {
      void* xs = carve.take(s.x_stage_bytes());
      copy_rows(stream, x.ptr, s.x_cs, xs, s.spec.x.c, s.spec.dtype, s.x_rows(), s.spec.x.c, 0.0f);
      xp = xs;
    }
    if (s.y_padded()) yp = carve.take(s.y_stage_bytes());
  }
  s.run_conv(v, stream, xp, w, yp, carve.p, 0.0f);
  if (yp != y.ptr) copy_rows(stream, yp, s.spec.y.c, y.ptr, s.y_cs, s.spec.dtype, s.y_rows(), s.spec.y.c, 0.0f);
  if (bias) add_bias_rows(stream, y.ptr, s.spec.dtype, s.y_rows(), s.spec.y.c, s.y_cs, bias);
}

void ConvOp::backward_data(cudaStream_t stream, const TensorRef& dy, const void* w, const TensorRef& dx,
                           bool accumulate, Workspace workspace) const {
  const Impl& s = *m;
  const int v = variant_of(ConvPass::BackwardData, accumulate);
  const Impl::Variant& var = s.check_run(v, workspace);
  s.check_ref("dy", dy, s.spec.y, s.y_cs);
  s.check_ref("dx", dx, s.spec.x, s.x_cs);
  RN_CHECK(w != nullptr, "conv {}: null weights", s.signature());
  const float beta = accumulate ? 1.0f : 0.0f;
  Carve carve{static_cast<char*>(workspace.ptr)};
  const void* dyp = dy.ptr;
  void* dxp = dx.ptr;
  if (var.choice.staged) {
    if (s.y_padded()) {
      void* ys = carve.take(s.y_stage_bytes());
      copy_rows(stream, dy.ptr, s.y_cs, ys, s.spec.y.c, s.spec.dtype, s.y_rows(), s.spec.y.c, 0.0f);
      dyp = ys;
    }
    if (s.x_padded()) dxp = carve.take(s.x_stage_bytes());
  }
  const float conv_beta = dxp == dx.ptr ? beta : 0.0f;  // a staged dx is accumulated by the copy back
  s.run_conv(v, stream, dxp, w, dyp, carve.p, conv_beta);
  if (dxp != dx.ptr) copy_rows(stream, dxp, s.spec.x.c, dx.ptr, s.x_cs, s.spec.dtype, s.x_rows(), s.spec.x.c, beta);
}

void ConvOp::backward_filter(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, void* dw, float* db,
                             bool accumulate, Workspace workspace) const {
  const Impl& s = *m;
  const int v = variant_of(ConvPass::BackwardFilter, accumulate);
  const Impl::Variant& var = s.check_run(v, workspace);
  s.check_ref("x", x, s.spec.x, s.x_cs);
  s.check_ref("dy", dy, s.spec.y, s.y_cs);
  RN_CHECK(dw != nullptr, "conv {}: null weight gradient", s.signature());
  const float beta = accumulate ? 1.0f : 0.0f;
  Carve carve{static_cast<char*>(workspace.ptr)};
  const void* xp = x.ptr;
  const void* dyp = dy.ptr;
  if (var.choice.staged) {
    if (s.x_padded()) {
      void* xs = carve.take(s.x_stage_bytes());
      copy_rows(stream, x.ptr, s.x_cs, xs, s.spec.x.c, s.spec.dtype, s.x_rows(), s.spec.x.c, 0.0f);
      xp = xs;
    }
    if (s.y_padded()) {
      void* ys = carve.take(s.y_stage_bytes());
      copy_rows(stream, dy.ptr, s.y_cs, ys, s.spec.y.c, s.spec.dtype, s.y_rows(), s.spec.y.c, 0.0f);
      dyp = ys;
    }
  }
  s.run_conv(v, stream, xp, dw, dyp, carve.p, beta);
  // The workspace is free again once the filter gradient is queued (same stream): the reduction reuses its front.
  if (db)
    bias_grad_rows(stream, dy.ptr, s.spec.dtype, s.y_rows(), s.spec.y.c, s.y_cs, db, accumulate, 1.0f,
                   workspace.ptr, workspace.bytes);
}

bool ConvOp::choose_stats(void* workspace_ptr, std::size_t workspace_bytes, const ConvChoose& how,
                          const ConvTensors& t, float* sum, float* sqsum, const std::function<void()>& unfused) {
  Impl& s = *m;
  s.stats = Impl::Variant{};
  const Impl::Variant& fwd = s.var[0];
  auto no = [&](const std::string& why) {
    s.stats_note = why;
    return false;
  };
  if (!s.chosen || !fwd.has) return no("the forward was not chosen");
  if (s.spec.dtype != DType::F16 || s.spec.params.groups != 1 || s.spec.force_staging || fwd.choice.staged)
    return no("FP16, ungrouped, unstaged forwards only");
  if (how.engine == ConvEngine::Legacy) return no("--conv-api legacy");
  if (!workspace_ptr || !t.x || !t.w || !t.y || !sum || !sqsum || !how.time) return no("no tensors to time on");
  const auto t0 = std::chrono::steady_clock::now();
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  s.handles->set_stream(nullptr);  // setup runs on the legacy default stream
  EngineCache& cache = EngineCache::global();
  const std::string key =
      fmt::format("{} cudnn{} {} {} det={} limit={} timed {} fwd+stats bn1", device_key(device), cudnnGetVersion(),
                  cudnn_frontend_version(), s.signature(), how.deterministic, workspace_bytes,
                  conv_engine_name(how.engine));
  auto desc = [&] {
    GraphConvDesc d = s.graph_desc(0, false, how.deterministic, workspace_bytes);
    d.genstats = true;
    return d;
  };
  auto finish = [&](bool used) {
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(seconds_mutex());
    seconds_total() += sec;
    return used;
  };
  // RN_DEBUG_CONV_STATS=always (tests): the fused plan wherever one builds, untimed against the plain forward and
  // never cached.
  const char* force_env = std::getenv("RN_DEBUG_CONV_STATS");
  const bool force = force_env != nullptr && std::string(force_env) == "always";
  std::string why;
  if (auto hit = force ? std::nullopt : cache.find(key)) {
    cache.count(true);
    if (hit->api != EngineChoice::Api::Graph) {
      s.stats_note = fmt::format("plain forward + statistics ({:.3f} ms, cached)", hit->time_ms);
      return finish(false);
    }
    try {
      std::unique_ptr<GraphConv> g;
      const int i = rebuild_choice(s.handles->cudnn(), desc(), hit->graph, &g, &why);
      if (i >= 0) {
        s.stats.has = true;
        s.stats.choice = *hit;
        s.stats.choice.workspace = g->workspace(i);
        s.stats.plan = i;
        s.stats.graph = std::move(g);
        s.stats_note = fmt::format("{} (cached)", hit->str());
        return finish(true);
      }
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      why = e.what();
    }
    cache.reject(fmt::format("{}: {}", key, why));
  } else if (!force) {
    cache.count(false);
  }
  // Timed: the plain forward + the caller's statistics, then the best GEN_STATS plans of the heuristics.
  const TensorRef x{t.x, s.spec.x, s.spec.dtype, s.x_cs}, y{t.y, s.spec.y, s.spec.dtype, s.y_cs};
  const Workspace ws{workspace_ptr, workspace_bytes};
  const float plain_ms = median_ms([&] {
    forward(nullptr, x, t.w, nullptr, y, ws);
    unfused();
  });
  EngineChoice choice;
  choice.api = EngineChoice::Api::Own;  // stands for "plain forward + own statistics" in this key
  choice.time_ms = plain_ms;
  choice.deterministic = fwd.choice.deterministic;
  std::string notes;
  try {
    auto g = std::make_unique<GraphConv>(desc());
    const int n = g->query(s.handles->cudnn(), &notes);
    float best_ms = 0;
    const int best = fastest_candidate(
        *g, n, timed_candidates(),
        [&](int i) {
          return median_ms([&] { g->execute(s.handles->cudnn(), i, t.x, t.w, t.y, workspace_ptr, sum, sqsum); });
        },
        &best_ms, &notes);
    if (best >= 0 && (force || best_ms < plain_ms * kMinGain)) {
      choice = EngineChoice{};
      choice.api = EngineChoice::Api::Graph;
      choice.graph = g->config(best);
      choice.deterministic = how.deterministic;
      choice.time_ms = best_ms;
      choice.workspace = g->workspace(best);
      s.stats.has = true;
      s.stats.choice = choice;
      s.stats.plan = best;
      s.stats.graph = std::move(g);
      s.stats_note = fmt::format("{}; plain + statistics {:.3f} ms", choice.str(), plain_ms);
    } else {
      s.stats_note = best >= 0 ? fmt::format("plain forward + statistics {:.3f} ms, GEN_STATS plan {:.3f} ms",
                                             plain_ms, best_ms)
                               : fmt::format("plain forward + statistics: no GEN_STATS plan ({})", notes);
    }
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    s.stats_note = fmt::format("plain forward + statistics: GEN_STATS graph: {}", e.what());
    s.stats = Impl::Variant{};
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  if (!force) cache.put(key, s.stats.has ? s.stats.choice : choice);
  return finish(s.stats.has);
}

bool ConvOp::uses_stats() const { return m->stats.has; }

std::string ConvOp::stats_label() const { return m->stats_note; }

void ConvOp::forward_stats(cudaStream_t stream, const TensorRef& x, const void* w, const TensorRef& y, float* sum,
                           float* sqsum, Workspace workspace) const {
  const Impl& s = *m;
  RN_CHECK(s.stats.has && s.handles, "conv {}: forward_stats without a chosen GEN_STATS plan", s.signature());
  s.check_ref("x", x, s.spec.x, s.x_cs);
  s.check_ref("y", y, s.spec.y, s.y_cs);
  RN_CHECK(w != nullptr && sum != nullptr && sqsum != nullptr, "conv {}: null weights or statistics", s.signature());
  const auto need = static_cast<std::size_t>(s.stats.choice.workspace);
  RN_CHECK(workspace.bytes >= need && (need == 0 || workspace.ptr != nullptr),
           "conv {}: forward with statistics needs {} bytes of workspace, got {}", s.signature(), need,
           workspace.bytes);
  s.handles->set_stream(stream);
  s.stats.graph->execute(s.handles->cudnn(), s.stats.plan, x.ptr, w, y.ptr, workspace.ptr, sum, sqsum);
}

std::size_t ConvOp::algo_cache_size() { return EngineCache::global().size(); }

double ConvOp::choose_seconds() {
  std::lock_guard<std::mutex> lock(seconds_mutex());
  return seconds_total();
}

}  // namespace renaissance::cuda
