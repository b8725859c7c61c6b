// Own SGEMM after Goto & van de Geijn (blocking for L1/L2, packed panels, a register-tile micro-kernel),
// plus the OpenBLAS backend. The micro-kernel is written with GCC/Clang vector extensions, so the
// compiler emits FMA code for each ISA without intrinsics; the ISA is picked at run time, so the
// library keeps portable compile flags.
#include <kernels/cpu/gemm.h>

#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#ifdef RENAISSANCE_HAVE_OPENBLAS
#include <cblas.h>  // the types and enums; the functions come from dlopen (kernels/cpu/CMakeLists.txt says why)
#include <dlfcn.h>
#endif

#if defined(__GNUC__)
#define RN_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RN_ALWAYS_INLINE inline
#endif

namespace renaissance::cpu {

namespace {

// Register tile kMR×kNR (6×16 = 12 ymm or 6 zmm accumulators), K block kKC (a 16 KiB B micro-panel
// stays in L1), M block kMC (a 144×256 A block, 144 KiB, stays in L2).
constexpr int kMR = 6;
constexpr int kNR = 16;
constexpr std::int64_t kKC = 256;
constexpr std::int64_t kMC = 144;
// Packed B larger than this is split along K into super-blocks (results unchanged: KC boundaries stay).
constexpr std::int64_t kPackBudgetFloats = std::int64_t{1} << 20;
// Products below this many multiply-adds run on the calling thread (dispatch costs more than it saves).
constexpr std::int64_t kSerialMacs = std::int64_t{1} << 16;

constexpr std::int64_t align_nr(std::int64_t n) { return (n + kNR - 1) / kNR * kNR; }

// K block length for a (super-)block of k rows: k split evenly into ceil(k/kKC) blocks, so k = 288 runs as
// 144 + 144 rather than 256 + 32 (a short block pays the C load/store for little work).
constexpr std::int64_t block_k(std::int64_t k) {
  const std::int64_t blocks = (k + kKC - 1) / kKC;
  return blocks == 0 ? kKC : (k + blocks - 1) / blocks;
}

// ---- packing ------------------------------------------------------------------------------------------

// op(A)[0:mc, 0:kc] (a already offset) into panels of kMR rows: ap[panel][p][i], zero-padded rows.
void pack_a(bool trans_a, const float* a, std::int64_t lda, std::int64_t mc, std::int64_t kc, float* ap) {
  for (std::int64_t i0 = 0; i0 < mc; i0 += kMR) {
    const int mr = static_cast<int>(std::min<std::int64_t>(kMR, mc - i0));
    float* dst = ap + i0 * kc;
    if (!trans_a) {
      const float* rows[kMR];
      for (int i = 0; i < kMR; ++i) rows[i] = a + (i0 + std::min(i, mr - 1)) * lda;
      for (std::int64_t p = 0; p < kc; ++p)
        for (int i = 0; i < kMR; ++i) dst[p * kMR + i] = i < mr ? rows[i][p] : 0.0f;
    } else {
      for (std::int64_t p = 0; p < kc; ++p) {
        const float* src = a + p * lda + i0;
        for (int i = 0; i < kMR; ++i) dst[p * kMR + i] = i < mr ? src[i] : 0.0f;
      }
    }
  }
}

// One kNR-column panel of op(B)[0:kc, j0:j0+16] (b already offset to row 0), zero-padded columns.
void pack_b_panel(bool trans_b, const float* b, std::int64_t ldb, std::int64_t kc, std::int64_t j0, std::int64_t n,
                  float* dst) {
  const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n - j0));
  if (!trans_b) {
    for (std::int64_t p = 0; p < kc; ++p) {
      const float* src = b + p * ldb + j0;
      for (int j = 0; j < kNR; ++j) dst[p * kNR + j] = j < nr ? src[j] : 0.0f;
    }
  } else {
    for (int j = 0; j < kNR; ++j) {
      if (j < nr) {
        const float* src = b + (j0 + j) * ldb;
        for (std::int64_t p = 0; p < kc; ++p) dst[p * kNR + j] = src[p];
      } else {
        for (std::int64_t p = 0; p < kc; ++p) dst[p * kNR + j] = 0.0f;
      }
    }
  }
}

// Packs op(B) (k×n) into `dst` (k × align(n) floats): K blocks of block_k(k) rows; within a block starting
// at row p0, panel jp lives at p0·n_pad + jp·kc·kNR.
void pack_b(bool trans_b, const float* b, std::int64_t ldb, std::int64_t k, std::int64_t n, float* dst,
            bool parallel) {
  const std::int64_t panels = align_nr(n) / kNR;
  const std::int64_t kb = block_k(k);
  const std::int64_t kblocks = (k + kb - 1) / kb;
  auto body = [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t pb = t / panels, jp = t % panels;
      const std::int64_t p0 = pb * kb, kc = std::min(kb, k - p0);
      const float* src = trans_b ? b + p0 : b + p0 * ldb;
      pack_b_panel(trans_b, src, ldb, kc, jp * kNR, n, dst + p0 * align_nr(n) + jp * kc * kNR);
    }
  };
  if (parallel) {
    parallel_for(0, kblocks * panels, 8, body);
  } else {
    body(0, kblocks * panels);
  }
}

// ---- micro- and macro-kernel ----------------------------------------------------------------------------

#if defined(__GNUC__)
typedef float v16sf __attribute__((vector_size(64)));
typedef float v8sf __attribute__((vector_size(32)));
#endif

// Where a macro-kernel reads op(A) for one (M block, K block). direct != nullptr: full kMR-row panels are
// read in place (a(i,p) = direct[i·lda + p], or direct[p·lda + i] when trans) and only a partial last
// panel is packed (at `packed`); direct == nullptr: every panel is packed (panel at packed + i0·kc).
struct AView {
  const float* direct;
  std::int64_t lda;
  bool trans;
  const float* packed;
};
// Where it reads op(B). packed != nullptr: panel jp at packed + jp·kc·kNR. Otherwise full panels are read
// in place (row p of panel jp at direct + p·ldb + jp·kNR; B not transposed) and a partial last panel is
// packed at `edge`.
struct BView {
  const float* packed;
  const float* direct;
  std::int64_t ldb;
  const float* edge;
};

enum AMode { kAPacked, kARows, kACols };
enum BMode { kBPacked, kBRows };

// C[0:mr, 0:nr] = alpha·A·B + beta·C (beta == 0: C not read) for one kMR×kNR tile and one K block. V is
// the accumulator vector type. Each element's sum over p runs in order in one lane whatever the operand
// layout, so the result depends only on the K blocking (a function of k alone).
template <class V, int kA, int kB>
RN_ALWAYS_INLINE void micro_kernel(std::int64_t kc, const float* __restrict a, std::int64_t lda,
                                   const float* __restrict b, std::int64_t ldb, float* c, std::int64_t ldc,
                                   float alpha, float beta, int mr, int nr) {
  constexpr int kW = static_cast<int>(sizeof(V) / sizeof(float));
  constexpr int kNV = kNR / kW;
  V acc[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = V{};
  const float* rows[kMR];
  for (int i = 0; i < kMR; ++i) rows[i] = a + i * lda;
  for (std::int64_t p = 0; p < kc; ++p) {
    V bv[kNV];
    const float* bp = kB == kBPacked ? b + p * kNR : b + p * ldb;
    for (int v = 0; v < kNV; ++v) std::memcpy(&bv[v], bp + v * kW, sizeof(V));
    for (int i = 0; i < kMR; ++i) {
      const float av = kA == kAPacked ? a[p * kMR + i] : kA == kARows ? rows[i][p] : a[p * lda + i];
      for (int v = 0; v < kNV; ++v) acc[i][v] += av * bv[v];
    }
  }
  // Edge tiles go through a full-size buffer so their arithmetic is the same vector code: an element's
  // bits must not depend on where tile edges fall (they move with the row blocking).
  float tile[kMR * kNR];
  const bool edge = mr < kMR || nr < kNR;
  float* cc = c;
  std::int64_t ldcc = ldc;
  if (edge) {
    if (beta != 0.0f)
      for (int i = 0; i < mr; ++i) std::memcpy(tile + i * kNR, c + i * ldc, sizeof(float) * nr);
    cc = tile;
    ldcc = kNR;
  }
  for (int i = 0; i < kMR; ++i) {
    for (int v = 0; v < kNV; ++v) {
      V r = alpha * acc[i][v];
      if (beta != 0.0f) {
        V cv;
        std::memcpy(&cv, cc + i * ldcc + v * kW, sizeof(V));
        r = beta * cv + r;
      }
      std::memcpy(cc + i * ldcc + v * kW, &r, sizeof(V));
    }
  }
  if (edge)
    for (int i = 0; i < mr; ++i) std::memcpy(c + i * ldc, tile + i * kNR, sizeof(float) * nr);
}

template <class V, int kB>
RN_ALWAYS_INLINE void micro_dispatch_a(std::int64_t kc, const AView& av, std::int64_t i0, bool full_rows,
                                       const float* b, std::int64_t ldb, float* c, std::int64_t ldc, float alpha,
                                       float beta, int mr, int nr) {
  if (av.direct && full_rows) {
    if (av.trans) {
      micro_kernel<V, kACols, kB>(kc, av.direct + i0, av.lda, b, ldb, c, ldc, alpha, beta, mr, nr);
    } else {
      micro_kernel<V, kARows, kB>(kc, av.direct + i0 * av.lda, av.lda, b, ldb, c, ldc, alpha, beta, mr, nr);
    }
  } else {
    const float* ap = av.direct ? av.packed : av.packed + i0 * kc;
    micro_kernel<V, kAPacked, kB>(kc, ap, 0, b, ldb, c, ldc, alpha, beta, mr, nr);
  }
}

// All micro-tiles of an mc×(panels·kNR) block of C for one K block: the B micro-panel stays in L1 across
// the row panels, the A block in L2.
template <class V>
RN_ALWAYS_INLINE void macro_kernel_impl(std::int64_t mc, std::int64_t kc, const AView& av, const BView& bv,
                                        std::int64_t panels, std::int64_t n_valid, float alpha, float beta,
                                        float* c, std::int64_t ldc) {
  for (std::int64_t jp = 0; jp < panels; ++jp) {
    const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n_valid - jp * kNR));
    for (std::int64_t i0 = 0; i0 < mc; i0 += kMR) {
      const int mr = static_cast<int>(std::min<std::int64_t>(kMR, mc - i0));
      float* ct = c + i0 * ldc + jp * kNR;
      if (bv.packed) {
        micro_dispatch_a<V, kBPacked>(kc, av, i0, mr == kMR, bv.packed + jp * kc * kNR, 0, ct, ldc, alpha, beta, mr,
                                      nr);
      } else if (nr < kNR) {
        micro_dispatch_a<V, kBPacked>(kc, av, i0, mr == kMR, bv.edge, 0, ct, ldc, alpha, beta, mr, nr);
      } else {
        micro_dispatch_a<V, kBRows>(kc, av, i0, mr == kMR, bv.direct + jp * kNR, bv.ldb, ct, ldc, alpha, beta, mr,
                                    nr);
      }
    }
  }
}

using MacroKernel = void (*)(std::int64_t, std::int64_t, const AView&, const BView&, std::int64_t, std::int64_t,
                             float, float, float*, std::int64_t);

#define RN_MACRO_ARGS                                                                                       \
  std::int64_t mc, std::int64_t kc, const AView &av, const BView &bv, std::int64_t panels, std::int64_t n_valid, \
      float alpha, float beta, float *c, std::int64_t ldc
#define RN_MACRO_PASS mc, kc, av, bv, panels, n_valid, alpha, beta, c, ldc

#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void macro_avx512(RN_MACRO_ARGS) {
  macro_kernel_impl<v16sf>(RN_MACRO_PASS);
}
__attribute__((target("avx2,fma"))) void macro_avx2(RN_MACRO_ARGS) { macro_kernel_impl<v8sf>(RN_MACRO_PASS); }
#endif
#if defined(__GNUC__)
void macro_generic(RN_MACRO_ARGS) { macro_kernel_impl<v8sf>(RN_MACRO_PASS); }
#else
void macro_generic(RN_MACRO_ARGS) { macro_kernel_impl<float>(RN_MACRO_PASS); }
#endif

struct IsaChoice {
  MacroKernel kernel;
  const char* name;
};

bool cpu_supports(const std::string& isa) {
#if defined(__GNUC__) && defined(__x86_64__)
  __builtin_cpu_init();
  if (isa == "avx512") return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == "generic";
}

IsaChoice isa_by_name(const std::string& isa) {
#if defined(__GNUC__) && defined(__x86_64__)
  if (isa == "avx512") return {macro_avx512, "avx512"};
  if (isa == "avx2") return {macro_avx2, "avx2"};
#endif
  return {macro_generic, "generic"};
}

std::atomic<const IsaChoice*>& isa_slot() {
  static std::atomic<const IsaChoice*> slot{nullptr};
  return slot;
}

const IsaChoice& current_isa() {
  const IsaChoice* choice = isa_slot().load(std::memory_order_acquire);
  if (choice) return *choice;
  static const IsaChoice best = [] {
    if (const char* env = std::getenv("RENAISSANCE_GEMM_ISA"); env && cpu_supports(env)) return isa_by_name(env);
    for (const char* isa : {"avx512", "avx2"})
      if (cpu_supports(isa)) return isa_by_name(isa);
    return isa_by_name("generic");
  }();
  isa_slot().store(&best, std::memory_order_release);
  return best;
}

// op(B) for own_gemm_rows: packed (whole K extent of this call, panel layout of pack_b), or read in place
// (B not transposed) when packing would cost more than it saves.
struct BSource {
  const float* packed;
  const float* raw;
  std::int64_t ldb;
};

// Packing an operand pays when its tiles are reused many times from cache; below these reuse counts
// the operand is read in place (pure layout choice: results are the same bits either way).
constexpr std::int64_t kDirectAMaxPanels = 4;   // A reused by <= 4 column panels (n <= 64)
constexpr std::int64_t kDirectBMaxRows = 96;    // B reused by <= 16 row panels

// Rows [0, m) and columns [col_begin, col_end) of C (col_begin panel-aligned): ic outer so the C block
// stays in cache across K blocks; the first K block applies beta, later ones add.
void own_gemm_rows(bool trans_a, std::int64_t m, std::int64_t k, std::int64_t n, std::int64_t col_begin,
                   std::int64_t col_end, float alpha, const float* a, std::int64_t lda, const BSource& b,
                   float beta, float* c, std::int64_t ldc) {
  const MacroKernel macro = current_isa().kernel;
  float* ap = detail::scratch(detail::ScratchSlot::PackA, kMC * kKC);
  float* edge = b.packed ? nullptr : detail::scratch(detail::ScratchSlot::PackEdge, kKC * kNR);
  const std::int64_t n_pad = align_nr(n);
  const std::int64_t panel_begin = col_begin / kNR, panel_end = align_nr(col_end) / kNR;
  const std::int64_t panels = panel_end - panel_begin, n_valid = col_end - col_begin;
  const std::int64_t kb = block_k(k);
  const bool direct_a = panels <= kDirectAMaxPanels;
  for (std::int64_t i0 = 0; i0 < m; i0 += kMC) {
    const std::int64_t mc = std::min(kMC, m - i0);
    for (std::int64_t p0 = 0; p0 < k; p0 += kb) {
      const std::int64_t kc = std::min(kb, k - p0);
      const float* a_blk = trans_a ? a + p0 * lda + i0 : a + i0 * lda + p0;
      AView av{nullptr, lda, trans_a, ap};
      if (direct_a) {
        av.direct = a_blk;
        const std::int64_t full = mc / kMR * kMR;
        if (full < mc) pack_a(trans_a, trans_a ? a_blk + full : a_blk + full * lda, lda, mc - full, kc, ap);
      } else {
        pack_a(trans_a, a_blk, lda, mc, kc, ap);
      }
      BView bv{nullptr, nullptr, b.ldb, edge};
      if (b.packed) {
        bv.packed = b.packed + p0 * n_pad + panel_begin * kc * kNR;
      } else {
        bv.direct = b.raw + p0 * b.ldb + col_begin;
        if (n_valid % kNR != 0)
          pack_b_panel(false, b.raw + p0 * b.ldb, b.ldb, kc, col_begin + (panels - 1) * kNR, col_end, edge);
      }
      macro(mc, kc, av, bv, panels, n_valid, alpha, p0 == 0 ? beta : 1.0f, c + i0 * ldc + panel_begin * kNR, ldc);
    }
  }
}

// K rows per packed super-block of B: a multiple of kKC, so K-block boundaries are those of one block.
std::int64_t super_block_k(std::int64_t k, std::int64_t n) {
  const std::int64_t ks = std::max<std::int64_t>(1, kPackBudgetFloats / align_nr(n) / kKC) * kKC;
  return std::min(k, ks);
}

void scale_c(std::int64_t m, std::int64_t n, float beta, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

void check_args(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                std::int64_t ldb, std::int64_t ldc) {
  RN_CHECK(m >= 0 && n >= 0 && k >= 0, "sgemm: negative size m={} n={} k={}", m, n, k);
  RN_CHECK(lda >= std::max<std::int64_t>(1, trans_a ? m : k), "sgemm: lda={} too small (trans_a={}, m={}, k={})",
           lda, trans_a, m, k);
  RN_CHECK(ldb >= std::max<std::int64_t>(1, trans_b ? k : n), "sgemm: ldb={} too small (trans_b={}, k={}, n={})",
           ldb, trans_b, k, n);
  RN_CHECK(ldc >= std::max<std::int64_t>(1, n), "sgemm: ldc={} smaller than n={}", ldc, n);
}

#ifdef RENAISSANCE_HAVE_OPENBLAS
/// OpenBLAS, loaded on first use: the library found at configure time, else its usual soname.
struct OpenBlasApi {
  decltype(&cblas_sgemm) sgemm = nullptr;
  std::string error;  ///< why it could not be loaded
};

const OpenBlasApi& openblas_api() {
  static const OpenBlasApi api = [] {
    OpenBlasApi a;
    // We parallelise around OpenBLAS (fixed tiles, our pool), so it must not start its own threads: its constructor
    // reads OPENBLAS_NUM_THREADS (unless the user set it) and starts that many less one.
    setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {RENAISSANCE_OPENBLAS_LIBRARY, "libopenblas.so.0"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
      const char* why = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
    }
    if (!lib) {
      a.error = "could not load OpenBLAS: " + tried;
      return a;
    }
    auto set_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(lib, "openblas_set_num_threads"));
    a.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
    if (!a.sgemm || !set_threads) {
      a.error = "the OpenBLAS library loaded has no cblas_sgemm or openblas_set_num_threads";
      a.sgemm = nullptr;
      return a;
    }
    set_threads(1);
    return a;
  }();
  return api;
}

/// Loads OpenBLAS, or throws Error saying why it cannot be used.
void require_openblas() {
  const OpenBlasApi& api = openblas_api();
  RN_CHECK(api.sgemm != nullptr, "GEMM backend 'openblas': {}", api.error);
}

void openblas_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc) {
  openblas_api().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                       static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                       static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
#endif

GemmBackend default_backend() {
  if (const char* env = std::getenv("RENAISSANCE_GEMM")) {
    const std::string v = env;
    if (v == "own") return GemmBackend::Own;
    if (v == "openblas" && openblas_available()) {
#ifdef RENAISSANCE_HAVE_OPENBLAS
      require_openblas();  // loaded here, on the thread that picks the backend, not inside a pool task
#endif
      return GemmBackend::OpenBlas;
    }
  }
  // Measured on the 2-core EPYC (Zen 4): the own kernel matches or beats single-threaded OpenBLAS 0.3.21
  // on the convolution shapes we train (docs/kernels-cpu.md).
  return GemmBackend::Own;
}

std::atomic<int>& backend_slot() {
  static std::atomic<int> slot{static_cast<int>(default_backend())};
  return slot;
}

// The fixed tiling of a parallel product: row blocks × column groups (multiples of kNR), chosen from
// the shape only so that OpenBLAS tiles (whose edge handling may round differently) never move with
// the thread count.
struct Tiling {
  std::int64_t row_block, col_block, row_tiles, col_tiles;
};

Tiling make_tiling(std::int64_t m, std::int64_t n, std::int64_t row_block) {
  constexpr std::int64_t kWantTiles = 16;
  Tiling t{};
  t.row_block = row_block;
  t.row_tiles = (m + row_block - 1) / row_block;
  const std::int64_t panels = align_nr(n) / kNR;
  const std::int64_t groups = std::clamp<std::int64_t>((kWantTiles + t.row_tiles - 1) / t.row_tiles, 1, panels);
  t.col_block = (panels + groups - 1) / groups * kNR;
  t.col_tiles = (n + t.col_block - 1) / t.col_block;
  return t;
}

}  // namespace

bool openblas_available() {
#ifdef RENAISSANCE_HAVE_OPENBLAS
  return true;
#else
  return false;
#endif
}

GemmBackend gemm_backend() { return static_cast<GemmBackend>(backend_slot().load(std::memory_order_relaxed)); }

void set_gemm_backend(GemmBackend backend) {
  RN_CHECK(backend != GemmBackend::OpenBlas || openblas_available(),
           "GEMM backend 'openblas' asked for, but this build has no OpenBLAS (install libopenblas-dev and "
           "reconfigure)");
#ifdef RENAISSANCE_HAVE_OPENBLAS
  if (backend == GemmBackend::OpenBlas) require_openblas();
#endif
  backend_slot().store(static_cast<int>(backend), std::memory_order_relaxed);
}

const char* gemm_backend_name(GemmBackend backend) { return backend == GemmBackend::Own ? "own" : "openblas"; }

const char* gemm_isa() { return current_isa().name; }

namespace detail {
// Test and benchmark hook: force a micro-kernel ("avx512", "avx2", "generic"); false when the CPU lacks it.
bool set_gemm_isa(const char* isa) {
  if (!cpu_supports(isa)) return false;
  static IsaChoice choices[3] = {isa_by_name("avx512"), isa_by_name("avx2"), isa_by_name("generic")};
  for (auto& ch : choices)
    if (std::string(ch.name) == isa) isa_slot().store(&ch, std::memory_order_release);
  return true;
}
}  // namespace detail

PackedB::PackedB(bool trans_b, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb)
    : m_backend(gemm_backend()), m_trans_b(trans_b), m_k(k), m_n(n), m_ldb(ldb), m_b(b) {
  RN_CHECK(k >= 0 && n >= 0, "PackedB: negative size k={} n={}", k, n);
  RN_CHECK(ldb >= std::max<std::int64_t>(1, trans_b ? k : n), "PackedB: ldb={} too small (trans_b={}, k={}, n={})",
           ldb, trans_b, k, n);
  if (m_backend == GemmBackend::Own && k > 0 && n > 0) {
    pack_b(trans_b, b, ldb, k, n, m_packed.get(static_cast<std::size_t>(k * align_nr(n))), true);
  }
}

void sgemm_packed_columns(bool trans_a, std::int64_t m, std::int64_t col_begin, std::int64_t col_end, float alpha,
                          const float* a, std::int64_t lda, const PackedB& b, float beta, float* c,
                          std::int64_t ldc) {
  RN_CHECK(col_begin % kNR == 0 && col_begin >= 0 && col_end <= b.m_n,
           "sgemm_packed_columns: columns [{}, {}) not panel-aligned within n={}", col_begin, col_end, b.m_n);
  if (m <= 0 || col_end <= col_begin) return;
  if (b.m_k == 0) {
    scale_c(m, col_end - col_begin, beta, c + col_begin, ldc);
    return;
  }
#ifdef RENAISSANCE_HAVE_OPENBLAS
  if (b.m_backend == GemmBackend::OpenBlas) {
    const float* bb = b.m_trans_b ? b.m_b + col_begin * b.m_ldb : b.m_b + col_begin;
    openblas_gemm(trans_a, b.m_trans_b, m, col_end - col_begin, b.m_k, alpha, a, lda, bb, b.m_ldb, beta,
                  c + col_begin, ldc);
    return;
  }
#endif
  own_gemm_rows(trans_a, m, b.m_k, b.m_n, col_begin, col_end, alpha, a, lda, BSource{b.m_packed.data(), nullptr, 0},
                beta, c, ldc);
}

void sgemm_serial_packed(bool trans_a, std::int64_t m, float alpha, const float* a, std::int64_t lda,
                         const PackedB& b, float beta, float* c, std::int64_t ldc) {
  sgemm_packed_columns(trans_a, m, 0, b.m_n, alpha, a, lda, b, beta, c, ldc);
}

void sgemm_serial(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc) {
  check_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
#ifdef RENAISSANCE_HAVE_OPENBLAS
  if (gemm_backend() == GemmBackend::OpenBlas) {
    openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#endif
  if (!trans_b && m <= kDirectBMaxRows) {
    own_gemm_rows(trans_a, m, k, n, 0, n, alpha, a, lda, BSource{nullptr, b, ldb}, beta, c, ldc);
    return;
  }
  const std::int64_t ks = super_block_k(k, n);
  float* packed = detail::scratch(detail::ScratchSlot::PackB, static_cast<std::size_t>(ks * align_nr(n)));
  for (std::int64_t p0 = 0; p0 < k; p0 += ks) {
    const std::int64_t kb = std::min(ks, k - p0);
    pack_b(trans_b, trans_b ? b + p0 : b + p0 * ldb, ldb, kb, n, packed, false);
    own_gemm_rows(trans_a, m, kb, n, 0, n, alpha, trans_a ? a + p0 * lda : a + p0, lda,
                  BSource{packed, nullptr, 0}, p0 == 0 ? beta : 1.0f, c, ldc);
  }
}

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  check_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || m * n * k <= kSerialMacs) {
    sgemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#ifdef RENAISSANCE_HAVE_OPENBLAS
  if (gemm_backend() == GemmBackend::OpenBlas) {
    const Tiling t = make_tiling(m, n, 256);
    parallel_for(0, t.row_tiles * t.col_tiles, 1, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t tile = t0; tile < t1; ++tile) {
        const std::int64_t i0 = tile / t.col_tiles * t.row_block, j0 = tile % t.col_tiles * t.col_block;
        const std::int64_t mt = std::min(t.row_block, m - i0), nt = std::min(t.col_block, n - j0);
        openblas_gemm(trans_a, trans_b, mt, nt, k, alpha, trans_a ? a + i0 : a + i0 * lda, lda,
                      trans_b ? b + j0 * ldb : b + j0, ldb, beta, c + i0 * ldc + j0, ldc);
      }
    });
    return;
  }
#endif
  const Tiling t = make_tiling(m, n, kMC);
  auto run_tiles = [&](const float* ab, std::int64_t kb, const BSource& bs, float beta_here) {
    parallel_for(0, t.row_tiles * t.col_tiles, 1, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t tile = t0; tile < t1; ++tile) {
        const std::int64_t i0 = tile / t.col_tiles * t.row_block, j0 = tile % t.col_tiles * t.col_block;
        const std::int64_t mt = std::min(t.row_block, m - i0), j1 = std::min(j0 + t.col_block, n);
        own_gemm_rows(trans_a, mt, kb, n, j0, j1, alpha, trans_a ? ab + i0 : ab + i0 * lda, lda, bs, beta_here,
                      c + i0 * ldc, ldc);
      }
    });
  };
  if (!trans_b && m <= kDirectBMaxRows) {
    run_tiles(a, k, BSource{nullptr, b, ldb}, beta);
    return;
  }
  // B packed once per K super-block (shared by all tiles), then the tiles of C in parallel.
  const std::int64_t ks = super_block_k(k, n);
  thread_local detail::AlignedBuffer packed_buf;  // the caller's; workers only read it
  float* packed = packed_buf.get(static_cast<std::size_t>(ks * align_nr(n)));
  for (std::int64_t p0 = 0; p0 < k; p0 += ks) {
    const std::int64_t kb = std::min(ks, k - p0);
    pack_b(trans_b, trans_b ? b + p0 : b + p0 * ldb, ldb, kb, n, packed, true);
    run_tiles(trans_a ? a + p0 * lda : a + p0, kb, BSource{packed, nullptr, 0}, p0 == 0 ? beta : 1.0f);
  }
}

}  // namespace renaissance::cpu
