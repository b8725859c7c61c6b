// The compiler's fusion phase: the rules the runtimes' prepare-time address matchers used to apply, applied once by
// tensor id over each fused layer's plain parts (DESIGN §11). Ids are exact where addresses are not: a value and a
// later value that reuses its bytes are two ids, two views of one gradient buffer are two ids of one owner.
#include <renaissance/core/error.h>
#include <renaissance/plan/fusion.h>

#include <algorithm>
#include <map>

namespace renaissance::plan {

namespace {

using ops::FusedKind;

TensorId owner_of(const MemoryPlan& mp, TensorId id) { return mp.owner_of(id); }
std::int64_t elements(const MemoryPlan& mp, TensorId id) { return mp.tensor(id).shape.elems(); }
/// One tensor, or an in-place alias of it (a ReLU's output viewing its input's bytes) of the same shape and type.
bool same(const MemoryPlan& mp, TensorId a, TensorId b) {
  if (a == b) return true;
  if (a == kNoTensor || b == kNoTensor || owner_of(mp, a) != owner_of(mp, b)) return false;
  const DTensor &x = mp.tensor(a), &y = mp.tensor(b);
  return x.shape == y.shape && x.dtype == y.dtype;
}
bool is_float_feature(const MemoryPlan& mp, TensorId id) {
  const DType d = mp.tensor(id).dtype;
  return d == DType::F32 || d == DType::F16;
}

/// Reads and writes of the bytes of `v`'s owner by plain nodes, in order. `done` is set when a plain write of the
/// whole value ends its life; the result says whether something read it before.
struct LaterReads {
  const MemoryPlan& mp;
  TensorId owner;
  std::int64_t elems;
  bool done = false;

  bool node(const Node& n) {
    if (done) return false;
    if (!n.sub.empty()) {
      for (const Node& s : n.sub)
        if (node(s)) return true;
      return false;
    }
    if (n.type != NodeType::COMPUTE) return false;
    for (TensorId t : n.inputs)
      if (t != kNoTensor && owner_of(mp, t) == owner) return true;
    for (TensorId t : n.outputs) {
      if (t == kNoTensor || owner_of(mp, t) != owner) continue;
      if (n.accumulate || n.op == OpKind::ACCUMULATE) return true;
      if (elements(mp, t) >= elems) done = true;
    }
    return false;
  }
  void overwrite(const Node& writer) {
    for (TensorId t : writer.outputs)
      if (t != kNoTensor && owner_of(mp, t) == owner && !writer.accumulate && elements(mp, t) >= elems) done = true;
  }
};

/// Is the value of `v` read after sub-node `writer` (which consumes it, and whose writes count first) by the node's
/// later parts [from, end) or the rest of the bucket after the node, up to the last position touching its owner?
bool read_later(const MemoryPlan& mp, TensorId v, const std::vector<Node>& sub, std::size_t from, const Node* writer,
                const std::vector<Node>& bucket, std::size_t index, const std::vector<std::int64_t>& touches) {
  LaterReads r{mp, owner_of(mp, v), elements(mp, v)};
  if (writer) r.overwrite(*writer);
  for (std::size_t i = from; i < sub.size() && !r.done; ++i)
    if (r.node(sub[i])) return true;
  const std::int64_t last = r.owner >= 0 && static_cast<std::size_t>(r.owner) < touches.size()
                                ? touches[static_cast<std::size_t>(r.owner)]
                                : static_cast<std::int64_t>(bucket.size()) - 1;
  for (std::size_t i = index + 1; static_cast<std::int64_t>(i) <= last && i < bucket.size() && !r.done; ++i)
    if (r.node(bucket[i])) return true;
  return false;
}

void touch_all(const Node& n, const MemoryPlan& mp, std::int64_t at, std::vector<std::int64_t>& last) {
  for (const Node& s : n.sub) touch_all(s, mp, at, last);
  for (const std::vector<TensorId>* ids : {&n.inputs, &n.outputs})
    for (TensorId t : *ids) {
      const TensorId o = t == kNoTensor ? kNoTensor : owner_of(mp, t);
      if (o >= 0 && static_cast<std::size_t>(o) < last.size()) last[static_cast<std::size_t>(o)] = at;
    }
}

/// Does a node of sub[from, to) other than `except` read (or, with `writes`, write) bytes of `v`'s owner?
bool touched(const MemoryPlan& mp, TensorId v, const std::vector<Node>& sub, std::size_t from, std::size_t to,
             std::size_t except, bool writes) {
  const TensorId o = owner_of(mp, v);
  for (std::size_t i = from; i < std::min(to, sub.size()); ++i) {
    if (i == except) continue;
    for (TensorId t : writes ? sub[i].outputs : sub[i].inputs)
      if (t != kNoTensor && owner_of(mp, t) == o) return true;
  }
  return false;
}

void operand(std::vector<FusedOperand>& v, std::string name, TensorId id) {
  if (id != kNoTensor) v.push_back({std::move(name), id});
}

/// The operands of a BN apply (train: x, gamma, beta, hyper -> batch statistics; inference: running statistics).
void bn_apply_operands(FusedPass& p, const Node& bn, const std::string& prefix, bool writes_stats) {
  const bool train = bn.op == OpKind::BN_FWD_TRAIN;
  operand(p.inputs, prefix + "x", bn.inputs[0]);
  operand(p.inputs, prefix + "gamma", bn.inputs[1]);
  operand(p.inputs, prefix + "beta", bn.inputs[2]);
  if (train) {
    operand(p.inputs, prefix + "hyper", bn.inputs[3]);
    if (writes_stats) {
      operand(p.outputs, prefix + "batch_mean", bn.outputs[1]);
      operand(p.outputs, prefix + "batch_var", bn.outputs[2]);
      operand(p.outputs, prefix + "invstd", bn.outputs[3]);
      operand(p.saved, prefix + "batch_mean", bn.outputs[1]);
      operand(p.saved, prefix + "invstd", bn.outputs[3]);
    } else {  // the shortcut's statistics, from its BN_STATS pass
      operand(p.inputs, prefix + "batch_mean", bn.outputs[1]);
      operand(p.inputs, prefix + "invstd", bn.outputs[3]);
    }
  } else {
    operand(p.inputs, prefix + "running_mean", bn.inputs[3]);
    operand(p.inputs, prefix + "running_var", bn.inputs[4]);
    operand(p.inputs, prefix + "hyper", bn.inputs[5]);
  }
}

}  // namespace

std::vector<std::int64_t> last_touches(const std::vector<Node>& bucket, const MemoryPlan& mp) {
  std::vector<std::int64_t> last(mp.tensors().size(), -1);
  for (std::size_t i = 0; i < bucket.size(); ++i) touch_all(bucket[i], mp, static_cast<std::int64_t>(i), last);
  return last;
}

std::vector<FusedPass> decide_fusions(const std::vector<Node>& sub, const MemoryPlan& mp,
                                      const std::vector<Node>& bucket, std::size_t index, bool sum_into_bn,
                                      bool shortcut_bn_into_sum, const std::vector<std::int64_t>* touches_in) {
  std::vector<std::int64_t> own;
  if (!touches_in) own = last_touches(bucket, mp);
  const std::vector<std::int64_t>& touches = touches_in ? *touches_in : own;
  std::vector<FusedPass> out;
  const auto n = static_cast<int>(sub.size());
  std::vector<bool> covered(sub.size(), false);
  auto op = [&](int i) {
    return i >= 0 && i < n && sub[static_cast<std::size_t>(i)].type == NodeType::COMPUTE
               ? sub[static_cast<std::size_t>(i)].op
               : OpKind::COUNT;
  };
  auto at = [&](int i) -> const Node& { return sub[static_cast<std::size_t>(i)]; };
  // An in-place ReLU on y at i (forward).
  auto relu_in_place = [&](int i, TensorId y) {
    return op(i) == OpKind::RELU_FWD && !at(i).accumulate && same(mp, at(i).inputs[0], y) &&
           same(mp, at(i).outputs[0], y);
  };
  for (int i = 0; i < n; ++i) {
    if (covered[static_cast<std::size_t>(i)]) continue;
    const OpKind k = op(i);
    // A recomputed BN → ReLU output (plan/recompute.h): the apply with the saved statistics, the ReLU in place.
    if (k == OpKind::BN_APPLY && !at(i).accumulate && relu_in_place(i + 1, at(i).outputs[0]) &&
        owner_of(mp, at(i).inputs[0]) != owner_of(mp, at(i).outputs[0])) {
      const Node& b = at(i);
      FusedPass p;
      p.kind = FusedKind::BN_RELU_RECOMPUTE;
      p.at = p.bn = i;
      p.relu = i + 1;
      p.parts = {i, i + 1};
      operand(p.inputs, "x", b.inputs[0]);
      operand(p.inputs, "gamma", b.inputs[1]);
      operand(p.inputs, "beta", b.inputs[2]);
      operand(p.inputs, "batch_mean", b.inputs[3]);
      operand(p.inputs, "invstd", b.inputs[4]);
      operand(p.outputs, "y", b.outputs[0]);
      out.push_back(std::move(p));
      covered[static_cast<std::size_t>(i + 1)] = true;
      ++i;
      continue;
    }
    if ((k == OpKind::BN_FWD_TRAIN || k == OpKind::BN_FWD_INFER) && !at(i).accumulate &&
        is_float_feature(mp, at(i).outputs[0]) && owner_of(mp, at(i).inputs[0]) != owner_of(mp, at(i).outputs[0])) {
      const TensorId y = at(i).outputs[0];
      const bool train = k == OpKind::BN_FWD_TRAIN;
      FusedPass p;
      p.at = p.bn = i;
      if (relu_in_place(i + 1, y)) {
        p.kind = FusedKind::BN_RELU;
        p.relu = i + 1;
        p.parts = {i, i + 1};
        bn_apply_operands(p, at(i), "", train);
        operand(p.outputs, "y", y);
        out.push_back(std::move(p));
        covered[static_cast<std::size_t>(i + 1)] = true;
        ++i;
        continue;
      }
      if (op(i + 1) == OpKind::ADD2_FWD && !at(i + 1).accumulate && same(mp, at(i + 1).outputs[0], y) &&
          (same(mp, at(i + 1).inputs[0], y) || same(mp, at(i + 1).inputs[1], y))) {
        const bool relu = relu_in_place(i + 2, y);  // none after an inverted residual's add
        const TensorId s = same(mp, at(i + 1).inputs[0], y) ? at(i + 1).inputs[1] : at(i + 1).inputs[0];
        p.add = i + 1;
        p.relu = relu ? i + 2 : -1;
        p.parts = {i, i + 1};
        if (relu) p.parts.push_back(i + 2);
        // The shortcut is an earlier BN's output of the same kind that nothing but this ADD2 reads, and whose input
        // nothing writes before this pass: that BN's apply joins this pass (its output is never formed).
        int sj = -1;
        for (int j = 0; j < i && owner_of(mp, s) != owner_of(mp, y); ++j) {
          if (op(j) != k || covered[static_cast<std::size_t>(j)] || at(j).accumulate || !same(mp, at(j).outputs[0], s))
            continue;
          const TensorId xs = at(j).inputs[0];
          if (owner_of(mp, xs) == owner_of(mp, s) || owner_of(mp, xs) == owner_of(mp, y)) continue;
          if (touched(mp, s, sub, static_cast<std::size_t>(j) + 1, static_cast<std::size_t>(i) + 2,
                      static_cast<std::size_t>(i) + 1, false) ||
              read_later(mp, s, sub, static_cast<std::size_t>(i) + 2, &at(i + 1), bucket, index, touches))
            continue;
          if (touched(mp, xs, sub, static_cast<std::size_t>(j) + 1, static_cast<std::size_t>(i) + 2, SIZE_MAX, true))
            continue;
          sj = j;
          break;
        }
        bn_apply_operands(p, at(i), "", train);
        if (sj >= 0) {
          p.kind = relu ? FusedKind::BN_BN_ADD_RELU : FusedKind::BN_BN_ADD;
          p.shortcut_bn = sj;
          bn_apply_operands(p, at(sj), "shortcut.", false);
          covered[static_cast<std::size_t>(sj)] = true;
          if (train) {
            FusedPass st;
            st.kind = FusedKind::BN_STATS;
            st.at = st.bn = sj;
            st.parts = {sj};
            operand(st.inputs, "x", at(sj).inputs[0]);
            operand(st.inputs, "hyper", at(sj).inputs[3]);
            operand(st.outputs, "batch_mean", at(sj).outputs[1]);
            operand(st.outputs, "batch_var", at(sj).outputs[2]);
            operand(st.outputs, "invstd", at(sj).outputs[3]);
            operand(st.saved, "batch_mean", at(sj).outputs[1]);
            operand(st.saved, "invstd", at(sj).outputs[3]);
            // Passes are kept in `at` order: the statistics run where the shortcut's BN stood.
            const auto pos = std::find_if(out.begin(), out.end(), [&](const FusedPass& q) { return q.at > sj; });
            out.insert(pos, std::move(st));
          } else {
            p.parts.insert(p.parts.begin(), sj);
          }
        } else {
          p.kind = relu ? FusedKind::BN_ADD_RELU : FusedKind::BN_ADD;
          operand(p.inputs, "shortcut", s);
        }
        operand(p.outputs, "y", y);
        out.push_back(std::move(p));
        for (int q = i + 1; q <= i + (relu ? 2 : 1); ++q) covered[static_cast<std::size_t>(q)] = true;
        i += relu ? 2 : 1;
        continue;
      }
    }
    // A residual sum deferred to the ReLU backward that consumes it (TrainConfig::fold_residual_sums): ACCUMULATE of
    // the addend into the ReLU's dy, then the ReLU backward; the sum is never formed, so nothing else may read it.
    if (k == OpKind::ACCUMULATE && op(i + 1) == OpKind::RELU_BWD && !at(i + 1).accumulate &&
        at(i + 1).inputs[1] == at(i).outputs[0] &&
        mp.tensor(at(i).inputs[0]).shape == mp.tensor(at(i).outputs[0]).shape &&
        mp.tensor(at(i).inputs[0]).dtype == mp.tensor(at(i).outputs[0]).dtype &&
        owner_of(mp, at(i + 1).outputs[0]) != owner_of(mp, at(i).inputs[0]) &&
        owner_of(mp, at(i + 1).outputs[0]) != owner_of(mp, at(i).outputs[0]) &&
        !read_later(mp, at(i).outputs[0], sub, static_cast<std::size_t>(i) + 2, &at(i + 1), bucket, index, touches)) {
      FusedPass p;
      p.kind = FusedKind::ADD_RELU_BWD;
      p.at = i;
      p.add = i;
      p.relu = i + 1;
      p.parts = {i, i + 1};
      operand(p.inputs, "y", at(i + 1).inputs[0]);
      operand(p.inputs, "dy", at(i).outputs[0]);
      operand(p.inputs, "addend", at(i).inputs[0]);
      const TensorId g = at(i + 1).outputs[0];
      // The backward of the BN whose output fed the sum, right after it, reading g as its gradient: g is formed
      // inside that BN's statistics pass (and stored there: the shortcut reads it too).
      const Node* b = sum_into_bn && op(i + 2) == OpKind::BN_BWD ? &at(i + 2) : nullptr;
      if (b != nullptr && b->inputs.size() >= 5 && same(mp, b->inputs[1], g) &&
          owner_of(mp, b->inputs[0]) != owner_of(mp, g) && mp.tensor(b->inputs[0]).shape == mp.tensor(g).shape &&
          mp.tensor(b->inputs[0]).dtype == mp.tensor(g).dtype) {
        p.kind = FusedKind::ADD_RELU_BN_BWD;
        p.bn = i + 2;
        p.parts.push_back(i + 2);
        operand(p.inputs, "x", b->inputs[0]);
        operand(p.inputs, "gamma", b->inputs[2]);
        operand(p.inputs, "batch_mean", b->inputs[3]);
        operand(p.inputs, "invstd", b->inputs[4]);
        if (b->accumulate) operand(p.inputs, "dx", b->outputs[0]);
        operand(p.outputs, "dsum", g);
        operand(p.outputs, "dx", b->outputs[0]);
        operand(p.outputs, "dgamma", b->outputs[1]);
        operand(p.outputs, "dbeta", b->outputs[2]);
        // A projection block's end: the shortcut BN's backward, later in the node, reads the same g. It joins this
        // pass (ADD_RELU_BN_BN_BWD) when neither BN adds into its data gradient, its input x' has g's shape and type
        // and nothing between writes x', or reads or writes what that backward writes (it then runs here, earlier).
        for (int j = i + 3; shortcut_bn_into_sum && !b->accumulate && j < n; ++j) {
          const Node& s = at(j);
          if (op(j) != OpKind::BN_BWD || s.accumulate || s.inputs.size() < 5 || !same(mp, s.inputs[1], g)) continue;
          const TensorId xs = s.inputs[0];
          if (mp.tensor(xs).shape != mp.tensor(g).shape || mp.tensor(xs).dtype != mp.tensor(g).dtype ||
              owner_of(mp, xs) == owner_of(mp, g))
            break;
          const auto from = static_cast<std::size_t>(i) + 3, to = static_cast<std::size_t>(j);
          bool clear = !touched(mp, xs, sub, from, to, SIZE_MAX, true);
          for (TensorId o : s.outputs)
            clear = clear && o != kNoTensor && !touched(mp, o, sub, from, to, SIZE_MAX, true) &&
                    !touched(mp, o, sub, from, to, SIZE_MAX, false);
          if (!clear) break;
          p.kind = FusedKind::ADD_RELU_BN_BN_BWD;
          p.shortcut_bn = j;
          p.parts.push_back(j);
          operand(p.inputs, "shortcut.x", xs);
          operand(p.inputs, "shortcut.gamma", s.inputs[2]);
          operand(p.inputs, "shortcut.batch_mean", s.inputs[3]);
          operand(p.inputs, "shortcut.invstd", s.inputs[4]);
          operand(p.outputs, "shortcut.dx", s.outputs[0]);
          operand(p.outputs, "shortcut.dgamma", s.outputs[1]);
          operand(p.outputs, "shortcut.dbeta", s.outputs[2]);
          covered[static_cast<std::size_t>(j)] = true;
          break;
        }
        out.push_back(std::move(p));
        covered[static_cast<std::size_t>(i + 1)] = covered[static_cast<std::size_t>(i + 2)] = true;
        i += 2;
        continue;
      }
      operand(p.outputs, "dx", g);
      out.push_back(std::move(p));
      covered[static_cast<std::size_t>(i + 1)] = true;
      ++i;
      continue;
    }
    // ReLU backward then the BN backward of the BN it follows: the same gradient id (the ReLU reads that BN's output,
    // so its mask is the sign of the BN output, recomputed from x), formed for nothing else.
    if (k == OpKind::RELU_BWD && op(i + 1) == OpKind::BN_BWD && !at(i).accumulate && at(i + 1).inputs.size() > 5 &&
        at(i + 1).inputs[1] == at(i).outputs[0] && owner_of(mp, at(i).inputs[1]) != owner_of(mp, at(i + 1).inputs[0]) &&
        !read_later(mp, at(i).outputs[0], sub, static_cast<std::size_t>(i) + 2, &at(i + 1), bucket, index, touches)) {
      const Node& b = at(i + 1);
      FusedPass p;
      p.kind = FusedKind::RELU_BN_BWD;
      p.at = p.relu = i;
      p.bn = i + 1;
      p.parts = {i, i + 1};
      operand(p.inputs, "x", b.inputs[0]);
      operand(p.inputs, "dy", at(i).inputs[1]);
      operand(p.inputs, "gamma", b.inputs[2]);
      operand(p.inputs, "batch_mean", b.inputs[3]);
      operand(p.inputs, "invstd", b.inputs[4]);
      operand(p.inputs, "beta", b.inputs[5]);
      if (b.accumulate) operand(p.inputs, "dx", b.outputs[0]);
      operand(p.outputs, "dx", b.outputs[0]);
      operand(p.outputs, "dgamma", b.outputs[1]);
      operand(p.outputs, "dbeta", b.outputs[2]);
      out.push_back(std::move(p));
      covered[static_cast<std::size_t>(i + 1)] = true;
      ++i;
      continue;
    }
  }
  return out;
}

namespace {

/// A recomputed value (BN_RELU_RECOMPUTE) that no step of the fused programs reads, only a plain part a pass
/// replaces (the ReLU backward inside RELU_BN_BWD): the pass is for the plain fallback alone.
void mark_fallback_only(std::vector<Node>& bucket, const MemoryPlan& mp) {
  for (Node& n : bucket)
    for (FusedPass& f : n.fusions) {
      if (f.kind != FusedKind::BN_RELU_RECOMPUTE) continue;
      const TensorId o = owner_of(mp, f.outputs.at(0).id);
      bool read = false;
      for (const Node& m : bucket) {
        auto reads = [&](const std::vector<TensorId>& ids) {
          return std::any_of(ids.begin(), ids.end(), [&](TensorId t) { return t != kNoTensor && owner_of(mp, t) == o; });
        };
        if (m.sub.empty()) {
          read = read || (m.type == NodeType::COMPUTE && reads(m.inputs));
          continue;
        }
        const std::vector<int> step = fused_step_of(m);
        for (std::size_t k = 0; k < m.sub.size(); ++k)
          if (step[k] == -1) read = read || reads(m.sub[k].inputs);
        for (const FusedPass& q : m.fusions) {
          if (&q == &f) continue;
          for (const FusedOperand& op : q.inputs) read = read || owner_of(mp, op.id) == o;
        }
      }
      f.fallback_only = !read;
    }
}

}  // namespace

void plan_fusions(ComputationGraph& g, const MemoryPlan& mp, bool fuse, bool sum_into_bn, bool shortcut_bn_into_sum) {
  for (int gi = 0; gi < kGraphIds; ++gi) {
    std::vector<Node>& bucket = g.mutable_bucket(static_cast<GraphId>(gi));
    const std::vector<std::int64_t> touches = fuse ? last_touches(bucket, mp) : std::vector<std::int64_t>{};
    for (std::size_t i = 0; i < bucket.size(); ++i) {
      Node& n = bucket[i];
      n.fusions.clear();
      const bool fused = n.type == NodeType::COMPUTE &&
                         (n.op == OpKind::FUSED_FWD || n.op == OpKind::FUSED_BWD || n.op == OpKind::FUSED_INFER);
      if (fuse && fused && !n.sub.empty())
        n.fusions = decide_fusions(n.sub, mp, bucket, i, sum_into_bn, shortcut_bn_into_sum, &touches);
    }
    if (fuse) mark_fallback_only(bucket, mp);
  }
}

namespace {

/// Does a node at bucket positions (from, to) write bytes of `owner` (plain nodes and fused nodes' parts)?
bool written_between(const MemoryPlan& mp, TensorId owner, const std::vector<Node>& bucket, std::size_t from,
                     std::size_t to) {
  auto writes = [&](const Node& n) {
    return std::any_of(n.outputs.begin(), n.outputs.end(),
                       [&](TensorId t) { return t != kNoTensor && owner_of(mp, t) == owner; });
  };
  for (std::size_t i = from + 1; i < to; ++i) {
    const Node& n = bucket[i];
    if (writes(n)) return true;
    for (const Node& s : n.sub)
      if (writes(s)) return true;
  }
  return false;
}

}  // namespace

int plan_relu_masks(ComputationGraph& train, std::vector<MemoryPlan>& plans) {
  RN_CHECK(!plans.empty(), "internal: plan_relu_masks without memory plans");
  const MemoryPlan& mp = plans[0];
  int count = 0;
  for (int gi = 0; gi < kGraphIds; ++gi) {
    std::vector<Node>& bucket = train.mutable_bucket(static_cast<GraphId>(gi));
    // The training block ends of this bucket by their output's owner: (node, pass).
    std::map<TensorId, std::pair<std::size_t, std::size_t>> ends;
    for (std::size_t i = 0; i < bucket.size(); ++i) {
      Node& n = bucket[i];
      for (std::size_t k = 0; k < n.fusions.size(); ++k) {
        FusedPass& f = n.fusions[k];
        if (f.kind == FusedKind::BN_ADD_RELU || f.kind == FusedKind::BN_BN_ADD_RELU) {
          const FusedOperand* y = find_operand(f.outputs, "y");
          if (y == nullptr || n.sub[static_cast<std::size_t>(f.bn)].op != OpKind::BN_FWD_TRAIN) continue;
          const DTensor& t = mp.tensor(y->id);
          if (t.dtype != DType::F16 || channel_alignment(t.dtype, t.region) % 8 != 0) continue;
          ends[owner_of(mp, y->id)] = {i, k};
          continue;
        }
        if ((f.kind != FusedKind::ADD_RELU_BN_BWD && f.kind != FusedKind::ADD_RELU_BN_BN_BWD) ||
            find_operand(f.inputs, "mask") != nullptr)
          continue;
        const FusedOperand* y = find_operand(f.inputs, "y");
        if (y == nullptr) continue;
        const auto it = ends.find(owner_of(mp, y->id));
        if (it == ends.end()) continue;
        const auto [fi, fk] = it->second;
        FusedPass& fwd = bucket[fi].fusions[fk];
        const TensorId fy = find_operand(fwd.outputs, "y")->id;
        if (!same(mp, fy, y->id) || written_between(mp, owner_of(mp, y->id), bucket, fi, i)) continue;
        TensorId mask = kNoTensor;
        if (const FusedOperand* m = find_operand(fwd.outputs, "mask")) {
          mask = m->id;  // a second reader of the same ReLU (not in the networks planned so far)
        } else {
          const std::string name = mp.tensor(owner_of(mp, fy)).name + ".mask";
          auto shape_of = [&](const MemoryPlan& p) {
            const Shape s = p.tensor(fy).shape;
            return Shape{s.n, s.h, s.w, (s.c + 7) / 8};
          };
          std::int64_t slot = 0;
          for (const MemoryPlan& p : plans)
            slot = std::max(slot, compute_slot_bytes(shape_of(p), DType::U8, Region::S_MASK));
          for (MemoryPlan& p : plans) {
            const TensorId id = p.alloc_other(Region::S_MASK, name, shape_of(p), DType::U8, slot);
            RN_CHECK(mask == kNoTensor || id == mask, "internal: tensor ids diverge between variants");
            mask = id;
          }
          operand(fwd.outputs, "mask", mask);
          operand(fwd.saved, "mask", mask);
          ++count;
        }
        operand(f.inputs, "mask", mask);
      }
    }
  }
  return count;
}

std::vector<int> fused_step_of(const Node& n) {
  std::vector<int> v(n.sub.size(), -1);
  for (std::size_t p = 0; p < n.fusions.size(); ++p) {
    const FusedPass& f = n.fusions[p];
    for (std::int32_t k : f.parts) {
      RN_CHECK(k >= 0 && static_cast<std::size_t>(k) < v.size() && v[static_cast<std::size_t>(k)] == -1,
               "plan: fused pass {} of a {} node names part {} twice or out of range", ops::fused_kind_name(f.kind),
               op_kind_name(n.op), k);
      v[static_cast<std::size_t>(k)] = -2;
    }
    RN_CHECK(f.at >= 0 && static_cast<std::size_t>(f.at) < v.size() && v[static_cast<std::size_t>(f.at)] == -2,
             "plan: fused pass {} runs at sub-node {}, which is not among its parts", ops::fused_kind_name(f.kind),
             f.at);
    v[static_cast<std::size_t>(f.at)] = static_cast<int>(p);
  }
  return v;
}

}  // namespace renaissance::plan
