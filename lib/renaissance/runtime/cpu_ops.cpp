// The CPU backend's kernel table: each entry adapts one plan node to the FP32 CPU kernels in kernels/cpu.
// AMP plans store FP16: inputs are widened into scratch, outputs narrowed back, so the same FP32 kernels
// serve both (FP32 arithmetic, FP16 storage) and fused kinds run as their plain sub-nodes.
#include <renaissance/core/error.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/plan/fusion.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/fused_match.h>

#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/fully_connected.h>
#include <kernels/cpu/half.h>
#include <kernels/cpu/metrics.h>
#include <kernels/cpu/optimizer.h>
#include <kernels/cpu/pooling.h>
#include <kernels/cpu/range_ops.h>
#include <kernels/cpu/softmax_ce.h>
#include <renaissance/ops/pool.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>

namespace renaissance::runtime {

using fused_match::extent;
using fused_match::overlaps;
using fused_match::same;
using plan::OpKind;
using plan::RangeOp;

namespace {

// ---- FP16 storage around FP32 kernels ------------------------------------------------------------

/// Scratch buffers reused across nodes (ops run one at a time on the calling thread).
class Scratch {
 public:
  float* get(std::int64_t n) {
    if (m_next == m_buffers.size()) m_buffers.emplace_back();
    std::vector<float>& b = m_buffers[m_next++];
    if (b.size() < static_cast<std::size_t>(n)) b.resize(static_cast<std::size_t>(n));
    return b.data();
  }
  void reset() { m_next = 0; }

 private:
  std::deque<std::vector<float>> m_buffers;
  std::size_t m_next = 0;
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

/// An FP32 view of an input tensor (a widened copy when it is stored as FP16).
const float* f32_in(const TensorView& t) {
  if (!t) return nullptr;
  if (t.dtype == DType::F32) return t.as<const float>();
  RN_CHECK(t.dtype == DType::F16, "a float kernel got a {} tensor", dtype_name(t.dtype));
  float* s = scratch().get(t.elems());
  cpu::range_cast_f16_to_f32(t.as<const std::uint16_t>(), s, t.elems());
  return s;
}

/// An FP32 output: direct for FP32, else a scratch buffer narrowed back to FP16 when the op is done.
class F32Out {
 public:
  F32Out(const TensorView& t, bool preload) : m_t(t) {
    if (!t) return;
    if (t.dtype == DType::F32) {
      m_p = t.as<float>();
      return;
    }
    RN_CHECK(t.dtype == DType::F16, "a float kernel writes a {} tensor", dtype_name(t.dtype));
    m_p = scratch().get(t.elems());
    if (preload) cpu::range_cast_f16_to_f32(t.as<const std::uint16_t>(), m_p, t.elems());
  }
  ~F32Out() {
    if (m_t && m_t.dtype == DType::F16) cpu::range_cast_f32_to_f16(m_p, m_t.as<std::uint16_t>(), m_t.elems());
  }
  F32Out(const F32Out&) = delete;
  F32Out& operator=(const F32Out&) = delete;
  float* get() const { return m_p; }

 private:
  TensorView m_t;
  float* m_p = nullptr;
};

const float* hyper_of(const TensorView& t) { return t.as<const float>(); }

cpu::Conv2dParams conv_params(const plan::Node& n) {
  const plan::ConvParams& p = std::get<plan::ConvParams>(n.params);
  cpu::Conv2dParams c;
  c.kernel_h = c.kernel_w = static_cast<int>(p.k);
  c.stride_h = c.stride_w = static_cast<int>(p.stride);
  c.pad_h = c.pad_w = static_cast<int>(p.pad);
  c.groups = static_cast<int>(p.groups);
  return c;
}

/// The plan of a convolution pass, made by prepare_conv. x/dx are the pass's input-side shape, y/dy the output side.
const cpu::Conv2dPlan& conv_plan(const ResolvedNode& r) {
  RN_CHECK(r.state, "{} of layer '{}' was not prepared", plan::op_kind_name(r.node->op), r.layer);
  return *static_cast<const cpu::Conv2dPlan*>(r.state.get());
}

PrepareFn prepare_conv(cpu::Conv2dPass pass) {
  return [pass](ResolvedNode& r, ExecEnv&) {
    const bool data = pass == cpu::Conv2dPass::BackwardData;  // inputs: dy, w; output: dx
    const Shape& xs = data ? r.out[0].shape : r.in[0].shape;
    const Shape& ys = data ? r.in[0].shape : (pass == cpu::Conv2dPass::Forward ? r.out[0].shape : r.in[1].shape);
    const bool bias = pass == cpu::Conv2dPass::Forward && r.in.size() > 2;
    try {
      const cpu::Conv2dParams cp = conv_params(*r.node);
      auto plan = std::make_shared<cpu::Conv2dPlan>(xs, ys, cp, pass, bias);
      // As the CUDA backend words it: a fused layer holds several convolutions, the shapes tell them apart.
      r.detail = fmt::format("{} {}{} {}x{}x{}>{} k{}s{}{} [{}]", r.layer.empty() ? "conv" : r.layer,
                             pass == cpu::Conv2dPass::Forward        ? "fwd"
                             : pass == cpu::Conv2dPass::BackwardData ? "dgrad"
                                                                     : "wgrad",
                             r.node->accumulate ? "+acc" : "", xs.h, xs.w, xs.c, ys.c, cp.kernel_h, cp.stride_h,
                             cp.groups > 1 ? fmt::format("g{}", cp.groups) : "", plan->describe());
      r.state = std::move(plan);
    } catch (const Error& e) {
      throw e.with_context(fmt::format("layer '{}'", r.layer));
    }
  };
}

cpu::Pool2dParams pool_params(const plan::Node& n) {
  const plan::PoolParams& p = std::get<plan::PoolParams>(n.params);
  cpu::Pool2dParams c;
  c.kernel_h = c.kernel_w = static_cast<int>(p.k);
  c.stride_h = c.stride_w = static_cast<int>(p.stride);
  c.pad_h = c.pad_w = static_cast<int>(p.pad);
  return c;
}

/// Runs `fn` with per-node scratch released afterwards.
template <typename F>
OpFn op(F fn) {
  return [fn](const ResolvedNode& r, ExecEnv& env) {
    scratch().reset();
    fn(r, env);
  };
}

void add_into(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// ---- synchronised BatchNorm (--sync-bn, DESIGN §9) ----------------------------------------------------
// The statistics of the global batch: every rank holds R = N·H·W of the R·W values of a channel (equal shards).
// Forward: Σx summed over the ranks gives the mean, then Σ(x − mean)² the biased variance (two passes: no
// cancellation). Backward: Σdy and Σdy·x̂ summed over the ranks enter dx; dγ, dβ stay this rank's sums (the
// gradient all-reduce averages them like every other parameter gradient).

bool sync_bn(const ExecEnv& env) { return env.sync_bn && env.comm && env.comm->world_size() > 1; }

/// inputs: x, gamma, beta, hyper; outputs: y, batch mean, batch var (unbiased), invstd.
void sync_bn_forward(const ResolvedNode& r, ExecEnv& env, const float* x, float* y) {
  const Shape& s = r.in[0].shape;
  const std::int64_t c = s.c, rows = s.elems() / c;
  const double total = static_cast<double>(rows) * env.comm->world_size();
  RN_CHECK(total > 1, "BatchNorm over a global batch of one value per channel");
  const float* gamma = r.in[1].as<const float>();
  const float* beta = r.in[2].as<const float>();
  const float eps = hyper_of(r.in[3])[plan::kHyperBnEps];
  std::vector<double> acc(static_cast<std::size_t>(c));
  std::vector<float> buf(static_cast<std::size_t>(c)), mean(static_cast<std::size_t>(c)), invstd(static_cast<std::size_t>(c));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < c; ++k) acc[k] += x[i * c + k];
  for (std::int64_t k = 0; k < c; ++k) buf[k] = static_cast<float>(acc[k]);
  env.comm->allreduce_sum(buf.data(), c);
  for (std::int64_t k = 0; k < c; ++k) mean[k] = static_cast<float>(buf[k] / total);
  std::fill(acc.begin(), acc.end(), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < c; ++k) {
      const double d = x[i * c + k] - mean[k];
      acc[k] += d * d;
    }
  for (std::int64_t k = 0; k < c; ++k) buf[k] = static_cast<float>(acc[k]);
  env.comm->allreduce_sum(buf.data(), c);
  float* bmean = r.out[1].as<float>();
  float* bvar = r.out[2].as<float>();
  float* out_invstd = r.out[3].as<float>();
  for (std::int64_t k = 0; k < c; ++k) {
    const double var = buf[k] / total;
    invstd[k] = static_cast<float>(1.0 / std::sqrt(var + eps));
    bmean[k] = mean[k];
    bvar[k] = static_cast<float>(var * total / (total - 1.0));
    out_invstd[k] = invstd[k];
  }
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < c; ++k)
      y[i * c + k] = (x[i * c + k] - mean[k]) * invstd[k] * gamma[k] + beta[k];
}

/// inputs: x, dy, gamma, batch mean, invstd; outputs: dx (may be absent), dgamma, dbeta (accumulated).
void sync_bn_backward(const ResolvedNode& r, ExecEnv& env, const float* x, const float* dy, float* dx, bool accumulate) {
  const Shape& s = r.in[0].shape;
  const std::int64_t c = s.c, rows = s.elems() / c;
  const double total = static_cast<double>(rows) * env.comm->world_size();
  const float* gamma = r.in[2].as<const float>();
  const float* mean = r.in[3].as<const float>();
  const float* invstd = r.in[4].as<const float>();
  std::vector<double> s1(static_cast<std::size_t>(c)), s2(static_cast<std::size_t>(c));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < c; ++k) {
      const double g = dy[i * c + k];
      s1[k] += g;
      s2[k] += g * (x[i * c + k] - mean[k]) * invstd[k];
    }
  float* dgamma = r.out[1].as<float>();
  float* dbeta = r.out[2].as<float>();
  std::vector<float> buf(static_cast<std::size_t>(2 * c));
  for (std::int64_t k = 0; k < c; ++k) {
    dgamma[k] += static_cast<float>(s2[k]);
    dbeta[k] += static_cast<float>(s1[k]);
    buf[k] = static_cast<float>(s1[k]);
    buf[c + k] = static_cast<float>(s2[k]);
  }
  env.comm->allreduce_sum(buf.data(), 2 * c);  // every rank: the same collectives, dx or not
  if (!dx) return;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < c; ++k) {
      const float xhat = (x[i * c + k] - mean[k]) * invstd[k];
      const float v = gamma[k] * invstd[k] *
                      (dy[i * c + k] - static_cast<float>(buf[k] / total) - xhat * static_cast<float>(buf[c + k] / total));
      dx[i * c + k] = accumulate ? dx[i * c + k] + v : v;
    }
}

// ---- fused element-wise passes (DESIGN §11 lever 1; the CUDA backend's plan_fused, mirrored) ----------------------
//
// A FUSED_* node carries its plain parts and the fused passes the compiler planned over them (plan/fusion.cpp,
// ops/fused.h: program_of); everything else runs as its plain op. The passes (kernels/cpu/batchnorm.h):
//   BN → ReLU (in place)                 one apply pass writes relu(BN(x))
//   BN → ADD2(·, s) [→ ReLU] (in place)  one apply pass writes [relu](BN(x) + s)
//   ... where s is the output of an earlier BN of the same node that nothing else reads (the projection shortcut):
//                                        that BN only computes its statistics; its apply joins the pass above
//   RELU_BWD → BN_BWD (ReLU gradient read by nothing else)
//                                        the ReLU backward folds into both BN backward passes (mask recomputed from x)
//   CONV_BWD_FILTER → CONV_BWD_DATA of one layer (plan::runs_beside: the GPU runs them on two streams)
//                                        one parallel section over both passes' batch pieces (same bits; profiled
//                                        runs keep the two calls, as the GPU keeps one stream when profiling)
// Nothing is fused by matching addresses: FP32 and AMP plans alike carry fused layers (CBR, the residual blocks) whose
// passes the compiler planned. Between plain nodes only the convolution backward pair is grouped (pair_plain_convs,
// KernelTable::fuse_graph), its operands checked at prepare time as a safety check.
// Every fused pass rounds where the parts store (binary16 for AMP plans), so results equal the plain parts bit for bit;
// ExecEnv::fuse_kernels = false runs every part on its own.

struct FusedStep {
  enum Kind : std::uint8_t {
    kPlain,
    kStats,
    kApply,
    kBnReluBwd,
    kConvBwdPair,
    kAddReluBwd,
    kAddReluBnBwd
  } kind = kPlain;
  int node = -1;         ///< the sub-node: the plain node, the BN (stats, apply), the BN_BWD or the CONV_BWD_FILTER
  int relu = -1;         ///< apply: the RELU_FWD whose output is written (-1: no ReLU); bwd: the RELU_BWD
  int add = -1;          ///< apply: the ADD2_FWD (-1: none); conv pair: the CONV_BWD_DATA
  int shortcut_bn = -1;  ///< apply: the BN whose apply is the shortcut (-1: the ADD2's other input as stored)
  int stats_slot = -1;   ///< kStats, and kApply with a training shortcut BN: its saved mean in FusedProgram::means
  int pass = -1;         ///< the plan's fused pass (index into Node::fusions and ResolvedNode::pass_masks)
  std::string label;     ///< for the profiler
};
struct FusedProgram {
  std::vector<FusedStep> steps;
  /// The batch means of shortcut BNs between their statistics and the deferred apply (the plain forward normalises
  /// with the mean before it is blended into B_NEXT_MEAN, so it is kept as computed). One node runs at a time.
  mutable std::vector<std::vector<float>> means;
  bool fused() const {
    return std::any_of(steps.begin(), steps.end(), [](const FusedStep& s) { return s.kind != FusedStep::kPlain; });
  }
};

bool is_compute(const ResolvedNode& r) { return r.node->type == plan::NodeType::COMPUTE; }
bool is_fused_kind(const ResolvedNode& r) {
  return is_compute(r) && (r.node->op == OpKind::FUSED_FWD || r.node->op == OpKind::FUSED_BWD ||
                           r.node->op == OpKind::FUSED_INFER);
}

/// A layer's weight-gradient pass at i and its data-gradient pass at i + 1 (plan::runs_beside), neither writing what
/// the other reads: one parallel section over both (the GPU runs them on two streams).
bool conv_bwd_pair(const std::vector<ResolvedNode>& sub, int i) {
  if (i < 0 || static_cast<std::size_t>(i) + 1 >= sub.size()) return false;
  const ResolvedNode& wg = sub[static_cast<std::size_t>(i)];
  const ResolvedNode& dg = sub[static_cast<std::size_t>(i) + 1];
  if (!is_compute(wg) || !is_compute(dg) || wg.node->op != OpKind::CONV_BWD_FILTER ||
      dg.node->op != OpKind::CONV_BWD_DATA || !plan::runs_beside(wg.node->op, dg.node->op))
    return false;
  // inputs: x, dy | dy, w; outputs: dw[, db] | dx. Run together, neither may write what the other reads.
  bool safe = wg.in.size() >= 2 && dg.in.size() >= 2 && !dg.out.empty() && same(wg.in[1], dg.in[0]) &&
              wg.in[0].shape == dg.out[0].shape;
  for (const TensorView& o : dg.out)
    for (const TensorView& t : wg.in) safe = safe && !overlaps(o, t);
  for (const TensorView& o : wg.out) {
    for (const TensorView& t : dg.in) safe = safe && !overlaps(o, t);
    for (const TensorView& t : dg.out) safe = safe && !overlaps(o, t);
  }
  return safe;
}
/// Sub-node i run as it is.
FusedStep plain_step(const std::vector<ResolvedNode>& sub, int i) {
  FusedStep s;
  s.node = i;
  const ResolvedNode& r = sub[static_cast<std::size_t>(i)];
  s.label = is_compute(r) ? plan::op_kind_name(r.node->op) : plan::range_op_name(r.node->range_op);
  return s;
}
FusedStep conv_pair_step(int i) {
  FusedStep s;
  s.kind = FusedStep::kConvBwdPair;
  s.node = i;
  s.add = i + 1;
  s.label = "CONV_BWD_FILTER+DATA";
  return s;
}

/// A capture's plain nodes (outside the plan's fused layers) with each layer's weight- and data-gradient pair as one
/// section: the plan puts them side by side (plan::runs_beside, the GPU's two streams); no element-wise fusion is
/// decided here (that is the compiler's, plan/fusion.cpp).
FusedProgram plan_conv_pairs(const std::vector<ResolvedNode>& sub) {
  FusedProgram prog;
  for (int i = 0; i < static_cast<int>(sub.size()); ++i) {
    if (conv_bwd_pair(sub, i)) {
      prog.steps.push_back(conv_pair_step(i));
      ++i;
      continue;
    }
    prog.steps.push_back(plain_step(sub, i));
  }
  return prog;
}

/// The program of one of the plan's fused nodes: the compiler's fused passes (plan::Node::fusions, plan/fusion.cpp)
/// where it planned them, the plain parts elsewhere (a layer's two convolution backward passes as one section).
/// `fuse` false runs every part on its own (the plan's lifetimes allow both).
FusedProgram program_of(const ResolvedNode& r, bool fuse) {
  FusedProgram prog;
  const plan::Node& n = *r.node;
  RN_CHECK(n.sub.size() == r.sub.size(), "internal: a fused node resolved with {} of its {} parts", r.sub.size(),
           n.sub.size());
  const std::vector<int> step = fuse ? plan::fused_step_of(n) : std::vector<int>(n.sub.size(), -1);
  std::map<int, int> stats_slot;  // shortcut BN sub-node -> its saved mean
  for (std::size_t k = 0; k < step.size(); ++k) {
    if (step[k] == -2) continue;  // a part of a pass that runs elsewhere
    const int i = static_cast<int>(k);
    if (step[k] == -1) {
      if (fuse && k + 1 < step.size() && step[k + 1] == -1 && conv_bwd_pair(r.sub, i)) {
        prog.steps.push_back(conv_pair_step(i));
        ++k;
        continue;
      }
      prog.steps.push_back(plain_step(r.sub, i));
      continue;
    }
    const plan::FusedPass& f = n.fusions[static_cast<std::size_t>(step[k])];
    if (f.fallback_only) continue;  // a copy only the plain parts read
    FusedStep s;
    s.label = ops::fused_kind_label(f.kind);
    s.node = f.bn;
    s.relu = f.relu;
    s.pass = step[k];
    switch (f.kind) {
      case ops::FusedKind::BN_STATS:
        s.kind = FusedStep::kStats;
        s.stats_slot = stats_slot[f.bn] = static_cast<int>(prog.means.size());
        prog.means.emplace_back();
        break;
      case ops::FusedKind::RELU_BN_BWD: s.kind = FusedStep::kBnReluBwd; break;
      case ops::FusedKind::ADD_RELU_BWD:
        s.kind = FusedStep::kAddReluBwd;
        s.node = f.relu;
        s.add = f.add;
        break;
      case ops::FusedKind::ADD_RELU_BN_BWD:
      case ops::FusedKind::ADD_RELU_BN_BN_BWD:
        s.kind = FusedStep::kAddReluBnBwd;
        s.add = f.add;
        s.shortcut_bn = f.shortcut_bn;  // ADD_RELU_BN_BN_BWD: the shortcut BN's backward, run right after
        break;
      default: {
        s.kind = FusedStep::kApply;
        s.add = f.add;
        s.shortcut_bn = f.shortcut_bn;
        const auto it = stats_slot.find(f.shortcut_bn);
        if (it != stats_slot.end()) s.stats_slot = it->second;
        RN_CHECK(f.shortcut_bn < 0 || n.sub[static_cast<std::size_t>(f.shortcut_bn)].op != OpKind::BN_FWD_TRAIN ||
                     s.stats_slot >= 0,
                 "plan: a {} pass before the statistics of its shortcut BN", ops::fused_kind_name(f.kind));
        break;
      }
    }
    prog.steps.push_back(s);
  }
  return prog;
}

/// The statistics of a training BN node as the plain BN_FWD_TRAIN computes them: B_NEXT_* (momentum 1 into zeroed
/// buffers), invstd into its output; the batch mean as computed into `mean`.
void bn_train_statistics(const ResolvedNode& bn, const float* x, std::vector<float>& mean) {
  const float* h = hyper_of(bn.in[3]);
  float* bmean = bn.out[1].as<float>();
  float* bvar = bn.out[2].as<float>();
  const std::int64_t c = bn.out[1].shape.c;
  std::fill(bmean, bmean + c, 0.0f);
  std::fill(bvar, bvar + c, 0.0f);
  mean.resize(static_cast<std::size_t>(c));
  cpu::batchnorm_train_statistics(x, bn.in[0].shape, mean.data(), bn.out[3].as<float>(), bmean, bvar, 1.0f,
                                  h[plan::kHyperBnEps]);
}

/// The normalisation of a BN node for batchnorm_apply_fused (x: its FP32 input; mean: the training batch mean).
cpu::BnApply bn_apply_of(const ResolvedNode& bn, const float* x, const std::vector<float>& mean) {
  cpu::BnApply a;
  a.x = x;
  a.gamma = bn.in[1].as<const float>();
  a.beta = bn.in[2].as<const float>();
  if (bn.node->op == OpKind::BN_FWD_TRAIN) {
    a.mean = mean.data();
    a.invstd = bn.out[3].as<const float>();
  } else if (bn.node->op == OpKind::BN_APPLY) {  // inputs: x, gamma, beta, batch mean, invstd (the forward's)
    a.mean = bn.in[3].as<const float>();
    a.invstd = bn.in[4].as<const float>();
  } else {  // inputs: x, gamma, beta, running mean, running var, hyper
    a.mean = bn.in[3].as<const float>();
    a.running_var = bn.in[4].as<const float>();
    a.eps = hyper_of(bn.in[5])[plan::kHyperBnEps];
  }
  return a;
}

void run_plain(const ResolvedNode& s, ExecEnv& env) {
  const KernelTable& table = KernelTable::for_backend(Backend::CPU);
  (is_compute(s) ? table.compute(s.node->op) : table.range(s.node->range_op))(s, env);
}

/// The rows (N·H·W) of a ReLU mask for the output `y`, checked against its shape {N, H, W, ⌈C/8⌉}.
std::int64_t relu_mask_rows(const TensorView& mask, const TensorView& y) {
  const std::int64_t rows = y.shape.n * y.shape.h * y.shape.w;
  RN_CHECK(mask.shape.c == (y.shape.c + 7) / 8 && mask.shape.n * mask.shape.h * mask.shape.w == rows,
           "internal: ReLU mask {} for an output {}", mask.shape.str(), y.shape.str());
  return rows;
}

/// mask bit (row, ch) = stored y > 0: byte row·⌈C/8⌉ + ch/8, bit ch % 8 (plan_relu_masks' layout, the GPU's).
void write_relu_mask(const TensorView& y, const TensorView& mask) {
  const std::int64_t rows = relu_mask_rows(mask, y), c = y.shape.c, cb = mask.shape.c;
  const float* v = f32_in(y);
  auto* m = mask.as<std::uint8_t>();
  std::fill(m, m + rows * cb, std::uint8_t{0});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t ch = 0; ch < c; ++ch)
      if (v[r * c + ch] > 0.0f) m[r * cb + ch / 8] |= static_cast<std::uint8_t>(1u << (ch % 8));
}

/// The ReLU's sign from its mask as 1 or 0 per element of `like` (what relu_backward_sum tests with y > 0).
const float* relu_sign_from_mask(const TensorView& mask, const TensorView& like) {
  const std::int64_t rows = relu_mask_rows(mask, like), c = like.shape.c, cb = mask.shape.c;
  const auto* m = mask.as<const std::uint8_t>();
  float* out = scratch().get(like.elems());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t ch = 0; ch < c; ++ch) out[r * c + ch] = (m[r * cb + ch / 8] >> (ch % 8)) & 1u ? 1.0f : 0.0f;
  return out;
}

void run_fused_step(const ResolvedNode& r, const FusedProgram& prog, const FusedStep& st, ExecEnv& env) {
  const ResolvedNode& s = r.sub[static_cast<std::size_t>(st.node)];
  if (st.kind == FusedStep::kPlain) return run_plain(s, env);
  scratch().reset();
  switch (st.kind) {
    case FusedStep::kPlain: return;
    case FusedStep::kStats:
      bn_train_statistics(s, f32_in(s.in[0]), prog.means[static_cast<std::size_t>(st.stats_slot)]);
      return;
    case FusedStep::kApply: {
      const bool train = s.node->op == OpKind::BN_FWD_TRAIN;
      const float* x = f32_in(s.in[0]);
      std::vector<float> mean;
      if (train) bn_train_statistics(s, x, mean);
      cpu::BnShortcut kind = cpu::BnShortcut::kNone;
      const float* shortcut = nullptr;
      cpu::BnApply second;
      if (st.shortcut_bn >= 0) {
        kind = cpu::BnShortcut::kBatchNorm;
        const ResolvedNode& sb = r.sub[static_cast<std::size_t>(st.shortcut_bn)];
        static const std::vector<float> kNone;
        second = bn_apply_of(sb, f32_in(sb.in[0]),
                             st.stats_slot >= 0 ? prog.means[static_cast<std::size_t>(st.stats_slot)] : kNone);
      } else if (st.add >= 0) {
        kind = cpu::BnShortcut::kTensor;
        const ResolvedNode& add = r.sub[static_cast<std::size_t>(st.add)];
        shortcut = f32_in(add.in[0].ptr == s.out[0].ptr ? add.in[1] : add.in[0]);
      }
      {
        F32Out y(s.out[0], false);
        cpu::batchnorm_apply_fused(bn_apply_of(s, x, mean), s.in[0].shape, kind, shortcut,
                                   st.shortcut_bn >= 0 ? &second : nullptr, st.relu >= 0,
                                   s.out[0].dtype == DType::F16, y.get());
      }
      if (const TensorView mask = r.pass_mask(st.pass)) write_relu_mask(s.out[0], mask);
      return;
    }
    case FusedStep::kConvBwdPair: {
      const ResolvedNode& d = r.sub[static_cast<std::size_t>(st.add)];
      const float* x = f32_in(s.in[0]);
      const float* dy = f32_in(s.in[1]);
      const float* w = f32_in(d.in[1]);
      F32Out dw(s.out[0], s.node->accumulate);
      F32Out db(s.out.size() > 1 ? s.out[1] : TensorView{}, s.node->accumulate);
      F32Out dx(d.out[0], d.node->accumulate);
      conv_plan(s).backward_filter_and_data(x, dy, dw.get(), db.get(), s.node->accumulate, conv_plan(d), w, dx.get(),
                                            d.node->accumulate);
      return;
    }
    case FusedStep::kAddReluBwd: {
      // ACCUMULATE: addend -> dy (the sum, never formed); RELU_BWD inputs: y, dy.
      const ResolvedNode& acc = r.sub[static_cast<std::size_t>(st.add)];
      const float* y = f32_in(s.in[0]);
      const float* dy = f32_in(s.in[1]);
      const float* addend = f32_in(acc.in[0]);
      F32Out dx(s.out[0], false);
      cpu::relu_backward_sum(y, dy, addend, dx.get(), s.out[0].elems(), acc.out[0].dtype == DType::F16);
      return;
    }
    case FusedStep::kAddReluBnBwd: {
      // The reference is the composition: the sum's ReLU gradient g as ADD_RELU_BWD stores it (the shortcut reads it
      // too), then the BN backward reading g as stored; the GPU forms g inside the BN's statistics pass instead.
      const ResolvedNode& relu = r.sub[static_cast<std::size_t>(st.relu)];
      const ResolvedNode& acc = r.sub[static_cast<std::size_t>(st.add)];
      {
        // With a ReLU mask (plan_relu_masks) its bits stand for y, as on the GPU.
        const TensorView mask = r.pass_mask(st.pass);
        const float* y = mask ? relu_sign_from_mask(mask, relu.in[0]) : f32_in(relu.in[0]);
        F32Out g(relu.out[0], false);
        cpu::relu_backward_sum(y, f32_in(relu.in[1]), f32_in(acc.in[0]), g.get(), relu.out[0].elems(),
                               acc.out[0].dtype == DType::F16);
      }
      run_plain(s, env);
      // ADD_RELU_BN_BN_BWD: the shortcut BN's backward reading the same g (the GPU sums its statistics in the pass
      // above and writes both data gradients in one apply pass)
      if (st.shortcut_bn >= 0) run_plain(r.sub[static_cast<std::size_t>(st.shortcut_bn)], env);
      return;
    }
    case FusedStep::kBnReluBwd: {
      // BN_BWD inputs: x, dy (the ReLU gradient, never formed), gamma, batch mean, invstd, beta; RELU_BWD: y, dy.
      const ResolvedNode& relu = r.sub[static_cast<std::size_t>(st.relu)];
      const float* x = f32_in(s.in[0]);
      const float* dy = f32_in(relu.in[1]);
      F32Out dx(s.out[0], s.node->accumulate);
      cpu::batchnorm_relu_backward(x, dy, s.in[0].shape, s.in[2].as<const float>(), s.in[5].as<const float>(),
                                   s.in[3].as<const float>(), s.in[4].as<const float>(),
                                   relu.in[0].dtype == DType::F16, dx.get(), s.out[1].as<float>(),
                                   s.out[2].as<float>(), s.node->accumulate, true);
      return;
    }
  }
}

void run_fused(const ResolvedNode& r, ExecEnv& env) {
  const auto* prog = static_cast<const FusedProgram*>(r.state.get());
  // Synchronised BN (several ranks) reduces its statistics over the ranks inside the plain ops: run the parts.
  if (!prog || sync_bn(env)) {
    for (const ResolvedNode& s : r.sub) {
      const bool bracket = env.timer && !is_fused_kind(s);
      if (bracket)
        env.timer->begin(env, is_compute(s) ? plan::op_kind_name(s.node->op) : plan::range_op_name(s.node->range_op),
                         s.detail);
      run_plain(s, env);
      if (bracket) env.timer->end(env);
    }
    return;
  }
  // Profiling: the executor leaves FUSED_* nodes to their runner, which brackets each of its steps (a fused layer
  // inside a group of plain nodes brackets its own).
  for (const FusedStep& st : prog->steps) {
    const ResolvedNode& s = r.sub[static_cast<std::size_t>(st.node)];
    if (st.kind == FusedStep::kConvBwdPair && env.timer) {  // profiled: the two passes on their own, as planned
      for (int k : {st.node, st.add}) {
        const ResolvedNode& p = r.sub[static_cast<std::size_t>(k)];
        env.timer->begin(env, plan::op_kind_name(p.node->op), p.detail);
        run_plain(p, env);
        env.timer->end(env);
      }
      continue;
    }
    const bool bracket = env.timer && !(st.kind == FusedStep::kPlain && is_fused_kind(s));
    if (bracket) env.timer->begin(env, st.label, st.kind == FusedStep::kPlain ? s.detail : std::string());
    run_fused_step(r, *prog, st, env);
    if (bracket) env.timer->end(env);
  }
}

void prepare_fused(ResolvedNode& r, ExecEnv& env) {
  if (r.state) return;  // a group of plain nodes: pair_plain_convs planned it
  r.state = std::make_shared<FusedProgram>(program_of(r, env.fuse_kernels && !sync_bn(env)));
}

/// KernelTable::fuse_graph of the CPU: when a capture's plain nodes hold a convolution's two backward passes side by
/// side, the whole list becomes one group node (FUSED_FWD, owned by the ResolvedNode) that runs each pair as one
/// section; otherwise the list stays as it is.
void pair_plain_convs(std::vector<ResolvedNode>& nodes, std::vector<const OpFn*>& fns, ExecEnv& env) {
  if (!env.fuse_kernels || nodes.size() < 2) return;
  auto prog = std::make_shared<FusedProgram>(plan_conv_pairs(nodes));
  if (!prog->fused()) return;
  auto group = std::make_shared<plan::Node>();
  group->type = plan::NodeType::COMPUTE;
  group->op = OpKind::FUSED_FWD;
  ResolvedNode r;
  r.owned_node = group;
  r.node = group.get();
  r.sub = std::move(nodes);
  r.state = std::move(prog);
  nodes.clear();
  nodes.push_back(std::move(r));
  fns.assign(1, &KernelTable::for_backend(Backend::CPU).compute(OpKind::FUSED_FWD));
}

// ---- COMPUTE ops ------------------------------------------------------------------------------------

void register_compute(KernelTable& t) {
  // Convolutions: each pass planned once at prepare time (algorithm, oneDNN primitives and formats).
  t.add_compute(
      OpKind::CONV_FWD, op([](const ResolvedNode& r, ExecEnv&) {
        const float* x = f32_in(r.in[0]);
        const float* w = f32_in(r.in[1]);
        const float* b = r.in.size() > 2 ? f32_in(r.in[2]) : nullptr;
        F32Out y(r.out[0], false);
        conv_plan(r).forward(x, w, b, y.get());
      }),
      prepare_conv(cpu::Conv2dPass::Forward));
  t.add_compute(
      OpKind::CONV_BWD_DATA, op([](const ResolvedNode& r, ExecEnv&) {
        const float* dy = f32_in(r.in[0]);
        const float* w = f32_in(r.in[1]);
        F32Out dx(r.out[0], r.node->accumulate);
        conv_plan(r).backward_data(dy, w, dx.get(), r.node->accumulate);
      }),
      prepare_conv(cpu::Conv2dPass::BackwardData));
  t.add_compute(
      OpKind::CONV_BWD_FILTER, op([](const ResolvedNode& r, ExecEnv&) {
        const float* x = f32_in(r.in[0]);
        const float* dy = f32_in(r.in[1]);
        F32Out dw(r.out[0], r.node->accumulate);
        F32Out db(r.out.size() > 1 ? r.out[1] : TensorView{}, r.node->accumulate);
        conv_plan(r).backward_filter(x, dy, dw.get(), db.get(), r.node->accumulate);
      }),
      prepare_conv(cpu::Conv2dPass::BackwardFilter));
  t.add_compute(OpKind::BN_FWD_TRAIN, op([](const ResolvedNode& r, ExecEnv& env) {
                  // Batch statistics go to B_NEXT_* (momentum 1 into zeroed buffers = the unbiased batch
                  // variance); UPDATE_STATS blends them into the running statistics once per step.
                  const float* h = hyper_of(r.in[3]);
                  const float* x = f32_in(r.in[0]);
                  F32Out y(r.out[0], false);
                  if (sync_bn(env)) return sync_bn_forward(r, env, x, y.get());
                  float* bmean = r.out[1].as<float>();
                  float* bvar = r.out[2].as<float>();
                  const std::int64_t c = r.out[1].shape.c;
                  std::fill(bmean, bmean + c, 0.0f);
                  std::fill(bvar, bvar + c, 0.0f);
                  std::vector<float> save_mean(static_cast<std::size_t>(c));
                  cpu::batchnorm_forward_train(x, r.in[0].shape, r.in[1].as<const float>(), r.in[2].as<const float>(),
                                               y.get(), save_mean.data(), r.out[3].as<float>(), bmean, bvar, 1.0f,
                                               h[plan::kHyperBnEps]);
                }));
  t.add_compute(OpKind::BN_APPLY, op([](const ResolvedNode& r, ExecEnv&) {
                  // inputs: x, gamma, beta, batch mean, invstd; y = (x - mean)·(invstd·γ) + β, the training
                  // forward's own formula and rounding (a recomputed value equals the forward's bit for bit)
                  static const std::vector<float> kUnused;
                  F32Out y(r.out[0], false);
                  cpu::batchnorm_apply_fused(bn_apply_of(r, f32_in(r.in[0]), kUnused), r.in[0].shape,
                                             cpu::BnShortcut::kNone, nullptr, nullptr, false,
                                             r.out[0].dtype == DType::F16, y.get());
                }));
  t.add_compute(OpKind::BN_FWD_INFER, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* h = hyper_of(r.in[5]);
                  const float* x = f32_in(r.in[0]);
                  F32Out y(r.out[0], false);
                  cpu::batchnorm_forward_inference(x, r.in[0].shape, r.in[1].as<const float>(),
                                                   r.in[2].as<const float>(), r.in[3].as<const float>(),
                                                   r.in[4].as<const float>(), y.get(), h[plan::kHyperBnEps]);
                }));
  t.add_compute(OpKind::BN_BWD, op([](const ResolvedNode& r, ExecEnv& env) {
                  // inputs: x, dy, gamma, batch_mean, invstd; outputs: dx (may be absent), dgamma, dbeta
                  const float* x = f32_in(r.in[0]);
                  const float* dy = f32_in(r.in[1]);
                  F32Out dx(r.out[0], r.node->accumulate);
                  if (sync_bn(env)) return sync_bn_backward(r, env, x, dy, dx.get(), r.node->accumulate);
                  cpu::batchnorm_backward(x, dy, r.in[0].shape, r.in[2].as<const float>(), r.in[3].as<const float>(),
                                          r.in[4].as<const float>(), dx.get(), r.out[1].as<float>(),
                                          r.out[2].as<float>(), r.node->accumulate, true);
                }));
  auto unary = [&t](OpKind fwd, OpKind bwd, void (*f)(const float*, float*, std::int64_t),
                    void (*b)(const float*, const float*, float*, std::int64_t, bool)) {
    t.add_compute(fwd, op([f](const ResolvedNode& r, ExecEnv&) {
                    const float* x = f32_in(r.in[0]);
                    F32Out y(r.out[0], false);
                    f(x, y.get(), r.out[0].elems());
                  }));
    t.add_compute(bwd, op([b](const ResolvedNode& r, ExecEnv&) {
                    const float* y = f32_in(r.in[0]);
                    const float* dy = f32_in(r.in[1]);
                    F32Out dx(r.out[0], r.node->accumulate);
                    b(y, dy, dx.get(), r.out[0].elems(), r.node->accumulate);
                  }));
  };
  unary(OpKind::RELU_FWD, OpKind::RELU_BWD, cpu::relu_forward, cpu::relu_backward);
  unary(OpKind::TANH_FWD, OpKind::TANH_BWD, cpu::tanh_forward, cpu::tanh_backward);
  for (const ops::Activation a : ops::kActivations) {  // ops/activations.h: the backward reads x
    t.add_compute(plan::activation_op(a, false), op([a](const ResolvedNode& r, ExecEnv&) {
                    const float* x = f32_in(r.in[0]);
                    F32Out y(r.out[0], false);
                    cpu::activation_forward(a, x, y.get(), r.out[0].elems());
                  }));
    t.add_compute(plan::activation_op(a, true), op([a](const ResolvedNode& r, ExecEnv&) {
                    const float* x = f32_in(r.in[0]);
                    const float* dy = f32_in(r.in[1]);
                    F32Out dx(r.out[0], r.node->accumulate);
                    cpu::activation_backward(a, x, dy, dx.get(), r.out[0].elems(), r.node->accumulate);
                  }));
  }
  t.add_compute(OpKind::MAXPOOL_FWD, op([](const ResolvedNode& r, ExecEnv&) {
                  using O = ops::MaxPoolFwd;
                  const float* x = f32_in(r.in[O::kX]);
                  F32Out y(r.out[O::kY], false);
                  cpu::maxpool2d_forward(x, r.in[O::kX].shape, y.get(), r.out[O::kY].shape, pool_params(*r.node),
                                         r.out[O::kArgmax].as<std::uint8_t>());
                }));
  t.add_compute(OpKind::MAXPOOL_BWD, op([](const ResolvedNode& r, ExecEnv&) {
                  using O = ops::MaxPoolBwd;
                  const float* dy = f32_in(r.in[O::kDy]);
                  F32Out dx(r.out[O::kDx], r.node->accumulate);
                  cpu::maxpool2d_backward(dy, r.in[O::kDy].shape, nullptr, r.in[O::kArgmax].as<const std::uint8_t>(),
                                          dx.get(), r.out[O::kDx].shape, pool_params(*r.node), r.node->accumulate);
                }));
  t.add_compute(OpKind::GAP_FWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* x = f32_in(r.in[0]);
                  F32Out y(r.out[0], false);
                  cpu::global_avgpool_forward(x, r.in[0].shape, y.get());
                }));
  t.add_compute(OpKind::GAP_BWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* dy = f32_in(r.in[0]);
                  F32Out dx(r.out[0], r.node->accumulate);
                  cpu::global_avgpool_backward(dy, dx.get(), r.out[0].shape, r.node->accumulate);
                }));
  auto copy_like = [](const ResolvedNode& r, bool acc) {
    const float* x = f32_in(r.in[0]);
    F32Out y(r.out[0], acc);
    RN_CHECK(r.in[0].elems() == r.out[0].elems(), "copy between tensors of {} and {} elements", r.in[0].elems(),
             r.out[0].elems());
    if (acc)
      add_into(y.get(), x, r.out[0].elems());
    else
      std::memcpy(y.get(), x, static_cast<std::size_t>(r.out[0].elems()) * 4);
  };
  t.add_compute(OpKind::FLATTEN_FWD, op([copy_like](const ResolvedNode& r, ExecEnv&) { copy_like(r, false); }));
  t.add_compute(OpKind::FLATTEN_BWD,
                op([copy_like](const ResolvedNode& r, ExecEnv&) { copy_like(r, r.node->accumulate); }));
  t.add_compute(OpKind::ACCUMULATE, op([copy_like](const ResolvedNode& r, ExecEnv&) { copy_like(r, true); }));
  t.add_compute(OpKind::COPY, op([](const ResolvedNode& r, ExecEnv&) {
                  RN_CHECK(r.in[0].dtype == r.out[0].dtype && r.in[0].elems() <= r.out[0].elems(),
                           "COPY between incompatible tensors");
                  std::memcpy(r.out[0].ptr, r.in[0].ptr,
                              static_cast<std::size_t>(r.in[0].elems()) * dtype_size(r.in[0].dtype));
                }));
  t.add_compute(OpKind::FC_FWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* x = f32_in(r.in[0]);
                  const float* w = f32_in(r.in[1]);
                  const float* b = f32_in(r.in[2]);
                  F32Out y(r.out[0], false);
                  cpu::fc_forward(x, r.in[0].shape.n, r.in[0].shape.per_sample(), w, b, y.get(), r.out[0].shape.c);
                }));
  t.add_compute(OpKind::FC_BWD_DATA, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* dy = f32_in(r.in[0]);
                  const float* w = f32_in(r.in[1]);
                  F32Out dx(r.out[0], r.node->accumulate);
                  cpu::fc_backward_data(dy, r.in[0].shape.n, r.in[0].shape.c, w, dx.get(), r.out[0].shape.per_sample(),
                                        r.node->accumulate);
                }));
  t.add_compute(OpKind::FC_BWD_WEIGHT, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* x = f32_in(r.in[0]);
                  const float* dy = f32_in(r.in[1]);
                  F32Out dw(r.out[0], r.node->accumulate);
                  cpu::fc_backward_weights(x, dy, r.in[0].shape.n, r.in[0].shape.per_sample(), r.in[1].shape.c,
                                           dw.get(), r.out[1].as<float>(), r.node->accumulate);
                }));
  t.add_compute(OpKind::SOFTMAX_CE_FWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* logits = f32_in(r.in[0]);
                  const float* h = hyper_of(r.in[2]);
                  const Shape& s = r.in[0].shape;
                  const float loss = cpu::softmax_ce_forward(logits, r.in[1].as<const std::int32_t>(), s.n,
                                                             s.per_sample(), h[plan::kHyperLabelSmoothing],
                                                             r.out[0].as<float>());
                  r.out[1].as<float>()[plan::kResultLoss] = loss * static_cast<float>(s.n);
                }));
  t.add_compute(OpKind::SOFTMAX_CE_BWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* h = hyper_of(r.in[2]);
                  const float scale = r.in[3].as<const float>()[plan::kLossScale];
                  const Shape& s = r.in[0].shape;
                  F32Out dx(r.out[0], r.node->accumulate);
                  cpu::softmax_ce_backward(r.in[0].as<const float>(), r.in[1].as<const std::int32_t>(), s.n, s.c,
                                           h[plan::kHyperLabelSmoothing], scale, dx.get(), r.node->accumulate);
                }));
  t.add_compute(OpKind::CHANNEL_PAD_FWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* x = f32_in(r.in[0]);
                  F32Out y(r.out[0], false);
                  const Shape& s = r.in[0].shape;
                  cpu::channel_pad_forward(x, s.n * s.h * s.w, s.c, r.out[0].shape.c, y.get());
                }));
  t.add_compute(OpKind::CHANNEL_PAD_BWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* dy = f32_in(r.in[0]);
                  F32Out dx(r.out[0], r.node->accumulate);
                  const Shape& s = r.out[0].shape;
                  cpu::channel_pad_backward(dy, s.n * s.h * s.w, r.in[0].shape.c, s.c, dx.get(), r.node->accumulate);
                }));
  t.add_compute(OpKind::ADD2_FWD, op([](const ResolvedNode& r, ExecEnv&) {
                  const float* a = f32_in(r.in[0]);
                  const float* b = f32_in(r.in[1]);
                  F32Out y(r.out[0], false);
                  cpu::add2_forward(a, b, y.get(), r.out[0].elems());
                }));
  t.add_compute(OpKind::METRICS, op([](const ResolvedNode& r, ExecEnv&) {
                  // result.step = {loss sum, top-1, top-5, samples} of this batch (plain cross-entropy of the
                  // logits, smoothing included as in training), and the arg-max predictions.
                  const float* logits = f32_in(r.in[0]);
                  const Shape& s = r.in[0].shape;
                  float* result = r.out[0].as<float>();
                  std::fill(result, result + plan::kResultSlots, 0.0f);
                  cpu::accumulate_metrics(logits, r.in[1].as<const std::int32_t>(), s.n, s.per_sample(), 0.0f, result,
                                          r.out[1].as<std::int32_t>());
                }));
  // Fused kinds (and the CPU's own groups of plain nodes, pair_plain_convs): the parts in order, the compiler's fused
  // passes in place of the parts they replace.
  for (OpKind k : {OpKind::FUSED_FWD, OpKind::FUSED_BWD, OpKind::FUSED_INFER}) t.add_compute(k, run_fused, prepare_fused);
}

// ---- RANGE ops -----------------------------------------------------------------------------------------

std::int64_t floats(const RangeView& r) { return r.bytes / 4; }
const cpu::OptimizerScalars* scalars(const ResolvedNode& r) {
  return reinterpret_cast<const cpu::OptimizerScalars*>(r.in[0].ptr);
}
const std::int32_t* skip_flag(const ResolvedNode& r) { return r.in[1].as<const std::int32_t>(); }

void register_range(KernelTable& t) {
  t.add_range(RangeOp::H2D_COPY, [](const ResolvedNode& r, ExecEnv& env) {
    const RangeView& dst = r.out_ranges[0];
    const int buffer = dst.range.first == Region::I_A_LABEL ? 0 : 1;
    RN_CHECK(env.host_input[buffer] != nullptr, "TRANSFER_{}: no host input buffer", buffer == 0 ? 'A' : 'B');
    std::memcpy(dst.ptr, env.host_input[buffer], static_cast<std::size_t>(dst.bytes));
  });
  t.add_range(RangeOp::CLEAR, [](const ResolvedNode& r, ExecEnv&) {
    for (const RangeView& o : r.out_ranges) cpu::range_clear(o.ptr, static_cast<std::size_t>(o.bytes));
  });
  auto copy = [](const ResolvedNode& r, ExecEnv&) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "D2D copy between ranges of different sizes");
    cpu::range_copy(r.out_ranges[0].ptr, r.in_ranges[0].ptr, static_cast<std::size_t>(r.in_ranges[0].bytes));
  };
  t.add_range(RangeOp::D2D_COPY, copy);
  t.add_range(RangeOp::EMA_SWITCH, copy);
  t.add_range(RangeOp::CAST_F32_TO_F16, [](const ResolvedNode& r, ExecEnv&) {
    RN_CHECK(r.in_ranges[0].bytes == 2 * r.out_ranges[0].bytes, "FP32 → FP16 cast ranges are not 2:1");
    cpu::range_cast_f32_to_f16(reinterpret_cast<const float*>(r.in_ranges[0].ptr),
                               reinterpret_cast<std::uint16_t*>(r.out_ranges[0].ptr), r.out_ranges[0].bytes / 2);
  });
  t.add_range(RangeOp::CAST_F16_TO_F32, [](const ResolvedNode& r, ExecEnv&) {
    RN_CHECK(2 * r.in_ranges[0].bytes == r.out_ranges[0].bytes, "FP16 → FP32 cast ranges are not 1:2");
    cpu::range_cast_f16_to_f32(reinterpret_cast<const std::uint16_t*>(r.in_ranges[0].ptr),
                               reinterpret_cast<float*>(r.out_ranges[0].ptr), r.in_ranges[0].bytes / 2);
  });
  auto f = [](const RangeView& v) { return reinterpret_cast<float*>(v.ptr); };
  t.add_range(RangeOp::SGD_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    cpu::sgd_update(f(r.in_ranges[0]), f(r.in_ranges[1]), floats(r.in_ranges[0]), scalars(r),
                    r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::MOMENTUM_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    cpu::momentum_update(f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), floats(r.in_ranges[0]), scalars(r),
                         r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::NESTEROV_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    cpu::nesterov_update(f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), floats(r.in_ranges[0]), scalars(r),
                         r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::ADAM_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    cpu::adam_update(f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), f(r.in_ranges[3]),
                     floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::ADAMW_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    cpu::adamw_update(f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), f(r.in_ranges[3]),
                      floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::LARS_NORMS, [f](const ResolvedNode& r, ExecEnv&) {
    // ‖w‖ and ‖g‖ of every weight tensor into its N_* slot (for inspection; LARS_UPDATE recomputes them
    // in the same order, so the update does not depend on this node).
    const RangeView& w = r.in_ranges[0];
    const RangeView& g = r.in_ranges[1];
    const RangeView& nr = r.out_ranges[0];
    RN_CHECK(w.segments.size() == nr.segments.size(), "LARS: {} weights but {} norm slots", w.segments.size(),
             nr.segments.size());
    for (std::size_t i = 0; i < w.segments.size(); ++i) {
      const float* wp = f(w) + w.segments[i].offset / 4;
      const float* gp = f(g) + g.segments[i].offset / 4;
      double sw = 0, sg = 0;
      for (std::int64_t k = 0; k < w.segments[i].elems; ++k) {
        sw += static_cast<double>(wp[k]) * wp[k];
        sg += static_cast<double>(gp[k]) * gp[k];
      }
      float* out = f(nr) + nr.segments[i].offset / 4;
      out[0] = static_cast<float>(std::sqrt(sw));
      out[1] = static_cast<float>(std::sqrt(sg));
    }
  });
  t.add_range(
      RangeOp::LARS_UPDATE,
      [f](const ResolvedNode& r, ExecEnv&) {
        const auto& segs = *static_cast<const std::vector<cpu::LarsSegment>*>(r.state.get());
        cpu::lars_update(f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), segs.data(), segs.size(),
                         scalars(r), r.node->apply_weight_decay, skip_flag(r));
      },
      [](ResolvedNode& r, ExecEnv&) {  // the per-tensor segments, once, not every step
        auto segs = std::make_shared<std::vector<cpu::LarsSegment>>();
        for (const Segment& s : r.in_ranges[0].segments) segs->push_back({s.offset / 4, s.elems});
        r.state = segs;
      });
  t.add_range(RangeOp::EMA_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    if (*skip_flag(r) != 0) return;  // a skipped step leaves the EMA alone too
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "EMA range differs from the master range");
    cpu::range_ema_update(f(r.out_ranges[0]), f(r.in_ranges[0]), floats(r.in_ranges[0]),
                          r.in[0].as<const float>()[plan::kHyperEmaDecay]);
  });
  auto allreduce = [f](const ResolvedNode& r, ExecEnv& env, bool mean) {
    if (!env.comm || env.comm->world_size() == 1) return;
    for (const RangeView& v : r.out_ranges) {
      env.comm->allreduce_sum(f(v), floats(v));
      if (mean) cpu::range_scale(f(v), floats(v), 1.0f / static_cast<float>(env.comm->world_size()));
    }
  };
  t.add_range(RangeOp::ALLREDUCE_MEAN, [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, true); });
  t.add_range(RangeOp::ALLREDUCE_SUM, [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, false); });
  // Running statistics use the mean over ranks of the per-rank batch statistics.
  t.add_range(RangeOp::BN_STATS_ALLREDUCE,
              [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, true); });
  t.add_range(RangeOp::BN_RUNNING_UPDATE, [f](const ResolvedNode& r, ExecEnv&) {
    // A skipped step (non-finite gradients, e.g. an FP16 forward overflow) leaves the running statistics alone too:
    // its batch statistics are as untrustworthy as its gradients.
    if (*skip_flag(r) != 0) return;
    const float m = r.in[0].as<const float>()[plan::kHyperBnMomentum];
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "BN running/batch statistics ranges differ");
    float* prev = f(r.out_ranges[0]);
    const float* next = f(r.in_ranges[0]);
    for (std::int64_t i = 0, n = floats(r.out_ranges[0]); i < n; ++i) prev[i] = (1.0f - m) * prev[i] + m * next[i];
  });
  t.add_range(RangeOp::NAN_CHECK, [f](const ResolvedNode& r, ExecEnv&) {
    std::int32_t* flag = r.in[0].as<std::int32_t>();
    *flag = 0;
    for (const RangeView& v : r.in_ranges) cpu::range_check_finite(f(v), floats(v), flag);
  });
  t.add_range(RangeOp::GRAD_SCALE, [f](const ResolvedNode& r, ExecEnv&) {
    if (*r.in[1].as<const std::int32_t>() != 0) return;
    const float scale = r.in[0].as<const float>()[plan::kLossScale];
    for (const RangeView& v : r.out_ranges) cpu::range_scale(f(v), floats(v), 1.0f / scale);
  });
  t.add_range(RangeOp::LOSS_SCALE_UPDATE, [](const ResolvedNode& r, ExecEnv&) {
    // Dynamic loss scaling: an overflow halves the scale (the step was skipped); `interval` clean steps double it. An
    // overflow at the lowest scale (1) marks the clean-step count -1: the host calls the run diverged (no scale can
    // make that step fit FP16).
    float* s = r.in[0].as<float>();
    if (*r.in[1].as<const std::int32_t>() != 0) {
      const bool at_floor = s[plan::kLossScale] <= 1.0f;
      s[plan::kLossScale] = std::max(1.0f, s[plan::kLossScale] / s[plan::kLossScaleFactor]);
      s[plan::kLossScaleCleanSteps] = at_floor ? -1.0f : 0.0f;
    } else if ((s[plan::kLossScaleCleanSteps] = std::max(0.0f, s[plan::kLossScaleCleanSteps]) + 1.0f) >=
               s[plan::kLossScaleInterval]) {
      s[plan::kLossScale] = std::min(65536.0f * 256.0f, s[plan::kLossScale] * s[plan::kLossScaleFactor]);
      s[plan::kLossScaleCleanSteps] = 0.0f;
    }
  });
  t.add_range(RangeOp::METRIC_ACCUMULATE, [f](const ResolvedNode& r, ExecEnv&) {
    add_into(f(r.out_ranges[0]), f(r.in_ranges[0]), plan::kResultSlots);
  });
}

}  // namespace

void register_cpu_ops(KernelTable& t) {
  t.backend = Backend::CPU;
  register_compute(t);
  register_range(t);
  t.set_fuse_graph(pair_plain_convs);
}

}  // namespace renaissance::runtime
