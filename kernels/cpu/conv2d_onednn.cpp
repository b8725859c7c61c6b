// Convolution passes through oneDNN's training primitives (Conv2dPlan with Conv2dAlgo::Onednn).
//
// Memory formats are chosen once, when the plan is made (OnednnLayout reports them): x, y, dx and dy are the
// runtime's NHWC tensors as they are (oneDNN's NHWC kernels; nChw16c, the same bytes, for 16 channels), except with
// Winograd (set_conv2d_winograd, on by default), whose kernels take only nChw16c: other channel counts are then
// reordered per batch piece through the running thread's scratch (in cache: ~32 samples a piece); the weights stay
// OHWI in the arena (the optimizer, checkpoints and the GPU read them so) and each call runs one reorder of them —
// once per call, before the batch pieces, never per piece — into the blocked format the primitive asked for ("any" at
// creation), or, for the weight gradient, back from it (with a sum post-op when accumulating). That reorder is kept on
// purpose, by measurement (docs/kernels-cpu.md, "Weight formats"; BM_OnednnWeightFormat): oneDNN 2.6 runs OHWI
// weights only in its `ref` loops and HWIO ones only through im2col + GEMM (1.5-6x slower than its blocked kernels),
// and no blocked format serves its forward, dx and dW kernels alike (dx takes only OIhw16o16i; the forward and dW
// share OIhw16i16o at best, where the forward loses 10-16% on the largest narrow ResNet-18 layers against its own
// brgconv format), while the reorders cost 0.06% (fmnist_cnn) and 0.2% (narrow ResNet-18) of a step's CPU time.
// Re-measure when oneDNN changes. Primitives, the reorder and scratch sizes are made in the constructor; a call wraps
// pointers in memory objects and executes.
//
// Threads: each primitive is created and run with oneDNN limited to the calling thread, on batch pieces whose size
// depends only on the shape (Winograd's forward and dx pieces also on the thread count, which changes none of their
// bits: each output tile's arithmetic is the same in any piece); the thread pool hands the pieces out, and the weight
// gradient adds the pieces' partial sums in piece order. Results are therefore the same for any thread count
// (oneDNN's own threading splits reductions by thread count) and the pool balances the pieces dynamically. oneDNN's
// OpenMP runtime (Debian's and Spack's builds) takes its thread count from the calling thread's omp_get_max_threads();
// it is set to 1 around every oneDNN call, through the OpenMP runtime oneDNN itself loaded (looked up with dlsym: no
// link-time OpenMP dependency, never a second runtime).
#include <kernels/cpu/conv2d_onednn.h>

#include <renaissance/core/error.h>

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef RENAISSANCE_HAVE_ONEDNN
#include <kernels/cpu/scratch.h>
#include <kernels/cpu/thread_pool.h>
#include <kernels/cpu/vectorize.h>

#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace renaissance::cpu {

namespace {
std::atomic<bool>& winograd_setting() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("RENAISSANCE_CPU_WINOGRAD");
    return !(v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0));
  }()};
  return on;
}
}  // namespace

void set_conv2d_winograd(bool on) { winograd_setting().store(on); }
bool conv2d_winograd() { return winograd_setting().load(); }

#ifdef RENAISSANCE_HAVE_ONEDNN

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

#if DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_OMP && DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_SEQ
#error \
    "Renaissance runs oneDNN single-threaded per batch piece: it needs oneDNN's OMP or SEQ CPU runtime (CMake checks)"
#endif

// ---- oneDNN limited to the calling thread ---------------------------------------------------------------------

struct OmpApi {
  int (*get_max_threads)() = nullptr;
  void (*set_num_threads)(int) = nullptr;
};

const OmpApi& omp_api() {
  static const OmpApi api = [] {
    OmpApi a;
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    // oneDNN's dependency: already in the process, found in the global scope.
    a.get_max_threads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    a.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    RN_CHECK(a.get_max_threads && a.set_num_threads,
             "oneDNN was built with OpenMP but omp_set_num_threads is not in the process (dlsym: {})",
             dlerror() ? dlerror() : "no error text");
#endif
    return a;
  }();
  return api;
}

/// Sets this thread's OpenMP thread count to 1 for its lifetime (oneDNN's parallel sections then run inline).
class OnThisThreadOnly {
 public:
  OnThisThreadOnly() {
    const OmpApi& a = omp_api();
    if (a.get_max_threads && (m_prev = a.get_max_threads()) != 1) a.set_num_threads(1);
  }
  ~OnThisThreadOnly() {
    if (m_prev != 1) omp_api().set_num_threads(m_prev);
  }
  OnThisThreadOnly(const OnThisThreadOnly&) = delete;
  OnThisThreadOnly& operator=(const OnThisThreadOnly&) = delete;

 private:
  int m_prev = 1;
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

std::string dnnl_message(const dnnl::error& e) {
  return fmt::format("{} (status {})", e.what(), static_cast<int>(e.status));
}

// ---- batch pieces ------------------------------------------------------------------------------------------------

/// [0, n) in pieces of `size` samples (the last one `tail` ≤ size); a function of n and the target count only.
struct Pieces {
  std::int64_t size = 0, count = 0, tail = 0;
  Pieces() = default;
  Pieces(std::int64_t n, std::int64_t target) {
    size = (n + target - 1) / target;
    count = (n + size - 1) / size;
    tail = n - (count - 1) * size;
  }
  std::int64_t begin(std::int64_t i) const { return i * size; }
  std::int64_t samples(std::int64_t i) const { return i + 1 == count ? tail : size; }
};

// Forward and dx: samples are independent, so pieces only balance the threads: up to 32 (enough for 16+ threads and
// a short last claim), each of at least 256 output positions (small images run slower in small pieces: 4×4×128
// measured 190 GFLOP/s a core at 4 samples, 200 at 8, 217 at 32; at 28×28 it is flat from 1 to 32 samples).
constexpr std::int64_t kSamplePieces = 32;
constexpr std::int64_t kMinPositionsPerPiece = 256;
// Weight gradient: every piece writes its own partial dW, added in piece order afterwards. The partials cost one
// write and one read of |dW| per piece, so layers with few FLOPs per weight (small images: 4×4×128 does 4,096 per
// weight at batch 128) get fewer pieces: one per 512 FLOPs per weight, 2 to 16, and at most 64 MiB of partials.
constexpr std::int64_t kWgradPieces = 16;
constexpr std::int64_t kWgradFlopsPerWeightPerPiece = 512;
constexpr std::int64_t kWgradPartialBytes = 64ll << 20;
// Winograd F(4x4, 3x3) (oneDNN's jit_wino_4x3, AVX-512 only) for 3×3 stride-1 pad-1 layers of 16k channels on both
// sides: a quarter of the multiplications, error still ~1e-6 of the output's magnitude (docs/kernels-cpu.md,
// "Winograd"). It runs on nChw16c activations: the same bytes as NHWC for 16 channels, otherwise reordered per piece
// in this thread's scratch. It needs pieces of about 32 samples to pay (one core, 28×28×16→16 forward: 0.47 ms per
// 16 samples, 0.73 per 32; the direct kernel 0.51 and 1.02), and loses on 4×4 maps in the forward and dx (0.35 vs
// 0.23 ms per 8 samples of 4×4×128), where it is kept for the weight gradient only.
constexpr std::int64_t kWinoPiece = 32;
constexpr std::int64_t kWinoMinPositions = 49;  // forward and dx: maps of at least 7×7

bool winograd_eligible(const Shape& xs, const Shape& ys, const Conv2dParams& p, Conv2dPass pass) {
  return conv2d_winograd() && conv2d_winograd_available() && p.kernel_h == 3 && p.kernel_w == 3 && p.stride_h == 1 &&
         p.stride_w == 1 && p.pad_h == 1 && p.pad_w == 1 && p.groups == 1 && xs.c % 16 == 0 && ys.c % 16 == 0 &&
         xs.h == ys.h && xs.w == ys.w && (pass == Conv2dPass::BackwardFilter || ys.h * ys.w >= kWinoMinPositions);
}

}  // namespace

/// One activation tensor (x/dx or y/dy) of a piece as the primitive meets it: NHWC as in the arena, or nChw16c for
/// Winograd, which for other than 16 channels is reordered per piece through this thread's scratch.
struct ActSide {
  bool reorder = false;
  memory::desc user, prim;  // NHWC; the primitive's
  dnnl::reorder to_prim, from_prim, from_prim_acc;  // from_prim_acc: user += (sum post-op)
  std::size_t floats = 0;   // of `prim`
};

// One primitive per piece size (the common one and, when it differs, the last piece's).
struct ConvPrim {
  std::int64_t mb = 0;
  dnnl::primitive prim;
  memory::desc act_in, act_out;  // the pass's input/output for mb samples as the primitive takes them
  std::size_t scratch_bytes = 0;
  ActSide x, y;  // x/dx and y/dy
};

struct Conv2dPlan::Onednn::Impl {
  Conv2dPass pass;
  Shape xs, ys;
  bool bias = false;
  bool blocked16 = false;  ///< 16 channels in and out: the activations described as nChw16c (the same bytes)
  bool wino = false;       ///< Winograd (nChw16c activations; reordered per piece where the channels are not 16)
  Pieces pieces;
  ConvPrim full, tail;  // tail.mb == 0: every piece has the common size
  memory::desc w_user, w_prim, b_md;
  dnnl::reorder w_reorder, w_reorder_accumulate;  // fwd/dx: user → prim; dW: prim → user (= and +=)
  std::size_t w_reorder_scratch = 0;
  std::int64_t w_prim_floats = 0;
  std::string impl;
  OnednnLayout layout;
  mutable std::atomic<std::int64_t> reorders{0};

  const ConvPrim& prim_of(std::int64_t piece) const {
    return tail.mb != 0 && pieces.samples(piece) == tail.mb ? tail : full;
  }
};

namespace {

using Impl = Conv2dPlan::Onednn::Impl;

/// oneDNN writes its JIT kernels into code buffers that Xbyak maps without checking the result (the library is built
/// with XBYAK_NO_EXCEPTION): under an address-space limit (ulimit -v, a job's limit) just too low for them,
/// dnnl_primitive_create wrote through a null buffer, SIGSEGV (exit 139), where a few MiB more or less gave "out of
/// host memory". Before each creation the room for them is reserved and released: none is std::bad_alloc, which the
/// CLI reports as out of host memory (exit 1). Buffers are tens to hundreds of KiB; 32 MiB leaves oneDNN's own
/// allocations room as well.
void require_jit_room() {
  constexpr std::size_t kRoom = std::size_t{32} << 20;
  void* p = ::mmap(nullptr, kRoom, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  ::munmap(p, kRoom);
}

/// The activations of mb samples: NHWC, or, when `blocked`, nChw16c, which for exactly 16 channels is the same bytes
/// (oneDNN then runs its blocked kernels on the NHWC tensors as they are).
memory::desc activations(std::int64_t n, const Shape& s, bool blocked) {
  return memory::desc({n, s.c, s.h, s.w}, Dt::f32, blocked ? Tag::nChw16c : Tag::nhwc);
}

/// The weights as the arena holds them: OHWI ([g][og][kh][kw][cg] when grouped).
memory::desc weights_desc(const Shape& xs, const Shape& ys, const Conv2dParams& p, bool user) {
  const std::int64_t g = p.groups, cg = xs.c / g, og = ys.c / g;
  if (g == 1) return memory::desc({ys.c, xs.c, p.kernel_h, p.kernel_w}, Dt::f32, user ? Tag::ohwi : Tag::any);
  return memory::desc({g, og, cg, p.kernel_h, p.kernel_w}, Dt::f32, user ? Tag::gohwi : Tag::any);
}

ActSide make_side(std::int64_t mb, const Shape& s, bool wino) {
  require_jit_room();
  ActSide a;
  a.user = activations(mb, s, false);
  a.prim = activations(mb, s, wino);
  a.floats = a.prim.get_size() / 4;
  a.reorder = wino && s.c != 16;
  if (a.reorder) {
    const dnnl::engine& eng = cpu_engine();
    a.to_prim = dnnl::reorder(dnnl::reorder::primitive_desc(eng, a.user, eng, a.prim));
    a.from_prim = dnnl::reorder(dnnl::reorder::primitive_desc(eng, a.prim, eng, a.user));
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    dnnl::primitive_attr acc;
    acc.set_post_ops(ops);
    a.from_prim_acc = dnnl::reorder(dnnl::reorder::primitive_desc(eng, a.prim, eng, a.user, acc));
  }
  return a;
}

ConvPrim make_prim(Impl& m, const Conv2dParams& p, std::int64_t mb) {
  require_jit_room();
  const dnnl::engine& eng = cpu_engine();
  const bool blocked = m.blocked16 || m.wino;
  const memory::desc x = activations(mb, m.xs, blocked), y = activations(mb, m.ys, blocked);
  const memory::desc w = weights_desc(m.xs, m.ys, p, false);
  const memory::dims strides{p.stride_h, p.stride_w}, pad{p.pad_h, p.pad_w};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto algo = m.wino ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, algo, x, w,
                                           m.bias ? m.b_md : memory::desc(), y, strides, pad, pad);
  const dnnl::convolution_forward::primitive_desc fpd(fd, attr, eng);
  ConvPrim c;
  c.mb = mb;
  c.x = make_side(mb, m.xs, m.wino);
  c.y = make_side(mb, m.ys, m.wino);
  memory::desc w_prim;
  switch (m.pass) {
    case Conv2dPass::Forward:
      c.prim = dnnl::convolution_forward(fpd);
      c.act_in = x, c.act_out = y;
      c.scratch_bytes = fpd.scratchpad_desc().get_size();
      w_prim = fpd.weights_desc();
      m.impl = fpd.impl_info_str();
      break;
    case Conv2dPass::BackwardData: {
      const dnnl::convolution_backward_data::desc bd(algo, x, w, y, strides, pad, pad);
      const dnnl::convolution_backward_data::primitive_desc pd(bd, attr, eng, fpd);
      c.prim = dnnl::convolution_backward_data(pd);
      c.act_in = y, c.act_out = x;
      c.scratch_bytes = pd.scratchpad_desc().get_size();
      w_prim = pd.weights_desc();
      m.impl = pd.impl_info_str();
      break;
    }
    case Conv2dPass::BackwardFilter: {
      const dnnl::convolution_backward_weights::desc bd(algo, x, w, memory::desc(), y, strides, pad, pad);
      const dnnl::convolution_backward_weights::primitive_desc pd(bd, attr, eng, fpd);
      c.prim = dnnl::convolution_backward_weights(pd);
      c.act_in = x, c.act_out = y;  // src and diff_dst
      c.scratch_bytes = pd.scratchpad_desc().get_size();
      w_prim = pd.diff_weights_desc();
      m.impl = pd.impl_info_str();
      break;
    }
  }
  if (m.full.mb == 0) {
    m.w_prim = w_prim;
  } else {
    RN_CHECK(w_prim == m.w_prim, "oneDNN chose different weight formats for batch pieces of {} and {} samples",
             m.full.mb, mb);
  }
  return c;
}

/// A blocked memory format in oneDNN's notation: the dimensions outermost first (upper case when blocked), then the
/// inner blocks, e.g. OIhw16i16o; plain ones in lower case (ohwi, the arena's OHWI).
std::string format_name(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked) return "?";
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const int nd = d.ndims;
  const char* letters = nd == 5 ? "goihw" : "oihw";
  bool blocked[DNNL_MAX_NDIMS] = {};
  for (int i = 0; i < b.inner_nblks; ++i) blocked[b.inner_idxs[i]] = true;
  int order[DNNL_MAX_NDIMS];
  for (int i = 0; i < nd; ++i) order[i] = i;
  // Outermost first; a tie (a dimension of size 1 shares its neighbour's stride) puts the larger dimension outside.
  std::stable_sort(order, order + nd, [&](int a, int c) {
    if (b.strides[a] != b.strides[c]) return b.strides[a] > b.strides[c];
    return d.padded_dims[a] > d.padded_dims[c];
  });
  std::string s;
  for (int i = 0; i < nd; ++i) {
    const char l = letters[order[i]];
    s += blocked[order[i]] ? static_cast<char>(l - 'a' + 'A') : l;
  }
  for (int i = 0; i < b.inner_nblks; ++i) s += fmt::format("{}{}", b.inner_blks[i], letters[b.inner_idxs[i]]);
  return s;
}

void make_reorders(Impl& m) {
  require_jit_room();
  const dnnl::engine& eng = cpu_engine();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const bool to_user = m.pass == Conv2dPass::BackwardFilter;
  const memory::desc& src = to_user ? m.w_prim : m.w_user;
  const memory::desc& dst = to_user ? m.w_user : m.w_prim;
  const dnnl::reorder::primitive_desc pd(eng, src, eng, dst, attr);
  m.w_reorder = dnnl::reorder(pd);
  m.w_reorder_scratch = pd.scratchpad_desc().get_size();
  if (to_user) {  // accumulate: dW += reorder(partial sum)
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    dnnl::primitive_attr acc = attr;
    acc.set_post_ops(ops);
    const dnnl::reorder::primitive_desc apd(eng, src, eng, dst, acc);
    m.w_reorder_accumulate = dnnl::reorder(apd);
    m.w_reorder_scratch = std::max(m.w_reorder_scratch, apd.scratchpad_desc().get_size());
  }
}

/// This thread's scratchpad of at least `bytes` (oneDNN primitives with user scratchpads run concurrently).
memory scratchpad(std::size_t bytes) {
  float* p = detail::scratch(detail::ScratchSlot::DnnScratchpad, std::max<std::size_t>(bytes, 64) / 4 + 1);
  return memory(memory::desc({static_cast<memory::dim>(std::max<std::size_t>(bytes, 1))}, Dt::u8, Tag::x), cpu_engine(),
                p);
}

void run_reorder(const Impl& m, bool accumulate, const void* src, void* dst) {
  m.reorders.fetch_add(1, std::memory_order_relaxed);
  const bool to_user = m.pass == Conv2dPass::BackwardFilter;
  memory s(to_user ? m.w_prim : m.w_user, cpu_engine(), const_cast<void*>(src));
  memory d(to_user ? m.w_user : m.w_prim, cpu_engine(), dst);
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d}};
  if (m.w_reorder_scratch) args.emplace(DNNL_ARG_SCRATCHPAD, scratchpad(m.w_reorder_scratch));
  (accumulate ? m.w_reorder_accumulate : m.w_reorder).execute(thread_stream(), args);
}

/// A piece's input activation as the primitive takes it: `user` itself (NHWC, or nChw16c of 16 channels), or its
/// nChw16c copy in this thread's scratch `slot`.
const float* side_in(const ActSide& a, const float* user, detail::ScratchSlot slot) {
  if (!a.reorder) return user;
  float* blk = detail::scratch(slot, a.floats);
  a.to_prim.execute(thread_stream(), {{DNNL_ARG_FROM, memory(a.user, cpu_engine(), const_cast<float*>(user))},
                                      {DNNL_ARG_TO, memory(a.prim, cpu_engine(), blk)}});
  return blk;
}

/// A piece's output written by the primitive at `blk` back into `user` (NHWC; += when accumulating).
void side_out(const ActSide& a, const float* blk, float* user, bool accumulate) {
  (accumulate ? a.from_prim_acc : a.from_prim)
      .execute(thread_stream(), {{DNNL_ARG_FROM, memory(a.prim, cpu_engine(), const_cast<float*>(blk))},
                                 {DNNL_ARG_TO, memory(a.user, cpu_engine(), user)}});
}

/// Runs `piece(i, prim)` for every piece on the thread pool, oneDNN limited to each running thread.
template <class F>
void for_each_piece(const Impl& m, std::int64_t count, F&& piece) {
  parallel_for(0, count, 1, [&](std::int64_t b, std::int64_t e) {
    OnThisThreadOnly one;
    for (std::int64_t i = b; i < e; ++i) piece(i, m.prim_of(i));
  });
}

}  // namespace

Conv2dPlan::Onednn::Onednn(const Shape& xs, const Shape& ys, const Conv2dParams& p, Conv2dPass pass, bool bias)
    : m(std::make_unique<Impl>()) {
  OnThisThreadOnly one;  // primitives size their blocking for the threads they will run on
  m->pass = pass;
  m->xs = xs;
  m->ys = ys;
  m->bias = bias && pass == Conv2dPass::Forward;
  m->w_user = weights_desc(xs, ys, p, true);
  m->b_md = memory::desc({ys.c}, Dt::f32, Tag::x);
  const std::int64_t min_samples = (kMinPositionsPerPiece + ys.h * ys.w - 1) / (ys.h * ys.w);
  std::int64_t target = std::max<std::int64_t>(1, std::min(kSamplePieces, xs.n / min_samples));
  if (pass == Conv2dPass::BackwardFilter) {
    const std::int64_t wbytes = conv2d_weight_elems(xs.c, ys.c, p) * 4;
    const std::int64_t flops_per_weight = 2 * ys.n * ys.h * ys.w;
    target = std::clamp<std::int64_t>(std::min(flops_per_weight / kWgradFlopsPerWeightPerPiece,
                                               kWgradPartialBytes / std::max<std::int64_t>(wbytes, 1)),
                                      2, kWgradPieces);
  }
  const Pieces direct_pieces(xs.n, std::min(target, xs.n));
  // Winograd pieces: ~32 samples (see kWinoPiece). The weight gradient's partial sums make its piece count part of
  // the result, so that count depends on the batch alone; the forward's and dx's bits do not depend on the piece
  // size (checked: Conv2dOnednn.WinogradMatchesTheReferenceWhateverTheThreadCount), so those use at least one piece
  // per thread.
  const std::int64_t wino_target =
      pass == Conv2dPass::BackwardFilter
          ? (xs.n + kWinoPiece - 1) / kWinoPiece
          : std::max<std::int64_t>((xs.n + kWinoPiece - 1) / kWinoPiece, std::min<std::int64_t>(xs.n, num_threads()));
  // 16 channels on both sides: oneDNN's blocked kernels beat its NHWC ones on the forward and dx (28×28×16→16,
  // one core: 181-183 vs 153-161 GFLOP/s forward) and need no reorder, since nChw16c of 16 channels is NHWC; not
  // for the weight gradient (182 vs 200). Any other channel count would mix formats, where oneDNN has only `ref`.
  const bool blocked16 = xs.c == 16 && ys.c == 16 && p.groups == 1 && pass != Conv2dPass::BackwardFilter;
  auto make_all = [&] {
    m->full = ConvPrim{};
    m->tail = ConvPrim{};
    m->pieces = m->wino ? Pieces(xs.n, std::min(wino_target, xs.n)) : direct_pieces;
    m->full = make_prim(*m, p, m->pieces.size);
    if (m->pieces.tail != m->pieces.size) m->tail = make_prim(*m, p, m->pieces.tail);
  };
  try {
    // Winograd where it applies and oneDNN has its kernel here (AVX-512), else the direct kernels: blocked for 16
    // channels, else NHWC.
    m->wino = winograd_eligible(xs, ys, p, pass);
    if (m->wino) {
      try {
        make_all();
        m->wino = m->impl.find("wino") != std::string::npos;
      } catch (const dnnl::error&) {
        m->wino = false;
      }
    }
    if (!m->wino) {
      m->blocked16 = blocked16;
      bool fallback = false;
      try {
        make_all();
        fallback = m->blocked16 && m->impl.rfind("ref", 0) == 0;  // no blocked kernel here after all
      } catch (const dnnl::error&) {
        if (!m->blocked16) throw;
        fallback = true;
      }
      if (fallback) {
        m->blocked16 = false;
        make_all();
      }
    }
    make_reorders(*m);
  } catch (const dnnl::error& e) {
    RN_FAIL("oneDNN has no {} convolution for {} -> {} (kernel {}x{}, stride {}x{}, pad {}x{}, groups {}): {}",
            pass == Conv2dPass::Forward        ? "forward"
            : pass == Conv2dPass::BackwardData ? "backward-data"
                                               : "backward-weights",
            xs.str(), ys.str(), p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.groups,
            dnnl_message(e));
  }
  m->w_prim_floats = static_cast<std::int64_t>((m->w_prim.get_size() + 3) / 4);
  m->layout.activations = m->wino ? (m->full.x.reorder || m->full.y.reorder ? "nhwc>nChw16c" : "nChw16c")
                          : m->blocked16 ? "nChw16c"
                                         : "nhwc";
  m->layout.winograd = m->wino;
  m->layout.arena_weights = format_name(m->w_user);
  m->layout.weights = format_name(m->w_prim);
  m->layout.weight_reorder = true;  // every call runs m->w_reorder (there is no fast kernel on the arena's OHWI)
  m->layout.weight_floats = m->w_prim_floats;
}

Conv2dPlan::Onednn::~Onednn() = default;

const std::string& Conv2dPlan::Onednn::impl() const { return m->impl; }
const OnednnLayout& Conv2dPlan::Onednn::layout() const { return m->layout; }
std::int64_t Conv2dPlan::Onednn::weight_reorders() const { return m->reorders.load(std::memory_order_relaxed); }

void Conv2dPlan::Onednn::forward(const float* x, const float* w, const float* bias, float* y) const {
  OnThisThreadOnly one;
  float* wp = detail::scratch(detail::ScratchSlot::DnnWeights, static_cast<std::size_t>(m->w_prim_floats));
  run_reorder(*m, false, w, wp);
  const std::int64_t xper = m->xs.per_sample(), yper = m->ys.per_sample();
  const auto& eng = cpu_engine();
  for_each_piece(*m, m->pieces.count, [&](std::int64_t i, const ConvPrim& c) {
    const std::int64_t n0 = m->pieces.begin(i);
    const float* src = side_in(c.x, x + n0 * xper, detail::ScratchSlot::DnnActX);
    float* out = y + n0 * yper;
    float* dst = c.y.reorder ? detail::scratch(detail::ScratchSlot::DnnActY, c.y.floats) : out;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(c.act_in, eng, const_cast<float*>(src))},
                                         {DNNL_ARG_WEIGHTS, memory(m->w_prim, eng, wp)},
                                         {DNNL_ARG_DST, memory(c.act_out, eng, dst)},
                                         {DNNL_ARG_SCRATCHPAD, scratchpad(c.scratch_bytes)}};
    if (m->bias) args.emplace(DNNL_ARG_BIAS, memory(m->b_md, eng, const_cast<float*>(bias)));
    c.prim.execute(thread_stream(), args);
    if (c.y.reorder) side_out(c.y, dst, out, false);
  });
}

namespace {

/// One dx piece: the primitive overwrites, so an accumulating pass writes the piece to scratch and adds it.
void data_piece(const Impl& m, std::int64_t i, const ConvPrim& c, const float* dy, const float* wp, float* dx,
                bool accumulate) {
  const auto& eng = cpu_engine();
  const std::int64_t xper = m.xs.per_sample(), yper = m.ys.per_sample();
  const std::int64_t n0 = m.pieces.begin(i), elems = c.mb * xper;
  float* out = dx + n0 * xper;
  const float* src = side_in(c.y, dy + n0 * yper, detail::ScratchSlot::DnnActY);
  float* dst = c.x.reorder ? detail::scratch(detail::ScratchSlot::DnnActX, c.x.floats)
               : accumulate ? detail::scratch(detail::ScratchSlot::DnnTemp, static_cast<std::size_t>(elems))
                            : out;
  c.prim.execute(thread_stream(), {{DNNL_ARG_DIFF_DST, memory(c.act_in, eng, const_cast<float*>(src))},
                                   {DNNL_ARG_WEIGHTS, memory(m.w_prim, eng, const_cast<float*>(wp))},
                                   {DNNL_ARG_DIFF_SRC, memory(c.act_out, eng, dst)},
                                   {DNNL_ARG_SCRATCHPAD, scratchpad(c.scratch_bytes)}});
  if (c.x.reorder) {
    side_out(c.x, dst, out, accumulate);
  } else if (accumulate) {
    RN_IVDEP for (std::int64_t k = 0; k < elems; ++k) out[k] += dst[k];
  }
}

/// One weight-gradient piece: its partial dW into part + i·|dW| (the primitive's format).
void filter_piece(const Impl& m, std::int64_t i, const ConvPrim& c, const float* x, const float* dy, float* part) {
  const auto& eng = cpu_engine();
  const std::int64_t xper = m.xs.per_sample(), yper = m.ys.per_sample();
  const std::int64_t n0 = m.pieces.begin(i);
  const float* src = side_in(c.x, x + n0 * xper, detail::ScratchSlot::DnnActX);
  const float* ddst = side_in(c.y, dy + n0 * yper, detail::ScratchSlot::DnnActY);
  c.prim.execute(thread_stream(), {{DNNL_ARG_SRC, memory(c.act_in, eng, const_cast<float*>(src))},
                                   {DNNL_ARG_DIFF_DST, memory(c.act_out, eng, const_cast<float*>(ddst))},
                                   {DNNL_ARG_DIFF_WEIGHTS, memory(m.w_prim, eng, part + i * m.w_prim_floats)},
                                   {DNNL_ARG_SCRATCHPAD, scratchpad(c.scratch_bytes)}});
}

/// Σ of the weight-gradient partials in piece order, element by element (any split of the elements gives the same
/// bits), then the reorder into dw (OHWI; += with accumulate).
void finish_filter(const Impl& m, float* part, float* dw, bool accumulate) {
  const std::int64_t wf = m.w_prim_floats, count = m.pieces.count;
  if (count > 1)
    parallel_for(0, wf, 4096, [&](std::int64_t e0, std::int64_t e1) {
      for (std::int64_t i = 1; i < count; ++i) {
        const float* src = part + i * wf;
        for (std::int64_t k = e0; k < e1; ++k) part[k] += src[k];
      }
    });
  run_reorder(m, accumulate, part, dw);
}

}  // namespace

void Conv2dPlan::Onednn::backward_data(const float* dy, const float* w, float* dx, bool accumulate) const {
  OnThisThreadOnly one;
  float* wp = detail::scratch(detail::ScratchSlot::DnnWeights, static_cast<std::size_t>(m->w_prim_floats));
  run_reorder(*m, false, w, wp);
  for_each_piece(*m, m->pieces.count,
                 [&](std::int64_t i, const ConvPrim& c) { data_piece(*m, i, c, dy, wp, dx, accumulate); });
}

void Conv2dPlan::Onednn::backward_filter(const float* x, const float* dy, float* dw, bool accumulate) const {
  OnThisThreadOnly one;
  float* part =
      detail::scratch(detail::ScratchSlot::DnnPartial, static_cast<std::size_t>(m->pieces.count * m->w_prim_floats));
  for_each_piece(*m, m->pieces.count, [&](std::int64_t i, const ConvPrim& c) { filter_piece(*m, i, c, x, dy, part); });
  finish_filter(*m, part, dw, accumulate);
}

void Conv2dPlan::Onednn::backward_filter_and_data(const float* x, const float* dy, float* dw, bool accumulate_w,
                                                  const Onednn& data, const float* w, float* dx,
                                                  bool accumulate_dx) const {
  OnThisThreadOnly one;
  const Impl& d = *data.m;
  float* wp = detail::scratch(detail::ScratchSlot::DnnWeights, static_cast<std::size_t>(d.w_prim_floats));
  run_reorder(d, false, w, wp);
  float* part =
      detail::scratch(detail::ScratchSlot::DnnPartial, static_cast<std::size_t>(m->pieces.count * m->w_prim_floats));
  // The weight-gradient pieces first (the bigger ones), then the dx pieces: one claim order, one join.
  const std::int64_t nw = m->pieces.count, total = nw + d.pieces.count;
  parallel_for(0, total, 1, [&](std::int64_t b, std::int64_t e) {
    OnThisThreadOnly here;
    for (std::int64_t i = b; i < e; ++i) {
      if (i < nw)
        filter_piece(*m, i, m->prim_of(i), x, dy, part);
      else
        data_piece(d, i - nw, d.prim_of(i - nw), dy, wp, dx, accumulate_dx);
    }
  });
  finish_filter(*m, part, dw, accumulate_w);
}

bool onednn_available() {
  static const bool ok = [] {
    try {
      cpu_engine();
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

bool conv2d_winograd_available() {
  // jit_wino_4x3 needs avx512_core; oneDNN's effective ISA is the CPU's, capped by DNNL_MAX_CPU_ISA.
  static const bool yes = [] {
    if (!onednn_available()) return false;
    const auto isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
           isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return yes;
}

#else  // built without oneDNN

struct Conv2dPlan::Onednn::Impl {};

Conv2dPlan::Onednn::Onednn(const Shape&, const Shape&, const Conv2dParams&, Conv2dPass, bool) {
  RN_FAIL("this build has no oneDNN (install libdnnl-dev, or spack install renaissance +onednn, and reconfigure)");
}
Conv2dPlan::Onednn::~Onednn() = default;
const std::string& Conv2dPlan::Onednn::impl() const {
  static const std::string none;
  return none;
}
const OnednnLayout& Conv2dPlan::Onednn::layout() const {
  static const OnednnLayout none;
  return none;
}
std::int64_t Conv2dPlan::Onednn::weight_reorders() const { return 0; }
void Conv2dPlan::Onednn::forward(const float*, const float*, const float*, float*) const {}
void Conv2dPlan::Onednn::backward_data(const float*, const float*, float*, bool) const {}
void Conv2dPlan::Onednn::backward_filter(const float*, const float*, float*, bool) const {}
void Conv2dPlan::Onednn::backward_filter_and_data(const float*, const float*, float*, bool, const Onednn&, const float*,
                                                  float*, bool) const {}

bool onednn_available() { return false; }
bool conv2d_winograd_available() { return false; }

#endif

}  // namespace renaissance::cpu
