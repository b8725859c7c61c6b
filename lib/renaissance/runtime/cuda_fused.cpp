// The CUDA backend's fused layers: a FUSED_* node's parts matched against the fused kernels at prepare time, run as
// one program (DESIGN §11).
#include <renaissance/runtime/cuda_adapters.h>
#include <renaissance/runtime/fused_match.h>

namespace renaissance::runtime::cuda_backend {

namespace {

using fused_match::extent;
using fused_match::is_float_feature;
using fused_match::overlaps;
using fused_match::same;
using fused_match::touched_by_others;

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

cuda::BnApply bn_apply_of(const ResolvedNode& bn) {
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
      prepare_conv(0, false, 0, true, cuda::ConvPass::Forward)(r.sub[static_cast<std::size_t>(prog->branch_conv)],
                                                               side);
    }
  }
  // Workspaces: a fused step's batch norm works on the tensors of its BN_FWD_TRAIN / BN_BWD sub-node, whose own
  // prepare (run first) checked them against the workspace.
  r.state = prog;
}

}  // namespace renaissance::runtime::cuda_backend
