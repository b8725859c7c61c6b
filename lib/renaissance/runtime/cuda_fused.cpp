// The CUDA backend's fused layers: a FUSED_* node's planned passes and plain parts, run as one program (DESIGN §11).
#include <renaissance/plan/fusion.h>
#include <renaissance/runtime/cuda_adapters.h>
#include <renaissance/runtime/fused_match.h>

namespace renaissance::runtime::cuda_backend {

namespace {

using fused_match::overlaps;
using fused_match::same;

// ---- fused layers ----------------------------------------------------------------------------------------
//
// A FUSED_* node carries its plain parts and the fused passes the compiler planned over them (plan/fusion.cpp,
// ops/fused.h); everything else runs as its plain kernel:
//   BN → ReLU (in place)                 one apply pass writes relu(BN(x))
//   BN → ADD2(·, s) [→ ReLU] (in place)  one apply pass writes [relu](BN(x) + s)
//   ... where s is the output of an earlier BN of the same node that nothing else reads (the projection shortcut):
//                                        that BN only computes its statistics; its apply joins the pass above
//   RELU_BWD → BN_BWD (ReLU gradient read by nothing else)
//                                        the ReLU backward folds into both BN backward passes (mask recomputed from x)
//   ACCUMULATE → RELU_BWD [→ BN_BWD]     the residual sum's ReLU backward reads both addends (the sum is never
//                                        formed); with the BN backward after it, inside that BN's statistics pass
// Every fused pass rounds where the parts store, so results equal the plain parts bit for bit.

struct FusedStep {
  enum Kind : std::uint8_t { kPlain, kStats, kApply, kBnReluBwd, kAddReluBwd, kAddReluBnBwd } kind = kPlain;
  int node = -1;         ///< the sub-node: the plain node, the BN (stats, apply) or the BN_BWD
  int relu = -1;         ///< apply: the RELU_FWD whose output is written (-1: no ReLU); bwd: the RELU_BWD
  int add = -1;          ///< apply: the ADD2_FWD (-1: none)
  int shortcut_bn = -1;  ///< apply: the BN whose apply is the shortcut (-1: the ADD2's other input as stored)
  int pass = -1;         ///< the plan's fused pass (index into Node::fusions and ResolvedNode::pass_masks)
  /// A CONV_FWD step whose GEN_STATS epilogue writes the sums of the BN sub-node `stats_of` (ConvOp::forward_stats,
  /// --conv-stats on); -1: the plain forward.
  int stats_of = -1;
  bool from_sums = false;  ///< a statistics or apply step whose BN statistics are finalised from that conv's sums
  std::string label;       ///< for the profiler
};
struct FusedProgram {
  std::vector<FusedStep> steps;
  /// The projection shortcut's steps [branch_begin, branch_end) (its conv and BN statistics) run on the branch
  /// stream beside the main branch, joined before step join_before (the apply that reads them). -1: none.
  int branch_begin = -1, branch_end = -1, join_before = -1;
  int branch_conv = -1;  ///< the sub-node of the shortcut's conv (prepared with the side streams' handles)
};

/// The program of a fused node: the compiler's fused passes (plan::Node::fusions, plan/fusion.cpp) where it planned
/// them, the plain parts elsewhere; `fuse` false runs every part on its own (the plan's lifetimes allow both).
FusedProgram program_of(const ResolvedNode& r, bool fuse) {
  FusedProgram prog;
  const plan::Node& n = *r.node;
  RN_CHECK(n.sub.size() == r.sub.size(), "internal: a fused node resolved with {} of its {} parts", r.sub.size(),
           n.sub.size());
  const std::vector<int> step = fuse ? plan::fused_step_of(n) : std::vector<int>(n.sub.size(), -1);
  for (std::size_t k = 0; k < step.size(); ++k) {
    if (step[k] == -2) continue;  // a part of a pass that runs elsewhere
    FusedStep s;
    if (step[k] == -1) {
      s.node = static_cast<int>(k);
      s.label = plan::op_kind_name(n.sub[k].op);
      prog.steps.push_back(s);
      continue;
    }
    const plan::FusedPass& f = n.fusions[static_cast<std::size_t>(step[k])];
    if (f.fallback_only) continue;  // a copy only the plain parts read
    s.label = ops::fused_kind_label(f.kind);
    s.node = f.bn;
    s.relu = f.relu;
    s.pass = step[k];
    switch (f.kind) {
      case ops::FusedKind::BN_STATS: s.kind = FusedStep::kStats; break;
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
        s.shortcut_bn = f.shortcut_bn;  // ADD_RELU_BN_BN_BWD: the shortcut BN's backward joins the pass
        break;
      default:
        s.kind = FusedStep::kApply;
        s.add = f.add;
        s.shortcut_bn = f.shortcut_bn;
        break;
    }
    prog.steps.push_back(s);
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
    writes.erase(
        std::remove_if(writes.begin(), writes.end(), [&](const TensorView* t) { return t->ptr == bn.out[0].ptr; }),
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

}  // namespace

cuda::BnApply bn_apply_of(const ResolvedNode& bn) {
  if (bn.node->op == OpKind::BN_APPLY)  // x, gamma, beta, the forward's batch mean and invstd
    return cuda::BnApply{ref(bn.in[0]),          bn.in[1].as<const float>(), bn.in[2].as<const float>(),
                         bn.in[3].as<const float>(), bn.in[4].as<const float>(), nullptr};
  if (bn.node->op == OpKind::BN_FWD_TRAIN)
    return cuda::BnApply{ref(bn.in[0]),
                         bn.in[1].as<const float>(),
                         bn.in[2].as<const float>(),
                         bn.out[1].as<const float>(),
                         bn.out[3].as<const float>(),
                         nullptr};
  return cuda::BnApply{ref(bn.in[0]),
                       bn.in[1].as<const float>(),
                       bn.in[2].as<const float>(),
                       bn.in[3].as<const float>(),
                       bn.in[4].as<const float>(),
                       hyper_slot(bn.in[5], plan::kHyperBnEps)};
}

namespace {

void bn_statistics(const ResolvedNode& bn, ExecEnv& env) {
  cuda::SyncReduce sync;
  cuda::batchnorm_train_statistics(stream_of(env), ref(bn.in[0]), hyper_slot(bn.in[3], plan::kHyperBnEps),
                                   bn.out[1].as<float>(), bn.out[2].as<float>(), bn.out[3].as<float>(), env.workspace,
                                   static_cast<std::size_t>(env.workspace_bytes), sync_of(bn.in[0], env, sync));
}

/// The statistics of a training BN: its own kernel, or the finalize of the sums its conv's epilogue wrote into the
/// batch-mean and variance slots.
void bn_statistics_of(const FusedStep& st, const ResolvedNode& bn, ExecEnv& env) {
  if (!st.from_sums) {
    bn_statistics(bn, env);
    return;
  }
  const Shape& x = bn.in[0].shape;
  cuda::batchnorm_statistics_from_sums(stream_of(env), x.c, x.n * x.h * x.w, hyper_slot(bn.in[3], plan::kHyperBnEps),
                                       bn.out[1].as<float>(), bn.out[2].as<float>(), bn.out[3].as<float>());
}

void run_fused_step(const ResolvedNode& r, const FusedStep& st, ExecEnv& env) {
  const ResolvedNode& s = r.sub[static_cast<std::size_t>(st.node)];
  switch (st.kind) {
    case FusedStep::kPlain:
      if (st.stats_of >= 0) {  // the conv with its BN's sums in the epilogue
        const ResolvedNode& bn = r.sub[static_cast<std::size_t>(st.stats_of)];
        state_of<cuda::ConvOp>(s)->forward_stats(stream_of(env), ref(s.in[0]), s.in[1].ptr, ref(s.out[0]),
                                                 bn.out[1].as<float>(), bn.out[2].as<float>(), workspace(env));
        return;
      }
      KernelTable::for_backend(Backend::CUDA).compute(s.node->op)(s, env);
      return;
    case FusedStep::kStats: bn_statistics_of(st, s, env); return;
    case FusedStep::kApply: {
      const bool train = s.node->op == OpKind::BN_FWD_TRAIN || s.node->op == OpKind::BN_APPLY;
      if (s.node->op == OpKind::BN_FWD_TRAIN) bn_statistics_of(st, s, env);
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
                                  st.shortcut_bn >= 0 ? &second : nullptr, st.relu >= 0, ref(s.out[0]),
                                  r.pass_mask(st.pass).as<std::uint8_t>());
      return;
    }
    case FusedStep::kAddReluBwd: {  // RELU_BWD: y, dy -> dx; ACCUMULATE: addend -> dy (never formed)
      const ResolvedNode& acc = r.sub[static_cast<std::size_t>(st.add)];
      cuda::relu_backward_sum(stream_of(env), ref(s.in[0]), ref(s.in[1]), ref(acc.in[0]), ref(s.out[0]));
      return;
    }
    case FusedStep::kAddReluBnBwd: {  // ACCUMULATE: addend -> dy; RELU_BWD: y, dy -> g; BN_BWD: x, g, gamma, ...
      const ResolvedNode& relu = r.sub[static_cast<std::size_t>(st.relu)];
      const ResolvedNode& acc = r.sub[static_cast<std::size_t>(st.add)];
      cuda::ShortcutBnBackward second;  // ADD_RELU_BN_BN_BWD: BN_BWD inputs x', g, gamma, mean, invstd, beta
      if (st.shortcut_bn >= 0) {
        const ResolvedNode& b = r.sub[static_cast<std::size_t>(st.shortcut_bn)];
        second = cuda::ShortcutBnBackward{ref(b.in[0]),         b.in[2].as<const float>(), b.in[3].as<const float>(),
                                          b.in[4].as<const float>(), ref(b.out[0]),         b.out[1].as<float>(),
                                          b.out[2].as<float>()};
      }
      cuda::SyncReduce sync;
      cuda::batchnorm_add_relu_backward(stream_of(env), ref(relu.in[0]), ref(relu.in[1]), ref(acc.in[0]),
                                        ref(relu.out[0]), ref(s.in[0]), s.in[2].as<const float>(),
                                        s.in[3].as<const float>(), s.in[4].as<const float>(), ref(s.out[0]),
                                        s.node->accumulate, s.out[1].as<float>(), s.out[2].as<float>(), env.workspace,
                                        static_cast<std::size_t>(env.workspace_bytes), sync_of(s.in[0], env, sync),
                                        r.pass_mask(st.pass).as<std::uint8_t>(), st.shortcut_bn >= 0 ? &second : nullptr);
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

/// --conv-stats on (issue 15, conv + BN-statistics epilogue): a training BN whose input is the output of a conv step
/// of the same node, written by nothing in between, may take its statistics from that conv's GEN_STATS epilogue; the
/// ConvOp keeps the fused plan only where timing says it is faster than the plain forward + the statistics kernel
/// (ConvOp::choose_stats). Not with --sync-bn (the all-reduced sums are the own kernels'), not for a conv with bias.
void plan_conv_stats(ResolvedNode& r, FusedProgram& prog, ExecEnv& env) {
  for (std::size_t a = 0; a < prog.steps.size(); ++a) {
    FusedStep& st = prog.steps[a];
    if ((st.kind != FusedStep::kStats && st.kind != FusedStep::kApply) || st.node < 0) continue;
    const ResolvedNode& bn = r.sub[static_cast<std::size_t>(st.node)];
    if (bn.node->op != OpKind::BN_FWD_TRAIN) continue;
    int conv = -1;
    for (std::size_t c = 0; c < a; ++c) {
      const FusedStep& cs = prog.steps[c];
      if (cs.kind == FusedStep::kPlain && cs.stats_of < 0 &&
          r.sub[static_cast<std::size_t>(cs.node)].node->op == OpKind::CONV_FWD &&
          same(r.sub[static_cast<std::size_t>(cs.node)].out[0], bn.in[0]))
        conv = static_cast<int>(c);
    }
    if (conv < 0) continue;
    ResolvedNode& cv = r.sub[static_cast<std::size_t>(prog.steps[static_cast<std::size_t>(conv)].node)];
    if (cv.in.size() > 2 && cv.in[2].ptr != nullptr) continue;  // a bias is added after the convolution
    bool untouched = true;  // nothing between the conv and the statistics writes the conv's output
    for (std::size_t m = static_cast<std::size_t>(conv) + 1; m < a && untouched; ++m)
      for (int k : nodes_of(prog.steps[m]))
        for (const TensorView& o : r.sub[static_cast<std::size_t>(k)].out)
          untouched = untouched && !overlaps(o, bn.in[0]);
    if (!untouched) continue;
    auto* op = state_of<cuda::ConvOp>(cv);
    if (op == nullptr) continue;
    cuda::ConvChoose how;
    how.deterministic = env.deterministic;
    how.engine = static_cast<cuda::ConvEngine>(env.conv_api);
    const cuda::ConvTensors t{cv.in[0].ptr, cv.in[1].ptr, cv.out[0].ptr};
    ExecEnv setup = env;  // the timing runs on the legacy default stream
    setup.stream = nullptr;
    const bool used = op->choose_stats(env.workspace, static_cast<std::size_t>(env.workspace_bytes), how, t,
                                       bn.out[1].as<float>(), bn.out[2].as<float>(), [&] { bn_statistics(bn, setup); });
    spdlog::debug("{}: conv + BN statistics: {}", r.layer, op->stats_label());
    if (!used) continue;
    FusedStep& c = prog.steps[static_cast<std::size_t>(conv)];
    c.stats_of = st.node;
    c.label = "CONV_FWD+stats";
    cv.detail += " +stats";
    st.from_sums = true;
  }
}

}  // namespace

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
            env.timer->begin(
                env, st.label,
                st.kind == FusedStep::kPlain ? r.sub[static_cast<std::size_t>(st.node)].detail : std::string());
          debug_poison_workspace(st.label.c_str(), env);
          // RN_DEBUG_NODE_HASHES: each part's inputs and outputs too (which part of a fused node computed otherwise)
          const ResolvedNode* part = st.node >= 0 ? &r.sub[static_cast<std::size_t>(st.node)] : nullptr;
          const std::string where = env.node_hashes ? "  " + r.layer + "/" + st.label : std::string();
          if (part) debug_hash_node(where, i, *part, false, env);
          run_fused_step(r, st, env);
          if (env.node_hashes)
            for (const int k : {st.node, st.relu, st.add})
              if (k >= 0) debug_hash_node(where, i, r.sub[static_cast<std::size_t>(k)], true, env);
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
  auto prog = std::make_shared<FusedProgram>(program_of(r, env.fuse_kernels));
  // --sync-bn: the shortcut's BN statistics hold an all-reduce of the compute stream's communicator; they stay on
  // the compute stream (one stream per communicator keeps every rank's collectives in one order).
  if (env.streams && r.node->op == OpKind::FUSED_FWD && !sync_bn_active(env)) {
    plan_branch(r, *prog);
    if (prog->branch_conv >= 0) {  // its conv runs on the branch stream: the side streams' cuDNN handle
      ExecEnv side = env;
      side.dnn = env.streams->side_dnn();
      prepare_conv(0, false, 0, true, cuda::ConvPass::Forward)(r.sub[static_cast<std::size_t>(prog->branch_conv)],
                                                               side);
    }
  }
  if (env.conv_stats && env.fuse_kernels && r.node->op == OpKind::FUSED_FWD && !sync_bn_active(env))
    plan_conv_stats(r, *prog, env);
  // Workspaces: a fused step's batch norm works on the tensors of its BN_FWD_TRAIN / BN_BWD sub-node, whose own
  // prepare (run first) checked them against the workspace.
  r.state = prog;
}

}  // namespace renaissance::runtime::cuda_backend
