#include <kernels/cuda/conv.h>

#include <kernels/cuda/dnn_bias.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <optional>

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

// ---- process-wide algorithm cache ------------------------------------------------------------------------------------

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, PassChoice>& cache() {
  static std::map<std::string, PassChoice> c;
  return c;
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

}  // namespace

// ---- ConvOp ------------------------------------------------------------------------------------------------------------

struct ConvOp::Impl {
  ConvSpec spec;
  std::int64_t x_cs = 0, y_cs = 0;
  std::size_t esize = 4;
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;
  TensorDesc x_strided, y_strided, x_compact, y_compact;
  FilterDesc w;
  ConvDesc conv[3];  // one per pass: each carries the math type of its algorithm
  PassChoice choice[3];
  bool has[3] = {false, false, false};  // which passes were chosen
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

  PassDescs descs(ConvPass p, bool staged) const {
    return PassDescs{staged ? x_compact.d : x_strided.d, staged ? y_compact.d : y_strided.d, w.d,
                     conv[static_cast<int>(p)].d};
  }

  std::size_t pass_bytes(ConvPass p) const {
    const PassChoice& c = choice[static_cast<int>(p)];
    std::size_t b = c.staged ? x_stage_bytes() + y_stage_bytes() + c.algo_ws : c.algo_ws;
    if (p == ConvPass::BackwardFilter) b = std::max(b, bias_grad_workspace_bytes(y_rows(), spec.y.c));
    return b;
  }

  std::string signature() const {
    const ConvSpec& s = spec;
    const ConvParams& p = s.params;
    return fmt::format("{}/{}:{}/{}:k{}x{} s{}x{} p{}x{} g{} {} tf32={} staged={}", s.x.str(), x_cs, s.y.str(), y_cs,
                       p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.groups,
                       dtype_name(s.dtype), s.allow_tf32, s.force_staging);
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

  void check_run(ConvPass p, const Workspace& ws) const {
    RN_CHECK(chosen && handles, "conv {}: {} before choose()", signature(), pass_name(p));
    RN_CHECK(has[static_cast<int>(p)], "conv {}: {} was not among the passes given to choose()", signature(),
             pass_name(p));
    const std::size_t need = pass_bytes(p);
    RN_CHECK(ws.bytes >= need && (need == 0 || ws.ptr != nullptr), "conv {}: {} needs {} bytes of workspace, got {}",
             signature(), pass_name(p), need, ws.bytes);
    RN_CHECK(reinterpret_cast<std::uintptr_t>(ws.ptr) % kAlign == 0, "conv {}: workspace not 256-byte aligned",
             signature());
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
  Impl& s = *m;
  RN_CHECK((passes & kAllConvPasses) != 0, "conv {}: choose() without a pass", s.signature());
  const std::size_t tensors = find_scratch_bytes(0);
  FindBuffers buffers{};
  SearchRules rules;
  rules.deterministic = deterministic;
  rules.strict_fp32 = s.spec.dtype == DType::F32 && !s.spec.allow_tf32;
  rules.request = s.spec.dtype == DType::F16 ? CUDNN_TENSOR_OP_MATH
                  : rules.strict_fp32        ? CUDNN_FMA_MATH
                                             : CUDNN_DEFAULT_MATH;  // FP32 with TF32 allowed
  if (workspace_ptr) {
    RN_CHECK(workspace_bytes >= tensors,
             "conv {}: setup scratch of {} bytes holds less than the {} bytes of tensors (find_scratch_bytes)",
             s.signature(), workspace_bytes, tensors);
    RN_CHECK(reinterpret_cast<std::uintptr_t>(workspace_ptr) % kAlign == 0,
             "conv {}: setup scratch not 256-byte aligned", s.signature());
    Carve carve{static_cast<char*>(workspace_ptr)};
    buffers.x = carve.take(s.x_bytes());
    buffers.w = carve.take(s.w_bytes());
    buffers.y = carve.take(s.y_bytes());
    buffers.ws = carve.p;
    rules.limit = workspace_bytes - tensors;
  } else {
    rules.limit = workspace_bytes;
  }

  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  RN_CHECK(device == handles.device(), "conv {}: handles of device {} used on device {}", s.signature(),
           handles.device(), device);
  const std::string base = fmt::format("dev{} cudnn{} {} det={} limit={} {}", device, cudnnGetVersion(),
                                       s.signature(), deterministic, rules.limit, workspace_ptr ? "find" : "heur");
  bool scratch_ready = false;
  handles.set_stream(nullptr);  // setup runs on the legacy default stream

  for (int pi = 0; pi < 3; ++pi) {
    const ConvPass pass = static_cast<ConvPass>(pi);
    if (!(passes & conv_pass_bit(pass))) continue;  // a pass this node never runs needs no algorithm
    s.has[pi] = true;
    const std::string key = fmt::format("{} {}", base, pi);
    {
      std::lock_guard<std::mutex> lock(cache_mutex());
      auto it = cache().find(key);
      if (it != cache().end()) {
        s.choice[pi] = it->second;
        CUDNN_CHECK(cudnnSetConvolutionMathType(s.conv[pi].d, s.choice[pi].math));
        continue;
      }
    }
    if (workspace_ptr && !scratch_ready) {
      // Defined contents (zeros) for the timed runs: no NaN/denormal slow paths, no uninitialised reads.
      CUDA_CHECK(cudaMemset(workspace_ptr, 0, tensors));
      scratch_ready = true;
    }
    std::string notes;
    std::optional<PassChoice> found;
    const bool can_stage = s.x_padded() || s.y_padded();
    for (int attempt = 0; attempt < 2 && !found; ++attempt) {
      const bool staged = attempt == 1 || s.spec.force_staging;
      if (attempt == 1 && (s.spec.force_staging || !can_stage)) break;
      const PassDescs d = s.descs(pass, staged);
      const FindBuffers* fb = workspace_ptr ? &buffers : nullptr;
      switch (pass) {
        case ConvPass::Forward: found = search<FwdTraits>(handles.cudnn(), d, fb, rules, &notes); break;
        case ConvPass::BackwardData: found = search<BwdDataTraits>(handles.cudnn(), d, fb, rules, &notes); break;
        case ConvPass::BackwardFilter: found = search<BwdFilterTraits>(handles.cudnn(), d, fb, rules, &notes); break;
      }
      if (found) found->staged = staged;
    }
    RN_CHECK(found.has_value(),
             "conv {}: no cuDNN {} algorithm (deterministic={}, workspace limit {} bytes):{}", s.signature(),
             pass_name(pass), deterministic, rules.limit, notes);
    s.choice[pi] = *found;
    CUDNN_CHECK(cudnnSetConvolutionMathType(s.conv[pi].d, found->math));
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache()[key] = *found;
  }
  if (scratch_ready) CUDA_CHECK(cudaDeviceSynchronize());
  s.handles = &handles;
  s.chosen = true;
}

bool ConvOp::chosen() const { return m->chosen; }

std::size_t ConvOp::workspace_bytes(ConvPass pass) const {
  RN_CHECK(m->chosen, "conv {}: workspace_bytes() before choose()", m->signature());
  return m->has[static_cast<int>(pass)] ? m->pass_bytes(pass) : 0;
}

std::size_t ConvOp::workspace_bytes() const {
  return std::max({workspace_bytes(ConvPass::Forward), workspace_bytes(ConvPass::BackwardData),
                   workspace_bytes(ConvPass::BackwardFilter)});
}

std::string ConvOp::describe(ConvPass pass) const {
  if (!m->chosen || !m->has[static_cast<int>(pass)]) return "not chosen";
  const PassChoice& c = m->choice[static_cast<int>(pass)];
  std::string s = fmt::format("{} {}, {}, {} B workspace, {}, {}", pass_name(pass), algo_name(pass, c.algo),
                              math_name(c.math), m->pass_bytes(pass), c.staged ? "staged (compact copies)" : "strided",
                              c.deterministic ? "deterministic" : "non-deterministic");
  if (c.timed) s += fmt::format(", {:.3f} ms", c.time_ms);
  return s;
}

void ConvOp::forward(cudaStream_t stream, const TensorRef& x, const void* w, const float* bias, const TensorRef& y,
                     Workspace workspace, float alpha) const {
  const Impl& s = *m;
  s.check_run(ConvPass::Forward, workspace);
  s.check_ref("x", x, s.spec.x, s.x_cs);
  s.check_ref("y", y, s.spec.y, s.y_cs);
  RN_CHECK(w != nullptr, "conv {}: null weights", s.signature());
  const PassChoice& c = s.choice[static_cast<int>(ConvPass::Forward)];
  const float beta = 0.0f;
  s.handles->set_stream(stream);
  Carve carve{static_cast<char*>(workspace.ptr)};
  const void* xp = x.ptr;
  void* yp = y.ptr;
  if (c.staged) {
    if (s.x_padded()) {
      void* xs = carve.take(s.x_stage_bytes());
      copy_rows(stream, x.ptr, s.x_cs, xs, s.spec.x.c, s.spec.dtype, s.x_rows(), s.spec.x.c, 0.0f);
      xp = xs;
    }
    if (s.y_padded()) yp = carve.take(s.y_stage_bytes());
  }
  const PassDescs d = s.descs(ConvPass::Forward, c.staged);
  CUDNN_CHECK(cudnnConvolutionForward(s.handles->cudnn(), &alpha, d.x, xp, d.w, w, d.conv,
                                      static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), c.algo_ws ? carve.p : nullptr,
                                      c.algo_ws, &beta, d.y, yp));
  if (yp != y.ptr) copy_rows(stream, yp, s.spec.y.c, y.ptr, s.y_cs, s.spec.dtype, s.y_rows(), s.spec.y.c, 0.0f);
  if (bias) add_bias_rows(stream, y.ptr, s.spec.dtype, s.y_rows(), s.spec.y.c, s.y_cs, bias);
}

void ConvOp::backward_data(cudaStream_t stream, const TensorRef& dy, const void* w, const TensorRef& dx,
                           bool accumulate, Workspace workspace, float alpha) const {
  const Impl& s = *m;
  s.check_run(ConvPass::BackwardData, workspace);
  s.check_ref("dy", dy, s.spec.y, s.y_cs);
  s.check_ref("dx", dx, s.spec.x, s.x_cs);
  RN_CHECK(w != nullptr, "conv {}: null weights", s.signature());
  const PassChoice& c = s.choice[static_cast<int>(ConvPass::BackwardData)];
  const float beta = accumulate ? 1.0f : 0.0f;
  s.handles->set_stream(stream);
  Carve carve{static_cast<char*>(workspace.ptr)};
  const void* dyp = dy.ptr;
  void* dxp = dx.ptr;
  if (c.staged) {
    if (s.y_padded()) {
      void* ys = carve.take(s.y_stage_bytes());
      copy_rows(stream, dy.ptr, s.y_cs, ys, s.spec.y.c, s.spec.dtype, s.y_rows(), s.spec.y.c, 0.0f);
      dyp = ys;
    }
    if (s.x_padded()) dxp = carve.take(s.x_stage_bytes());
  }
  const PassDescs d = s.descs(ConvPass::BackwardData, c.staged);
  const float conv_beta = dxp == dx.ptr ? beta : 0.0f;  // a staged dx is accumulated by the copy back
  CUDNN_CHECK(cudnnConvolutionBackwardData(s.handles->cudnn(), &alpha, d.w, w, d.y, dyp, d.conv,
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                           c.algo_ws ? carve.p : nullptr, c.algo_ws, &conv_beta, d.x, dxp));
  if (dxp != dx.ptr) copy_rows(stream, dxp, s.spec.x.c, dx.ptr, s.x_cs, s.spec.dtype, s.x_rows(), s.spec.x.c, beta);
}

void ConvOp::backward_filter(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, void* dw, float* db,
                             bool accumulate, Workspace workspace, float alpha) const {
  const Impl& s = *m;
  s.check_run(ConvPass::BackwardFilter, workspace);
  s.check_ref("x", x, s.spec.x, s.x_cs);
  s.check_ref("dy", dy, s.spec.y, s.y_cs);
  RN_CHECK(dw != nullptr, "conv {}: null weight gradient", s.signature());
  const PassChoice& c = s.choice[static_cast<int>(ConvPass::BackwardFilter)];
  const float beta = accumulate ? 1.0f : 0.0f;
  s.handles->set_stream(stream);
  Carve carve{static_cast<char*>(workspace.ptr)};
  const void* xp = x.ptr;
  const void* dyp = dy.ptr;
  if (c.staged) {
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
  const PassDescs d = s.descs(ConvPass::BackwardFilter, c.staged);
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(s.handles->cudnn(), &alpha, d.x, xp, d.y, dyp, d.conv,
                                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                             c.algo_ws ? carve.p : nullptr, c.algo_ws, &beta, d.w, dw));
  // The workspace is free again once the filter gradient is queued (same stream): the reduction reuses its front.
  if (db)
    bias_grad_rows(stream, dy.ptr, s.spec.dtype, s.y_rows(), s.spec.y.c, s.y_cs, db, accumulate, alpha,
                   workspace.ptr, workspace.bytes);
}

std::size_t ConvOp::algo_cache_size() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  return cache().size();
}

}  // namespace renaissance::cuda
