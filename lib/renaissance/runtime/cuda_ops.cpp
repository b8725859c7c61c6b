// The CUDA backend's kernel table: each entry adapts one plan node to the CUDA kernels in kernels/cuda.
// Every `run` only launches on env.stream (no allocation, no synchronisation, no host reads), so it can be
// captured into a CUDA graph; descriptors, algorithm choices and LARS tables are made in `prepare`.
#include <renaissance/core/error.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/collectives.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/memory_guard.h>

#include <kernels/cuda/batchnorm.h>
#include <kernels/cuda/common.h>
#include <kernels/cuda/conv.h>
#include <kernels/cuda/dnn_handles.h>
#include <kernels/cuda/elementwise.h>
#include <kernels/cuda/fc.h>
#include <kernels/cuda/metrics.h>
#include <kernels/cuda/optimizer.h>
#include <kernels/cuda/pooling.h>
#include <renaissance/ops/pool.h>
#include <kernels/cuda/range_ops.h>
#include <kernels/cuda/runtime_api.h>
#include <kernels/cuda/softmax_ce.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace renaissance::runtime {

using plan::OpKind;
using plan::RangeOp;

namespace {

/// What the CUDA ops share besides the stream: the library handles and a device error counter.
struct CudaEnv {
  cuda::DnnHandles* dnn = nullptr;
  cuda::DnnHandles* wgrad_dnn = nullptr;  ///< the weight-gradient convolutions' own cuDNN handle (their stream's)
  std::int32_t* label_errors = nullptr;   ///< labels outside [0, classes) seen on the device
};

CudaEnv& cenv(const ExecEnv& env) { return *static_cast<CudaEnv*>(env.dnn); }
cudaStream_t stream_of(const ExecEnv& env) { return static_cast<cudaStream_t>(env.stream); }

cuda::TensorRef ref(const TensorView& v) {
  cuda::TensorRef r;
  r.ptr = v.ptr;
  r.shape = v.shape;
  r.dtype = v.dtype;
  r.c_stride = v.strides[2];
  return r;
}

cuda::Workspace workspace(const ExecEnv& env) { return cuda::Workspace{env.workspace, static_cast<std::size_t>(env.workspace_bytes)}; }

template <typename T>
T* state_of(const ResolvedNode& r) {
  return static_cast<T*>(r.state.get());
}

cuda::ConvParams conv_params(const plan::Node& n) {
  const plan::ConvParams& p = std::get<plan::ConvParams>(n.params);
  cuda::ConvParams c;
  c.kernel_h = c.kernel_w = static_cast<int>(p.k);
  c.stride_h = c.stride_w = static_cast<int>(p.stride);
  c.pad_h = c.pad_w = static_cast<int>(p.pad);
  c.groups = static_cast<int>(p.groups);
  return c;
}

cuda::Pool2dParams pool_params(const plan::Node& n) {
  const plan::PoolParams& p = std::get<plan::PoolParams>(n.params);
  cuda::Pool2dParams c;
  c.kernel_h = c.kernel_w = static_cast<int>(p.k);
  c.stride_h = c.stride_w = static_cast<int>(p.stride);
  c.pad_h = c.pad_w = static_cast<int>(p.pad);
  return c;
}

const char* pass_label(cuda::ConvPass p) {
  switch (p) {
    case cuda::ConvPass::Forward: return "fwd";
    case cuda::ConvPass::BackwardData: return "dgrad";
    case cuda::ConvPass::BackwardFilter: return "wgrad";
  }
  return "?";
}

/// A ConvOp for x → y and the one pass (and accumulate mode) this node runs, its engine chosen once: the graph API's
/// candidates (or the legacy fallback) timed on the node's own arena tensors, which hold nothing yet at start-up
/// (a pass writes only its own output). Deterministic mode falls back, with a warning, to a non-deterministic engine
/// when cuDNN has no deterministic one for a shape.
PrepareFn prepare_conv(int x_index_in, bool x_is_output, int y_index_in, bool y_is_output, cuda::ConvPass pass) {
  return [=](ResolvedNode& r, ExecEnv& env) {
    const TensorView& x = x_is_output ? r.out[static_cast<std::size_t>(x_index_in)] : r.in[static_cast<std::size_t>(x_index_in)];
    const TensorView& y = y_is_output ? r.out[static_cast<std::size_t>(y_index_in)] : r.in[static_cast<std::size_t>(y_index_in)];
    cuda::ConvSpec spec;
    spec.x = x.shape;
    spec.x_c_stride = x.strides[2];
    spec.y = y.shape;
    spec.y_c_stride = y.strides[2];
    spec.params = conv_params(*r.node);
    spec.dtype = x.dtype;
    auto op = std::make_shared<cuda::ConvOp>(spec);
    const auto ws = static_cast<std::size_t>(env.workspace_bytes);
    // The pass's own tensors: x (dx), w (dw), y (dy).
    cuda::ConvTensors t;
    t.x = x.ptr;
    t.y = y.ptr;
    t.w = pass == cuda::ConvPass::BackwardFilter ? r.out[0].ptr : r.in[1].ptr;
    // Weight-gradient convolutions may run on the second compute stream: they get that stream's handle.
    cuda::DnnHandles& handles =
        pass == cuda::ConvPass::BackwardFilter && cenv(env).wgrad_dnn ? *cenv(env).wgrad_dnn : *cenv(env).dnn;
    const bool acc = r.node->accumulate;
    auto choose = [&](bool deterministic) {
      cuda::ConvChoose how;
      how.deterministic = deterministic;
      how.engine = static_cast<cuda::ConvEngine>(env.conv_api);
      how.tensors = &t;
      op->choose(handles, env.workspace, ws, how, cuda::conv_pass_bit(pass, acc));
    };
    try {
      choose(env.deterministic);
    } catch (const Error& e) {
      if (!env.deterministic) throw;
      spdlog::warn("{}; using a non-deterministic engine for this layer", e.what());
      choose(false);
    }
    RN_CHECK(op->workspace_bytes() <= ws, "convolution needs a {} byte workspace but {} were allocated",
             op->workspace_bytes(), ws);
    // A fused layer holds several convolutions: the shapes tell them apart.
    const cuda::ConvParams& cp = spec.params;
    r.detail = fmt::format("{} {}{} {}x{}x{}>{} k{}s{}{} [{}]", r.layer.empty() ? "conv" : r.layer, pass_label(pass),
                           acc ? "+acc" : "", spec.x.h, spec.x.w, spec.x.c, spec.y.c, cp.kernel_h, cp.stride_h,
                           cp.groups > 1 ? fmt::format("g{}", cp.groups) : "", op->engine_label(pass, acc));
    r.state = op;
  };
}

/// An FcOp for x (N, in...) → y (N, 1, 1, out); its algorithm chosen once.
std::shared_ptr<cuda::FcOp> make_fc(const TensorView& x, const TensorView& y, ExecEnv& env) {
  cuda::FcSpec spec;
  spec.batch = x.shape.n;
  spec.in = x.shape.per_sample();
  spec.out = y.shape.c;
  spec.x_ld = x.shape.h * x.shape.w == 1 ? x.strides[2] : 0;
  spec.y_ld = y.strides[2];
  spec.dtype = x.dtype;
  auto op = std::make_shared<cuda::FcOp>(spec);
  op->choose(*cenv(env).dnn, static_cast<std::size_t>(env.workspace_bytes), env.deterministic);
  return op;
}

/// Checks at prepare time that a kernel's scratch fits the one workspace.
PrepareFn need_workspace(std::function<std::size_t(const ResolvedNode&)> bytes) {
  return [bytes](ResolvedNode& r, ExecEnv& env) {
    const std::size_t b = bytes(r);
    RN_CHECK(b <= static_cast<std::size_t>(env.workspace_bytes),
             "{} needs a {} byte workspace but {} were allocated (raise TrainOptions::workspace_mib)",
             plan::op_kind_name(r.node->op), b, env.workspace_bytes);
  };
}

const float* hyper_slot(const TensorView& hyper, int slot) { return hyper.as<const float>() + slot; }

// ---- fused layers ----------------------------------------------------------------------------------------
//
// A FUSED_* node carries its plain parts. At prepare time its sub-node list is matched, by tensor addresses, against
// the element-wise tails that fused kernels replace (DESIGN §11); everything else runs as its plain kernel:
//   BN → ReLU (in place)                 one apply pass writes relu(BN(x))
//   BN → ADD2(·, s) [→ ReLU] (in place)  one apply pass writes [relu](BN(x) + s)
//   ... where s is the output of an earlier BN of the same node that nothing else reads (the projection shortcut):
//                                        that BN only computes its statistics; its apply joins the pass above
//   RELU_BWD → BN_BWD (ReLU gradient read by nothing else)
//                                        the ReLU backward folds into both BN backward passes (mask recomputed from x)
// Every fused pass rounds where the parts store, so results equal the plain parts bit for bit.

struct FusedStep {
  enum Kind : std::uint8_t { kPlain, kStats, kApply, kBnReluBwd } kind = kPlain;
  int node = -1;         ///< the sub-node: the plain node, the BN (stats, apply) or the BN_BWD
  int relu = -1;         ///< apply: the RELU_FWD whose output is written (-1: no ReLU); bwd: the RELU_BWD
  int add = -1;          ///< apply: the ADD2_FWD (-1: none)
  int shortcut_bn = -1;  ///< apply: the BN whose apply is the shortcut (-1: the ADD2's other input as stored)
  std::string label;     ///< for the profiler
};
struct FusedProgram {
  std::vector<FusedStep> steps;
  /// The projection shortcut's steps [branch_begin, branch_end) (its conv and BN statistics) run on the branch
  /// stream beside the main branch, joined before step join_before (the apply that reads them). -1: none.
  int branch_begin = -1, branch_end = -1, join_before = -1;
  int branch_conv = -1;  ///< the sub-node of the shortcut's conv (prepared with the side streams' handles)
};

/// Bytes [begin, end) a tensor view occupies in the arena (its padded storage).
std::pair<const std::byte*, const std::byte*> extent(const TensorView& v) {
  const auto bytes = v.shape.n * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  return {v.ptr, v.ptr + bytes};
}
bool overlaps(const TensorView& a, const TensorView& b) {
  if (!a.ptr || !b.ptr) return false;
  const auto [a0, a1] = extent(a);
  const auto [b0, b1] = extent(b);
  return a0 < b1 && b0 < a1;
}
bool is_float_feature(const TensorView& v) { return v.dtype == DType::F32 || v.dtype == DType::F16; }

/// Does any sub-node other than those in `except` read (inputs) or, with `writes`, write (outputs) bytes of `v`,
/// among sub-nodes [from, to)?
bool touched_by_others(const std::vector<ResolvedNode>& sub, const TensorView& v, std::initializer_list<int> except,
                       bool reads, bool writes, std::size_t from = 0, std::size_t to = SIZE_MAX) {
  to = std::min(to, sub.size());
  for (std::size_t i = from; i < to; ++i) {
    if (std::find(except.begin(), except.end(), static_cast<int>(i)) != except.end()) continue;
    if (reads)
      for (const TensorView& t : sub[i].in)
        if (overlaps(t, v)) return true;
    if (writes)
      for (const TensorView& t : sub[i].out)
        if (overlaps(t, v)) return true;
  }
  return false;
}

/// Is the value in `v` read by a sub-node from `from` on, before a later node overwrites all of it? (The ReLU
/// gradient a fused backward never stores must have no other reader: at a block's final ReLU the shortcut reads it.)
bool read_later(const std::vector<ResolvedNode>& sub, const TensorView& v, int from) {
  const auto [v0, v1] = extent(v);
  for (std::size_t i = static_cast<std::size_t>(from); i < sub.size(); ++i) {
    for (const TensorView& t : sub[i].in)
      if (overlaps(t, v)) return true;
    for (const TensorView& t : sub[i].out) {
      if (!overlaps(t, v)) continue;
      if (sub[i].node->accumulate) return true;
      const auto [t0, t1] = extent(t);
      if (t0 <= v0 && v1 <= t1) return false;
    }
  }
  return false;
}

bool same(const TensorView& a, const TensorView& b) { return a.ptr == b.ptr && a.shape == b.shape && a.dtype == b.dtype; }

FusedProgram plan_fused(const ResolvedNode& r, bool fuse) {
  FusedProgram prog;
  const std::vector<ResolvedNode>& sub = r.sub;
  const auto n = static_cast<int>(sub.size());
  auto op = [&](int i) { return i >= 0 && i < n ? sub[static_cast<std::size_t>(i)].node->op : OpKind::COUNT; };
  auto at = [&](int i) -> const ResolvedNode& { return sub[static_cast<std::size_t>(i)]; };
  auto plain = [&](int i) {
    FusedStep s;
    s.node = i;
    s.label = plan::op_kind_name(op(i));
    return s;
  };
  // In-place ReLU on y at i (forward).
  auto relu_in_place = [&](int i, const TensorView& y) {
    return op(i) == OpKind::RELU_FWD && !at(i).node->accumulate && same(at(i).in[0], y) && same(at(i).out[0], y);
  };
  for (int i = 0; i < n; ++i) {
    const OpKind k = op(i);
    if (fuse && (k == OpKind::BN_FWD_TRAIN || k == OpKind::BN_FWD_INFER) && !at(i).node->accumulate &&
        is_float_feature(at(i).out[0])) {
      const TensorView& y = at(i).out[0];
      if (relu_in_place(i + 1, y)) {
        FusedStep s;
        s.kind = FusedStep::kApply;
        s.node = i;
        s.relu = i + 1;
        s.label = "FUSED:bn+relu";
        prog.steps.push_back(s);
        ++i;
        continue;
      }
      if (op(i + 1) == OpKind::ADD2_FWD && same(at(i + 1).out[0], y) &&
          (same(at(i + 1).in[0], y) || same(at(i + 1).in[1], y))) {
        const bool relu = relu_in_place(i + 2, y);  // none after an inverted residual's add
        FusedStep s;
        s.kind = FusedStep::kApply;
        s.node = i;
        s.add = i + 1;
        s.relu = relu ? i + 2 : -1;
        s.label = relu ? "FUSED:bn+add+relu" : "FUSED:bn+add";
        const TensorView& sc = same(at(i + 1).in[0], y) ? at(i + 1).in[1] : at(i + 1).in[0];
        // The shortcut is an earlier BN's output of the same kind, read by nothing but this ADD2, whose input
        // nothing overwrites in between: defer that BN's apply into this pass.
        for (int j = 0; j < i; ++j) {
          if (op(j) != k || !same(at(j).out[0], sc) || prog.steps.empty()) continue;
          auto it = std::find_if(prog.steps.begin(), prog.steps.end(),
                                 [&](const FusedStep& st) { return st.kind == FusedStep::kPlain && st.node == j; });
          if (it == prog.steps.end()) continue;
          if (touched_by_others(sub, sc, {j, i + 1}, true, false)) continue;
          if (touched_by_others(sub, at(j).in[0], {}, false, true, static_cast<std::size_t>(j) + 1,
                                static_cast<std::size_t>(i) + 2))
            continue;
          if (k == OpKind::BN_FWD_TRAIN) {
            it->kind = FusedStep::kStats;
            it->label = "FUSED:bn-stats";
          } else {
            prog.steps.erase(it);  // inference: the apply needs nothing computed earlier
          }
          s.shortcut_bn = j;
          s.label = relu ? "FUSED:bn+bn+add+relu" : "FUSED:bn+bn+add";
          break;
        }
        prog.steps.push_back(s);
        i += relu ? 2 : 1;
        continue;
      }
    }
    if (fuse && k == OpKind::RELU_BWD && op(i + 1) == OpKind::BN_BWD && !at(i).node->accumulate &&
        at(i + 1).in.size() > 5 && same(at(i + 1).in[1], at(i).out[0]) && !read_later(sub, at(i).out[0], i + 2)) {
      FusedStep s;
      s.kind = FusedStep::kBnReluBwd;
      s.node = i + 1;
      s.relu = i;
      s.label = "FUSED:relu+bn backward";
      prog.steps.push_back(s);
      ++i;
      continue;
    }
    prog.steps.push_back(plain(i));
  }
  return prog;
}

/// The sub-nodes a step reads and writes.
std::vector<int> nodes_of(const FusedStep& st) {
  std::vector<int> v{st.node};
  for (int k : {st.relu, st.add})
    if (k >= 0) v.push_back(k);
  return v;
}

/// Training forward of a residual block with a projection shortcut: its conv and BN statistics may run beside the
/// main branch when nothing the main branch does in between touches what they read or write (checked by address).
void plan_branch(const ResolvedNode& r, FusedProgram& prog) {
  const std::vector<ResolvedNode>& sub = r.sub;
  for (std::size_t a = 0; a < prog.steps.size(); ++a) {
    const FusedStep& apply = prog.steps[a];
    if (apply.kind != FusedStep::kApply || apply.shortcut_bn < 0) continue;
    const ResolvedNode& bn = sub[static_cast<std::size_t>(apply.shortcut_bn)];
    int stats = -1, conv = -1;
    for (std::size_t s = 0; s < a; ++s) {
      const FusedStep& st = prog.steps[s];
      if (st.kind == FusedStep::kStats && st.node == apply.shortcut_bn) stats = static_cast<int>(s);
      if (st.kind == FusedStep::kPlain && sub[static_cast<std::size_t>(st.node)].node->op == OpKind::CONV_FWD &&
          same(sub[static_cast<std::size_t>(st.node)].out[0], bn.in[0]))
        conv = static_cast<int>(s);
    }
    if (stats < 0 || conv < 0 || stats != conv + 1) continue;
    std::vector<const TensorView*> reads, writes;
    for (int s : {conv, stats})
      for (int k : nodes_of(prog.steps[static_cast<std::size_t>(s)])) {
        for (const TensorView& t : sub[static_cast<std::size_t>(k)].in) reads.push_back(&t);
        for (const TensorView& t : sub[static_cast<std::size_t>(k)].out) writes.push_back(&t);
      }
    writes.erase(std::remove_if(writes.begin(), writes.end(), [&](const TensorView* t) { return t->ptr == bn.out[0].ptr; }),
                 writes.end());  // the shortcut BN's output is never written (its apply is deferred)
    bool safe = true;
    for (std::size_t s = static_cast<std::size_t>(stats) + 1; s < a && safe; ++s)
      for (int k : nodes_of(prog.steps[s])) {
        const ResolvedNode& m = sub[static_cast<std::size_t>(k)];
        for (const TensorView& o : m.out)
          for (const auto* list : {&reads, &writes})
            for (const TensorView* t : *list) safe = safe && !overlaps(o, *t);
        for (const TensorView& i : m.in)
          for (const TensorView* t : writes) safe = safe && !overlaps(i, *t);
      }
    if (!safe) continue;
    prog.branch_begin = conv;
    prog.branch_end = stats + 1;
    prog.join_before = static_cast<int>(a);
    prog.branch_conv = prog.steps[static_cast<std::size_t>(conv)].node;
    return;
  }
}

cuda::BnApply bn_apply_of(const ResolvedNode& bn) {
  if (bn.node->op == OpKind::BN_FWD_TRAIN)
    return cuda::BnApply{ref(bn.in[0]), bn.in[1].as<const float>(), bn.in[2].as<const float>(),
                         bn.out[1].as<const float>(), bn.out[3].as<const float>(), nullptr};
  return cuda::BnApply{ref(bn.in[0]), bn.in[1].as<const float>(), bn.in[2].as<const float>(), bn.in[3].as<const float>(),
                       bn.in[4].as<const float>(), hyper_slot(bn.in[5], plan::kHyperBnEps)};
}

// ---- synchronised BatchNorm (--sync-bn, DESIGN §9) ------------------------------------------------------
// The statistics of the global batch: the BN kernels' per-channel sums are summed over the ranks by an ncclAllReduce
// on the launch's stream (the compute stream's communicator), so the capture of the step holds it. What each rank
// reduces and in which order: runtime/collectives.h (sync_bn_reductions), the same for every rank.

bool sync_bn_active(const ExecEnv& env) { return env.sync_bn && env.comm && env.comm->world_size() > 1; }

/// The SyncReduce of a BN node with input `x`, or nullptr without --sync-bn (or with one rank).
const cuda::SyncReduce* sync_of(const TensorView& x, ExecEnv& env, cuda::SyncReduce& storage) {
  if (!sync_bn_active(env)) return nullptr;
  Communicator* comm = env.comm;
  void* stream = env.stream;
  storage.sum = [comm, stream](float* data, std::int64_t count) {
    comm->allreduce_device_lane(kLaneCompute, data, count, false, stream);
  };
  storage.global_rows = sync_bn_global_rows(x, comm->world_size());
  return &storage;
}

std::size_t bn_workspace_bytes(const ResolvedNode& r, const ExecEnv& env) {
  return sync_bn_active(env) ? cuda::batchnorm_sync_workspace_bytes(ref(r.in[0]))
                             : cuda::batchnorm_workspace_bytes(ref(r.in[0]));
}

PrepareFn need_bn_workspace() {
  return [](ResolvedNode& r, ExecEnv& env) {
    const std::size_t b = bn_workspace_bytes(r, env);
    RN_CHECK(b <= static_cast<std::size_t>(env.workspace_bytes),
             "{} needs a {} byte workspace but {} were allocated (raise TrainOptions::workspace_mib)",
             plan::op_kind_name(r.node->op), b, env.workspace_bytes);
  };
}

void bn_statistics(const ResolvedNode& bn, ExecEnv& env) {
  cuda::SyncReduce sync;
  cuda::batchnorm_train_statistics(stream_of(env), ref(bn.in[0]), hyper_slot(bn.in[3], plan::kHyperBnEps),
                                   bn.out[1].as<float>(), bn.out[2].as<float>(), bn.out[3].as<float>(), env.workspace,
                                   static_cast<std::size_t>(env.workspace_bytes), sync_of(bn.in[0], env, sync));
}

void run_fused_step(const ResolvedNode& r, const FusedStep& st, ExecEnv& env) {
  const ResolvedNode& s = r.sub[static_cast<std::size_t>(st.node)];
  switch (st.kind) {
    case FusedStep::kPlain: KernelTable::for_backend(Backend::CUDA).compute(s.node->op)(s, env); return;
    case FusedStep::kStats: bn_statistics(s, env); return;
    case FusedStep::kApply: {
      const bool train = s.node->op == OpKind::BN_FWD_TRAIN;
      if (train) bn_statistics(s, env);
      cuda::Shortcut kind = cuda::Shortcut::kNone;
      TensorView shortcut;
      cuda::BnApply second;
      if (st.shortcut_bn >= 0) {
        kind = cuda::Shortcut::kBatchNorm;
        second = bn_apply_of(r.sub[static_cast<std::size_t>(st.shortcut_bn)]);
      } else if (st.add >= 0) {
        kind = cuda::Shortcut::kTensor;
        const ResolvedNode& add = r.sub[static_cast<std::size_t>(st.add)];
        shortcut = add.in[0].ptr == s.out[0].ptr ? add.in[1] : add.in[0];
      }
      cuda::batchnorm_apply_fused(stream_of(env), !train, bn_apply_of(s), kind, ref(shortcut),
                                  st.shortcut_bn >= 0 ? &second : nullptr, st.relu >= 0, ref(s.out[0]));
      return;
    }
    case FusedStep::kBnReluBwd: {
      const ResolvedNode& relu = r.sub[static_cast<std::size_t>(st.relu)];
      const cuda::ReluMask mask{s.in[4].as<const float>(), s.in[2].as<const float>(), s.in[5].as<const float>()};
      cuda::SyncReduce sync;
      cuda::batchnorm_relu_backward(stream_of(env), ref(s.in[0]), ref(relu.in[1]), s.in[2].as<const float>(),
                                    s.in[3].as<const float>(), s.in[4].as<const float>(), &mask, ref(s.out[0]),
                                    s.node->accumulate, s.out[1].as<float>(), s.out[2].as<float>(), env.workspace,
                                    static_cast<std::size_t>(env.workspace_bytes), sync_of(s.in[0], env, sync));
      return;
    }
  }
}

void run_fused(const ResolvedNode& r, ExecEnv& env) {
  const FusedProgram& prog = *state_of<FusedProgram>(r);
  const bool branch = prog.branch_begin >= 0 && env.streams && !env.timer;
  run_in_order(
      prog.steps.size(),
      [&](std::size_t i) -> const plan::Node* {
        const FusedStep& st = prog.steps[i];
        return st.kind == FusedStep::kPlain ? r.sub[static_cast<std::size_t>(st.node)].node : nullptr;
      },
      [&](std::size_t i) {
        const FusedStep& st = prog.steps[i];
        const auto at = static_cast<int>(i);
        if (branch && at == prog.join_before) env.streams->join(env, SideStream::kBranch);
        const bool on_branch = branch && at >= prog.branch_begin && at < prog.branch_end;
        if (on_branch && at == prog.branch_begin) env.streams->begin_side(env, SideStream::kBranch);
        try {
          if (env.timer)
            env.timer->begin(env, st.label,
                             st.kind == FusedStep::kPlain ? r.sub[static_cast<std::size_t>(st.node)].detail : std::string());
          run_fused_step(r, st, env);
          if (env.timer) env.timer->end(env);
        } catch (...) {
          if (on_branch) env.streams->end_side(env, SideStream::kBranch);
          throw;
        }
        if (on_branch && at == prog.branch_end - 1) env.streams->end_side(env, SideStream::kBranch);
      },
      env);
}

void prepare_fused(ResolvedNode& r, ExecEnv& env) {
  auto prog = std::make_shared<FusedProgram>(plan_fused(r, env.fuse_kernels));
  // --sync-bn: the shortcut's BN statistics hold an all-reduce of the compute stream's communicator; they stay on
  // the compute stream (one stream per communicator keeps every rank's collectives in one order).
  if (env.streams && r.node->op == OpKind::FUSED_FWD && !sync_bn_active(env)) {
    plan_branch(r, *prog);
    if (prog->branch_conv >= 0) {  // its conv runs on the branch stream: the side streams' cuDNN handle
      ExecEnv side = env;
      side.dnn = env.streams->side_dnn();
      prepare_conv(0, false, 0, true, cuda::ConvPass::Forward)(r.sub[static_cast<std::size_t>(prog->branch_conv)], side);
    }
  }
  // Workspaces: a fused step's batch norm works on the tensors of its BN_FWD_TRAIN / BN_BWD sub-node, whose own
  // prepare (run first) checked them against the workspace.
  r.state = prog;
}

// ---- COMPUTE ops ---------------------------------------------------------------------------------------

void register_compute(KernelTable& t) {
  t.add_compute(
      OpKind::CONV_FWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        const float* bias = r.in.size() > 2 ? r.in[2].as<const float>() : nullptr;
        state_of<cuda::ConvOp>(r)->forward(stream_of(env), ref(r.in[0]), r.in[1].ptr, bias, ref(r.out[0]), workspace(env));
      },
      prepare_conv(0, false, 0, true, cuda::ConvPass::Forward));
  t.add_compute(
      OpKind::CONV_BWD_DATA,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::ConvOp>(r)->backward_data(stream_of(env), ref(r.in[0]), r.in[1].ptr, ref(r.out[0]),
                                                 r.node->accumulate, workspace(env));
      },
      prepare_conv(0, true, 0, false, cuda::ConvPass::BackwardData));
  t.add_compute(
      OpKind::CONV_BWD_FILTER,
      [](const ResolvedNode& r, ExecEnv& env) {
        float* db = r.out.size() > 1 ? r.out[1].as<float>() : nullptr;
        state_of<cuda::ConvOp>(r)->backward_filter(stream_of(env), ref(r.in[0]), ref(r.in[1]), r.out[0].ptr, db,
                                                   r.node->accumulate, workspace(env));
      },
      prepare_conv(0, false, 1, false, cuda::ConvPass::BackwardFilter));
  t.add_compute(
      OpKind::BN_FWD_TRAIN,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::SyncReduce sync;
        cuda::batchnorm_forward_train(stream_of(env), ref(r.in[0]), r.in[1].as<const float>(), r.in[2].as<const float>(),
                                      hyper_slot(r.in[3], plan::kHyperBnEps), ref(r.out[0]), r.out[1].as<float>(),
                                      r.out[2].as<float>(), r.out[3].as<float>(), env.workspace,
                                      static_cast<std::size_t>(env.workspace_bytes), sync_of(r.in[0], env, sync));
      },
      need_bn_workspace());
  t.add_compute(OpKind::BN_FWD_INFER, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::batchnorm_forward_inference(stream_of(env), ref(r.in[0]), r.in[1].as<const float>(), r.in[2].as<const float>(),
                                      r.in[3].as<const float>(), r.in[4].as<const float>(),
                                      hyper_slot(r.in[5], plan::kHyperBnEps), ref(r.out[0]));
  });
  t.add_compute(
      OpKind::BN_BWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::SyncReduce sync;
        cuda::batchnorm_backward(stream_of(env), ref(r.in[0]), ref(r.in[1]), r.in[2].as<const float>(),
                                 r.in[3].as<const float>(), r.in[4].as<const float>(), ref(r.out[0]), r.node->accumulate,
                                 r.out[1].as<float>(), r.out[2].as<float>(), env.workspace,
                                 static_cast<std::size_t>(env.workspace_bytes), sync_of(r.in[0], env, sync));
      },
      need_bn_workspace());
  t.add_compute(OpKind::RELU_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::relu_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::RELU_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::relu_backward(stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::TANH_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tanh_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::TANH_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tanh_backward(stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]), r.node->accumulate);
  });
  for (const ops::Activation a : ops::kActivations) {  // ops/activations.h: the backward reads x
    t.add_compute(plan::activation_op(a, false), [a](const ResolvedNode& r, ExecEnv& env) {
      cuda::activation_forward(a, stream_of(env), ref(r.in[0]), ref(r.out[0]));
    });
    t.add_compute(plan::activation_op(a, true), [a](const ResolvedNode& r, ExecEnv& env) {
      cuda::activation_backward(a, stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]), r.node->accumulate);
    });
  }
  t.add_compute(OpKind::MAXPOOL_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    using O = ops::MaxPoolFwd;
    cuda::maxpool2d_forward(stream_of(env), ref(r.in[O::kX]), ref(r.out[O::kY]), ref(r.out[O::kArgmax]),
                            pool_params(*r.node));
  });
  t.add_compute(OpKind::MAXPOOL_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    using O = ops::MaxPoolBwd;
    cuda::maxpool2d_backward(stream_of(env), ref(r.in[O::kDy]), ref(r.in[O::kArgmax]), ref(r.out[O::kDx]),
                             pool_params(*r.node), r.node->accumulate);
  });
  t.add_compute(OpKind::GAP_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::global_avgpool_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::GAP_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::global_avgpool_backward(stream_of(env), ref(r.in[0]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::FLATTEN_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tensor_copy(stream_of(env), ref(r.in[0]), ref(r.out[0]), false);
  });
  t.add_compute(OpKind::FLATTEN_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tensor_copy(stream_of(env), ref(r.in[0]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::ACCUMULATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::accumulate(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::COPY, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in[0].dtype == r.out[0].dtype, "COPY between tensors of different dtypes");
    if (r.in[0].dtype == DType::I32 || r.in[0].dtype == DType::I8 || r.in[0].dtype == DType::U8)
      cuda::range_copy(stream_of(env), r.out[0].ptr, r.in[0].ptr,
                       static_cast<std::size_t>(r.in[0].elems()) * dtype_size(r.in[0].dtype));
    else
      cuda::tensor_copy(stream_of(env), ref(r.in[0]), ref(r.out[0]), false);
  });
  t.add_compute(
      OpKind::FC_FWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::FcOp>(r)->forward(stream_of(env), ref(r.in[0]), r.in[1].ptr, r.in[2].as<const float>(),
                                         ref(r.out[0]), workspace(env));
      },
      [](ResolvedNode& r, ExecEnv& env) { r.state = make_fc(r.in[0], r.out[0], env); });
  t.add_compute(
      OpKind::FC_BWD_DATA,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::FcOp>(r)->backward_data(stream_of(env), ref(r.in[0]), r.in[1].ptr, ref(r.out[0]),
                                               r.node->accumulate, workspace(env));
      },
      // x of this FC is dx (an output here), y is dy (input 0).
      [](ResolvedNode& r, ExecEnv& env) { r.state = make_fc(r.out[0], r.in[0], env); });
  t.add_compute(
      OpKind::FC_BWD_WEIGHT,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::FcOp>(r)->backward_weights(stream_of(env), ref(r.in[0]), ref(r.in[1]), r.out[0].ptr,
                                                  r.out[1].as<float>(), r.node->accumulate, workspace(env));
      },
      [](ResolvedNode& r, ExecEnv& env) { r.state = make_fc(r.in[0], r.in[1], env); });
  t.add_compute(
      OpKind::SOFTMAX_CE_FWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::softmax_ce_forward(stream_of(env), ref(r.in[0]), r.in[1].as<const std::int32_t>(),
                                 hyper_slot(r.in[2], plan::kHyperLabelSmoothing), ref(r.out[0]), r.out[1].as<float>(),
                                 env.workspace, static_cast<std::size_t>(env.workspace_bytes), cenv(env).label_errors);
      },
      need_workspace([](const ResolvedNode& r) { return cuda::softmax_ce_workspace_bytes(r.in[0].shape.n); }));
  t.add_compute(OpKind::SOFTMAX_CE_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::softmax_ce_backward(stream_of(env), ref(r.in[0]), r.in[1].as<const std::int32_t>(),
                              hyper_slot(r.in[2], plan::kHyperLabelSmoothing), r.in[3].as<const float>(), ref(r.out[0]),
                              r.node->accumulate, cenv(env).label_errors);
  });
  t.add_compute(OpKind::CHANNEL_PAD_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::channel_pad_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::CHANNEL_PAD_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::channel_pad_backward(stream_of(env), ref(r.in[0]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::ADD2_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::add2_forward(stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]));
  });
  t.add_compute(
      OpKind::METRICS,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::range_clear(stream_of(env), r.out[0].ptr, plan::kResultSlots * sizeof(float));
        cuda::batch_metrics(stream_of(env), ref(r.in[0]), r.in[1].as<const std::int32_t>(), 0.0f, r.out[0].as<float>(),
                            r.out[1].as<std::int32_t>(), env.workspace, static_cast<std::size_t>(env.workspace_bytes),
                            cenv(env).label_errors);
      },
      need_workspace([](const ResolvedNode& r) { return cuda::metrics_workspace_bytes(r.in[0].shape.n); }));
  for (OpKind k : {OpKind::FUSED_FWD, OpKind::FUSED_BWD, OpKind::FUSED_INFER})
    t.add_compute(k, run_fused, prepare_fused);
}

// ---- RANGE ops ------------------------------------------------------------------------------------------

float* f(const RangeView& v) { return reinterpret_cast<float*>(v.ptr); }
std::int64_t floats(const RangeView& v) { return v.bytes / 4; }
const cuda::OptimizerScalars* scalars(const ResolvedNode& r) {
  return reinterpret_cast<const cuda::OptimizerScalars*>(r.in[0].ptr);
}
const std::int32_t* skip_flag(const ResolvedNode& r) { return r.in[1].as<const std::int32_t>(); }

/// LARS tables of one weight range: segments (device), chunk count and the norm workspace, shared by the
/// LARS_NORMS and LARS_UPDATE nodes of every variant (same range, same tensors).
struct LarsState {
  cuda::LarsSegment* segments = nullptr;
  std::size_t count = 0;
  std::int64_t chunks = 0;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

LarsState& lars_state(const RangeView& w) {
  static std::mutex mu;
  static std::map<const std::byte*, LarsState> states;  // start-up only; the device buffers live as long as the process
  std::lock_guard<std::mutex> lock(mu);
  LarsState& s = states[w.ptr];
  if (s.segments) return s;
  std::vector<cuda::LarsSegment> host;
  for (const Segment& seg : w.segments) host.push_back({seg.offset / 4, seg.elems});
  s.count = host.size();
  s.chunks = cuda::lars_num_chunks(host.data(), host.size());
  const auto table_bytes = static_cast<std::int64_t>(std::max<std::size_t>(host.size(), 1) * sizeof(cuda::LarsSegment));
  s.segments = static_cast<cuda::LarsSegment*>(cuda::device_alloc(table_bytes, "the LARS segment table"));
  if (!host.empty()) cuda::copy_h2d(s.segments, host.data(), static_cast<std::int64_t>(host.size() * sizeof(cuda::LarsSegment)));
  s.workspace_bytes = std::max<std::size_t>(cuda::lars_workspace_bytes(s.chunks), 256);
  s.workspace = cuda::device_alloc(static_cast<std::int64_t>(s.workspace_bytes), "the LARS norm workspace");
  return s;
}

void register_range(KernelTable& t) {
  t.add_range(RangeOp::H2D_COPY, [](const ResolvedNode& r, ExecEnv& env) {
    const RangeView& dst = r.out_ranges[0];
    const int buffer = dst.range.first == Region::I_A_LABEL ? 0 : 1;
    RN_CHECK(env.host_input[buffer] != nullptr, "TRANSFER_{}: no host input buffer", buffer == 0 ? 'A' : 'B');
    cuda::copy_h2d_async(dst.ptr, env.host_input[buffer], dst.bytes, env.stream);
  });
  t.add_range(RangeOp::CLEAR, [](const ResolvedNode& r, ExecEnv& env) {
    for (const RangeView& o : r.out_ranges) cuda::range_clear(stream_of(env), o.ptr, static_cast<std::size_t>(o.bytes));
  });
  auto copy = [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "D2D copy between ranges of different sizes");
    cuda::range_copy(stream_of(env), r.out_ranges[0].ptr, r.in_ranges[0].ptr, static_cast<std::size_t>(r.in_ranges[0].bytes));
  };
  t.add_range(RangeOp::D2D_COPY, copy);
  t.add_range(RangeOp::EMA_SWITCH, copy);
  t.add_range(RangeOp::CAST_F32_TO_F16, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == 2 * r.out_ranges[0].bytes, "FP32 → FP16 cast ranges are not 2:1");
    cuda::range_cast_f32_to_f16(stream_of(env), f(r.in_ranges[0]), reinterpret_cast<std::uint16_t*>(r.out_ranges[0].ptr),
                                r.out_ranges[0].bytes / 2);
  });
  t.add_range(RangeOp::CAST_F16_TO_F32, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(2 * r.in_ranges[0].bytes == r.out_ranges[0].bytes, "FP16 → FP32 cast ranges are not 1:2");
    cuda::range_cast_f16_to_f32(stream_of(env), reinterpret_cast<const std::uint16_t*>(r.in_ranges[0].ptr),
                                f(r.out_ranges[0]), r.in_ranges[0].bytes / 2);
  });
  t.add_range(RangeOp::SGD_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::sgd_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), floats(r.in_ranges[0]), scalars(r),
                     r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::MOMENTUM_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::momentum_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), floats(r.in_ranges[0]),
                          scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::NESTEROV_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::nesterov_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), floats(r.in_ranges[0]),
                          scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::ADAM_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::adam_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), f(r.in_ranges[3]),
                      floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::ADAMW_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::adamw_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), f(r.in_ranges[3]),
                       floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  auto lars_prepare = [](ResolvedNode& r, ExecEnv&) { lars_state(r.in_ranges[0]); };
  t.add_range(
      RangeOp::LARS_NORMS,
      [](const ResolvedNode& r, ExecEnv& env) {
        LarsState& s = lars_state(r.in_ranges[0]);
        cuda::lars_norms(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), s.segments, s.count, s.chunks, s.workspace,
                         s.workspace_bytes);
      },
      lars_prepare);
  t.add_range(
      RangeOp::LARS_UPDATE,
      [](const ResolvedNode& r, ExecEnv& env) {
        LarsState& s = lars_state(r.in_ranges[0]);
        const RangeView& n = r.in_ranges[3];
        const std::int64_t stride = n.segments.size() > 1 ? (n.segments[1].offset - n.segments[0].offset) / 4 : 2;
        cuda::lars_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), s.segments, s.count,
                          s.chunks, scalars(r), r.node->apply_weight_decay, skip_flag(r), s.workspace,
                          s.workspace_bytes, f(n), stride);
      },
      lars_prepare);
  t.add_range(RangeOp::EMA_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "EMA range differs from the master range");
    cuda::range_ema_update(stream_of(env), f(r.out_ranges[0]), f(r.in_ranges[0]), floats(r.in_ranges[0]),
                           hyper_slot(r.in[0], plan::kHyperEmaDecay), skip_flag(r));
  });
  // One GPU: nothing to reduce. Several: the communicator (NCCL, lib/renaissance/comm) enqueues one all-reduce per
  // range on the compute stream, so the capture of DEEP_COMM/FIRST_COMM/... holds the collective (DESIGN §9).
  // Bucket 1 (DEEP_COMM, replayed on the side stream) goes through the side lane's communicator, everything else through
  // the compute stream's (runtime/collectives.h), so bucket 2 never queues behind bucket 1.
  auto allreduce = [](const ResolvedNode& r, ExecEnv& env, bool mean) {
    if (!env.comm || env.comm->world_size() == 1) return;
    const int lane = comm_lane(*r.node);
    for (const RangeView& v : r.out_ranges)
      if (floats(v) > 0) env.comm->allreduce_device_lane(lane, f(v), floats(v), mean, env.stream);
  };
  t.add_range(RangeOp::ALLREDUCE_MEAN, [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, true); });
  t.add_range(RangeOp::ALLREDUCE_SUM, [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, false); });
  // Running statistics use the mean over ranks of the per-rank batch statistics.
  t.add_range(RangeOp::BN_STATS_ALLREDUCE,
              [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, true); });
  t.add_range(RangeOp::BN_RUNNING_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "BN running/batch statistics ranges differ");
    cuda::range_bn_running_update(stream_of(env), f(r.out_ranges[0]), f(r.in_ranges[0]), floats(r.out_ranges[0]),
                                  hyper_slot(r.in[0], plan::kHyperBnMomentum));
  });
  t.add_range(RangeOp::NAN_CHECK, [](const ResolvedNode& r, ExecEnv& env) {
    std::int32_t* flag = r.in[0].as<std::int32_t>();
    cuda::range_clear(stream_of(env), flag, sizeof(std::int32_t));
    for (const RangeView& v : r.in_ranges) cuda::range_mark_nonfinite(stream_of(env), f(v), floats(v), flag);
  });
  t.add_range(RangeOp::GRAD_SCALE, [](const ResolvedNode& r, ExecEnv& env) {
    for (const RangeView& v : r.out_ranges)
      cuda::range_grad_scale(stream_of(env), f(v), floats(v), r.in[0].as<const float>() + plan::kLossScale,
                             r.in[1].as<const std::int32_t>());
  });
  t.add_range(RangeOp::LOSS_SCALE_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::loss_scale_update(stream_of(env), r.in[0].as<float>(), r.in[1].as<const std::int32_t>());
  });
  t.add_range(RangeOp::METRIC_ACCUMULATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::range_metric_accumulate(stream_of(env), f(r.out_ranges[0]), f(r.in_ranges[0]), plan::kResultSlots);
  });
}

/// The GPU session (DESIGN §7): the main compute stream with its handles and workspace; a second compute stream for
/// weight gradients (its own cuDNN handle and workspace); the transfer stream (input double buffering); the side
/// stream of the bucket-1 all-reduce; pinned staging.
class CudaSession : public BackendSession, public ComputeStreams {
 public:
  CudaSession(ExecEnv& env, std::int64_t workspace_bytes, bool concurrent) {
    m_stream = cuda::stream_create();
    m_env.dnn = &cuda::DnnHandles::for_device(cuda::current_device());
    m_env.dnn->set_stream(static_cast<cudaStream_t>(m_stream));
    m_env.label_errors = static_cast<std::int32_t*>(cuda::device_alloc(256, "the label error counter"));
    guard_device_memory({"the cuDNN/cuBLASLt workspace", 0, workspace_bytes * (concurrent ? 2 : 1), 0});
    m_workspace = static_cast<std::byte*>(cuda::device_alloc(workspace_bytes, "the cuDNN/cuBLASLt workspace"));
    if (concurrent) {
      for (auto& st : m_side_streams) st = cuda::stream_create();
      m_side_dnn = std::make_unique<cuda::DnnHandles>();
      m_env.wgrad_dnn = m_side_dnn.get();
      m_side_env = m_env;
      m_side_env.dnn = m_side_dnn.get();
      m_side_workspace =
          static_cast<std::byte*>(cuda::device_alloc(workspace_bytes, "the side compute streams' workspace"));
      for (auto& e : m_side_fork) e = cuda::event_create();
      for (auto& e : m_side_done) e = cuda::event_create();
      env.streams = this;
    }
    env.stream = m_stream;
    env.dnn = &m_env;
    env.workspace = m_workspace;
    env.workspace_bytes = workspace_bytes;
    m_transfer_stream = cuda::stream_create();
    m_transferred = cuda::event_create();
    for (auto& e : m_slot_done) e = cuda::event_create();
    m_comm_stream = cuda::stream_create();
    m_fork = cuda::event_create();
    m_joined = cuda::event_create();
    m_update_stream = cuda::stream_create();
    m_update_fork = cuda::event_create();
    m_update_done = cuda::event_create();
  }
  ~CudaSession() override {
    if (m_side_streams[0]) {
      for (std::size_t i = 0; i < 2; ++i) {
        cuda::stream_synchronize(m_side_streams[i]);
        cuda::event_destroy(m_side_fork[i]);
        cuda::event_destroy(m_side_done[i]);
        cuda::stream_destroy(m_side_streams[i]);
      }
      cuda::device_free(m_side_workspace);
    }
    cuda::stream_synchronize(m_update_stream);
    cuda::event_destroy(m_update_fork);
    cuda::event_destroy(m_update_done);
    cuda::stream_destroy(m_update_stream);
    cuda::stream_synchronize(m_transfer_stream);
    cuda::stream_synchronize(m_comm_stream);
    cuda::stream_synchronize(m_stream);
    cuda::event_destroy(m_fork);
    cuda::event_destroy(m_joined);
    cuda::stream_destroy(m_comm_stream);
    for (auto& e : m_slot_done) cuda::event_destroy(e);
    cuda::event_destroy(m_transferred);
    cuda::stream_destroy(m_transfer_stream);
    cuda::device_free(m_workspace);
    cuda::device_free(m_env.label_errors);
    cuda::stream_destroy(m_stream);
  }
  void synchronize() override { cuda::stream_synchronize(m_stream); }
  std::byte* host_alloc(std::int64_t bytes) override {
    auto* p = static_cast<std::byte*>(cuda::pinned_alloc(bytes));
    std::memset(p, 0, static_cast<std::size_t>(bytes));
    return p;
  }
  void host_free(std::byte* p) noexcept override { cuda::pinned_free(p); }

  void wait_slot(int s) override { cuda::event_synchronize(m_slot_done[s & 1]); }
  void transfer(ExecEnv& env, int s, const std::function<void()>& launch) override {
    // The copy into device buffer s waits for the compute work that last read it (the step two batches ago),
    // runs beside the current step on its own stream, and the next compute work waits for it.
    cuda::stream_wait_event(m_transfer_stream, m_slot_done[s & 1]);
    launch_on(env, m_transfer_stream, launch);
    cuda::event_record(m_transferred, m_transfer_stream);
    cuda::stream_wait_event(m_stream, m_transferred);
  }
  void upload_async(std::byte* dst, const std::byte* src, std::int64_t bytes) override {
    cuda::copy_h2d_async(dst, src, bytes, m_stream);
  }
  void release_slot(int s) override { cuda::event_record(m_slot_done[s & 1], m_stream); }
  void side(ExecEnv& env, const std::function<void()>& launch) override {
    cuda::event_record(m_fork, m_stream);
    cuda::stream_wait_event(m_comm_stream, m_fork);
    launch_on(env, m_comm_stream, launch);
    cuda::event_record(m_joined, m_comm_stream);
  }
  void join_side(ExecEnv& env) override { cuda::stream_wait_event(m_stream, m_joined); }
  void update(ExecEnv& env, const std::function<void()>& launch) override {
    cuda::event_record(m_update_fork, m_stream);
    cuda::stream_wait_event(m_update_stream, m_update_fork);
    launch_on(env, m_update_stream, launch);
    cuda::event_record(m_update_done, m_update_stream);
  }
  void join_update(ExecEnv& env) override { cuda::stream_wait_event(m_stream, m_update_done); }

  // ComputeStreams: the weight-gradient and branch streams.
  void begin_side(ExecEnv& env, SideStream s) override {
    const auto i = static_cast<std::size_t>(s);
    cuda::event_record(m_side_fork[i], env.stream);
    cuda::stream_wait_event(m_side_streams[i], m_side_fork[i]);
    m_main_stream_of_side = env.stream;
    env.stream = m_side_streams[i];
    env.workspace = m_side_workspace;
    env.dnn = &m_side_env;
  }
  void end_side(ExecEnv& env, SideStream s) override {
    const auto i = static_cast<std::size_t>(s);
    cuda::event_record(m_side_done[i], m_side_streams[i]);
    env.stream = m_main_stream_of_side;
    env.workspace = m_workspace;
    env.dnn = &m_env;
  }
  void join(ExecEnv& env, SideStream s) override {
    cuda::stream_wait_event(env.stream, m_side_done[static_cast<std::size_t>(s)]);
  }
  void* side_dnn() override { return &m_side_env; }

 private:
  /// Runs `launch` with env.stream = `s` (what every op launches on), back to the compute stream after.
  void launch_on(ExecEnv& env, cuda::StreamHandle s, const std::function<void()>& launch) {
    env.stream = s;
    try {
      launch();
    } catch (...) {
      env.stream = m_stream;
      throw;
    }
    env.stream = m_stream;
  }

  cuda::StreamHandle m_stream = nullptr;
  cuda::StreamHandle m_transfer_stream = nullptr;
  cuda::EventHandle m_transferred = nullptr;
  cuda::EventHandle m_slot_done[2] = {nullptr, nullptr};
  cuda::StreamHandle m_comm_stream = nullptr;  ///< bucket-1 all-reduce beside the first layer's backward
  cuda::EventHandle m_fork = nullptr, m_joined = nullptr;
  cuda::StreamHandle m_update_stream = nullptr;  ///< optimizer, casts and EMA beside the statistics and metrics
  cuda::EventHandle m_update_fork = nullptr, m_update_done = nullptr;
  CudaEnv m_env;
  std::byte* m_workspace = nullptr;
  // the side compute streams (SideStream order; null when not concurrent), sharing one workspace and handles
  cuda::StreamHandle m_side_streams[2] = {nullptr, nullptr};
  cuda::EventHandle m_side_fork[2] = {nullptr, nullptr}, m_side_done[2] = {nullptr, nullptr};
  cuda::StreamHandle m_main_stream_of_side = nullptr;  ///< the stream begin_side forked from (main or the comm side)
  std::unique_ptr<cuda::DnnHandles> m_side_dnn;
  CudaEnv m_side_env;
  std::byte* m_side_workspace = nullptr;
};

}  // namespace

void register_cuda_ops(KernelTable& t) {
  t.backend = Backend::CUDA;
  register_compute(t);
  register_range(t);
}

std::unique_ptr<BackendSession> open_cuda_backend(ExecEnv& env, std::int64_t workspace_bytes, bool concurrent) {
  return std::make_unique<CudaSession>(env, workspace_bytes, concurrent);
}

}  // namespace renaissance::runtime
