#include <kernels/cuda/fc.h>

#include <kernels/cuda/dnn_bias.h>

#include <algorithm>

namespace renaissance::cuda {

namespace {

constexpr std::size_t kAlign = 256;
constexpr std::uint32_t kMinAlignment = 16;  // bytes the heuristics may assume for A, B, C, D (checked per call)

// Row-major matrices are column-major transposes, so every product is written for cuBLASLt as its transpose:
//   forward   yᵀ [out × N]  = W_cm [in × out]ᵀ · xᵀ [in × N]
//   bwd data  dxᵀ [in × N]  = W_cm [in × out]  · dyᵀ [out × N]
//   bwd wgt   dWᵀ [in × out] = xᵀ [in × N]     · (dyᵀ [out × N])ᵀ
// (X_cm: the row-major buffer read column-major, i.e. Xᵀ.)
enum Slot { kForward = 0, kBackwardData = 1, kBackwardWeights = 2, kForwardBias = 3, kSlots = 4 };

const char* slot_name(int s) {
  switch (s) {
    case kForward: return "forward";
    case kBackwardData: return "backward data";
    case kBackwardWeights: return "backward weights";
    case kForwardBias: return "forward+bias";
  }
  return "?";
}

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols),
                                            ld));
  }
  ~Layout() {
    if (l) CUBLAS_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(l));
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Matmul {
  cublasLtMatmulDesc_t desc = nullptr;
  std::unique_ptr<Layout> a, b, c;  // C and D share one layout
  cublasLtMatmulAlgo_t algo{};
  std::size_t ws = 0;
  bool ready = false;
  bool bias_epilogue = false;
  float waves = 0.0f;

  Matmul() = default;
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  ~Matmul() {
    if (desc) CUBLAS_CHECK_NOTHROW(cublasLtMatmulDescDestroy(desc));
  }

  void init(cublasComputeType_t compute, cublasOperation_t ta, cublasOperation_t tb, bool bias) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_32F;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                  sizeof bias_type));
      bias_epilogue = true;
    }
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() {
    if (p) CUBLAS_CHECK_NOTHROW(cublasLtMatmulPreferenceDestroy(p));
  }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kMinAlignment == 0; }

}  // namespace

struct FcOp::Impl {
  FcSpec spec;
  std::int64_t x_ld = 0, y_ld = 0;
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  Matmul mm[kSlots];
  DnnHandles* handles = nullptr;
  bool chosen = false;

  std::string signature() const {
    return fmt::format("{}x{}->{} ld {}/{} {} tf32={}", spec.batch, spec.in, spec.out, x_ld, y_ld,
                       dtype_name(spec.dtype), spec.allow_tf32);
  }

  std::size_t pass_bytes(FcPass p) const {
    switch (p) {
      case FcPass::Forward: return std::max(mm[kForward].ws, mm[kForwardBias].ready ? mm[kForwardBias].ws : 0);
      case FcPass::BackwardData: return mm[kBackwardData].ws;
      case FcPass::BackwardWeights:
        return std::max(mm[kBackwardWeights].ws, bias_grad_workspace_bytes(spec.batch, spec.out));
    }
    return 0;
  }

  /// x/dx: (batch,1,1,in) with row stride x_ld, or a compact (batch,h,w,c) flattened to in = h·w·c.
  void check_rows(const char* what, const TensorRef& t, std::int64_t width, std::int64_t ld) const {
    RN_CHECK(t.ptr != nullptr && aligned(t.ptr), "fc {}: {} is null or not {}-byte aligned", signature(), what,
             kMinAlignment);
    RN_CHECK(t.dtype == spec.dtype, "fc {}: {} is {}, the op was set up for {}", signature(), what,
             dtype_name(t.dtype), dtype_name(spec.dtype));
    RN_CHECK(t.shape.n == spec.batch, "fc {}: {} has batch {}", signature(), what, t.shape.n);
    const std::int64_t cs = t.c_stride ? t.c_stride : t.shape.c;
    if (t.shape.h * t.shape.w == 1) {
      RN_CHECK(t.shape.c == width && cs == ld, "fc {}: {} is {} with row stride {}, expected {} with {}", signature(),
               what, t.shape.str(), cs, width, ld);
    } else {
      RN_CHECK(t.shape.per_sample() == width && cs == t.shape.c && ld == width,
               "fc {}: {} {} (row stride {}) is not a compact [batch × {}] matrix with row stride {}", signature(),
               what, t.shape.str(), cs, width, ld);
    }
  }

  void check_run(FcPass p, const Workspace& ws) const {
    RN_CHECK(chosen && handles, "fc {}: pass {} before choose()", signature(), static_cast<int>(p));
    const std::size_t need = pass_bytes(p);
    RN_CHECK(ws.bytes >= need && (need == 0 || ws.ptr != nullptr), "fc {}: needs {} bytes of workspace, got {}",
             signature(), need, ws.bytes);
    RN_CHECK(reinterpret_cast<std::uintptr_t>(ws.ptr) % kAlign == 0, "fc {}: workspace not 256-byte aligned",
             signature());
  }

  void run(int slot, cudaStream_t stream, float alpha, const void* a, const void* b, float beta, void* d,
           const Workspace& ws) const {
    const Matmul& op = mm[slot];
    CUBLAS_CHECK(cublasLtMatmul(handles->cublaslt(), op.desc, &alpha, a, op.a->l, b, op.b->l, &beta, d, op.c->l, d,
                                op.c->l, &op.algo, op.ws ? ws.ptr : nullptr, op.ws, stream));
  }
};

FcOp::FcOp(const FcSpec& spec) : m(std::make_unique<Impl>()) {
  Impl& s = *m;
  s.spec = spec;
  RN_CHECK(spec.dtype == DType::F32 || spec.dtype == DType::F16, "fc: dtype {} (F32 or F16 expected)",
           dtype_name(spec.dtype));
  RN_CHECK(spec.batch > 0 && spec.in > 0 && spec.out > 0, "fc: empty size batch={} in={} out={}", spec.batch,
           spec.in, spec.out);
  s.x_ld = spec.x_ld ? spec.x_ld : spec.in;
  s.y_ld = spec.y_ld ? spec.y_ld : spec.out;
  RN_CHECK(s.x_ld >= spec.in && s.y_ld >= spec.out, "fc: row strides x={} y={} smaller than in={} out={}", s.x_ld,
           s.y_ld, spec.in, spec.out);
  s.type = spec.dtype == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  s.compute = spec.dtype == DType::F32 && spec.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const std::int64_t n = spec.batch, in = spec.in, out = spec.out;

  auto layouts = [&](Matmul& mm, std::int64_t ar, std::int64_t ac, std::int64_t ald, std::int64_t br,
                     std::int64_t bc, std::int64_t bld, std::int64_t cr, std::int64_t cc, std::int64_t cld) {
    mm.a = std::make_unique<Layout>(s.type, ar, ac, ald);
    mm.b = std::make_unique<Layout>(s.type, br, bc, bld);
    mm.c = std::make_unique<Layout>(s.type, cr, cc, cld);
  };
  for (int slot : {kForward, kForwardBias}) {
    const bool bias = slot == kForwardBias;
    if (bias && !(spec.fuse_bias && spec.dtype == DType::F32)) continue;
    s.mm[slot].init(s.compute, CUBLAS_OP_T, CUBLAS_OP_N, bias);
    layouts(s.mm[slot], in, out, in, in, n, s.x_ld, out, n, s.y_ld);
  }
  s.mm[kBackwardData].init(s.compute, CUBLAS_OP_N, CUBLAS_OP_N, false);
  layouts(s.mm[kBackwardData], in, out, in, out, n, s.y_ld, in, n, s.x_ld);
  s.mm[kBackwardWeights].init(s.compute, CUBLAS_OP_N, CUBLAS_OP_T, false);
  layouts(s.mm[kBackwardWeights], in, n, s.x_ld, out, n, s.y_ld, in, out, in);
}

FcOp::~FcOp() = default;
FcOp::FcOp(FcOp&&) noexcept = default;
FcOp& FcOp::operator=(FcOp&&) noexcept = default;

const FcSpec& FcOp::spec() const { return m->spec; }

void FcOp::choose(DnnHandles& handles, std::size_t workspace_limit, bool deterministic) {
  Impl& s = *m;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  RN_CHECK(device == handles.device(), "fc {}: handles of device {} used on device {}", s.signature(),
           handles.device(), device);
  Preference pref;
  const std::uint64_t limit = workspace_limit;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit,
                                                    sizeof limit));
  for (cublasLtMatmulPreferenceAttributes_t a :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, a, &kMinAlignment, sizeof kMinAlignment));
  if (deterministic) {
    // Split-K only with a separate reduction step (fixed order); no in-place reduction through counters.
    const std::uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                                      sizeof mask));
  }
  for (int slot = 0; slot < kSlots; ++slot) {
    Matmul& mm = s.mm[slot];
    mm.ready = false;
    if (!mm.desc) continue;
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handles.cublaslt(), mm.desc, mm.a->l, mm.b->l, mm.c->l,
                                                             mm.c->l, pref.p, 8, results, &returned);
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < returned; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > workspace_limit) continue;
      mm.algo = results[i].algo;
      mm.ws = results[i].workspaceSize;
      mm.waves = results[i].wavesCount;
      mm.ready = true;
      break;
    }
    // The fused bias is an optimisation: without an algorithm for it, forward adds the bias with its own kernel.
    if (slot == kForwardBias) continue;
    RN_CHECK(mm.ready, "fc {}: no cuBLASLt algorithm for the {} product within {} bytes of workspace ({}: {})",
             s.signature(), slot_name(slot), workspace_limit, cublasLtGetStatusName(st), returned);
  }
  s.handles = &handles;
  s.chosen = true;
}

bool FcOp::chosen() const { return m->chosen; }

std::size_t FcOp::workspace_bytes(FcPass pass) const {
  RN_CHECK(m->chosen, "fc {}: workspace_bytes() before choose()", m->signature());
  return m->pass_bytes(pass);
}

std::size_t FcOp::workspace_bytes() const {
  return std::max({workspace_bytes(FcPass::Forward), workspace_bytes(FcPass::BackwardData),
                   workspace_bytes(FcPass::BackwardWeights)});
}

std::string FcOp::describe(FcPass pass) const {
  if (!m->chosen) return "not chosen";
  const int slot = pass == FcPass::Forward && m->mm[kForwardBias].ready ? kForwardBias : static_cast<int>(pass);
  const Matmul& mm = m->mm[slot];
  return fmt::format("{}: cuBLASLt heuristic #1, {} B workspace, {:.2f} waves{}", slot_name(slot), mm.ws, mm.waves,
                     pass == FcPass::Forward && slot != kForwardBias ? ", bias by own kernel" : "");
}

void FcOp::forward(cudaStream_t stream, const TensorRef& x, const void* w, const float* bias, const TensorRef& y,
                   Workspace workspace, float alpha) const {
  Impl& s = *m;
  s.check_run(FcPass::Forward, workspace);
  s.check_rows("x", x, s.spec.in, s.x_ld);
  s.check_rows("y", y, s.spec.out, s.y_ld);
  RN_CHECK(w != nullptr && aligned(w), "fc {}: weights null or not {}-byte aligned", s.signature(), kMinAlignment);
  const bool fused = bias != nullptr && s.mm[kForwardBias].ready;
  if (fused)  // host-side descriptor update: capture-safe, read when the call below is recorded
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.mm[kForwardBias].desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
  s.run(fused ? kForwardBias : kForward, stream, alpha, w, x.ptr, 0.0f, y.ptr, workspace);
  if (bias && !fused) add_bias_rows(stream, y.ptr, s.spec.dtype, s.spec.batch, s.spec.out, s.y_ld, bias);
}

void FcOp::backward_data(cudaStream_t stream, const TensorRef& dy, const void* w, const TensorRef& dx,
                         bool accumulate, Workspace workspace, float alpha) const {
  const Impl& s = *m;
  s.check_run(FcPass::BackwardData, workspace);
  s.check_rows("dy", dy, s.spec.out, s.y_ld);
  s.check_rows("dx", dx, s.spec.in, s.x_ld);
  RN_CHECK(w != nullptr && aligned(w), "fc {}: weights null or not {}-byte aligned", s.signature(), kMinAlignment);
  s.run(kBackwardData, stream, alpha, w, dy.ptr, accumulate ? 1.0f : 0.0f, dx.ptr, workspace);
}

void FcOp::backward_weights(cudaStream_t stream, const TensorRef& x, const TensorRef& dy, void* dw, float* db,
                            bool accumulate, Workspace workspace, float alpha) const {
  const Impl& s = *m;
  s.check_run(FcPass::BackwardWeights, workspace);
  s.check_rows("x", x, s.spec.in, s.x_ld);
  s.check_rows("dy", dy, s.spec.out, s.y_ld);
  RN_CHECK(dw != nullptr && aligned(dw), "fc {}: weight gradient null or not {}-byte aligned", s.signature(),
           kMinAlignment);
  s.run(kBackwardWeights, stream, alpha, x.ptr, dy.ptr, accumulate ? 1.0f : 0.0f, dw, workspace);
  // Same stream: the matmul's workspace is free again for the reduction's partial sums.
  if (db)
    bias_grad_rows(stream, dy.ptr, s.spec.dtype, s.spec.batch, s.spec.out, s.y_ld, db, accumulate, alpha,
                   workspace.ptr, workspace.bytes);
}

}  // namespace renaissance::cuda
