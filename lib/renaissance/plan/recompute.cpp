// Activation recomputation: see recompute.h.
#include <renaissance/core/error.h>
#include <renaissance/plan/recompute.h>

#include <algorithm>
#include <optional>

namespace renaissance::plan {

namespace {

/// Where a plain node stands in a bucket: top-level node `top`, and its part `part` of a fused node (-1: itself).
struct Pos {
  std::size_t top = 0;
  int part = -1;
};

/// Every plain node of bucket[from, to), in order.
std::vector<Pos> plain_nodes(const std::vector<Node>& bucket, std::size_t from, std::size_t to) {
  std::vector<Pos> v;
  for (std::size_t i = from; i < std::min(to, bucket.size()); ++i) {
    if (bucket[i].sub.empty()) {
      v.push_back({i, -1});
      continue;
    }
    for (std::size_t k = 0; k < bucket[i].sub.size(); ++k) v.push_back({i, static_cast<int>(k)});
  }
  return v;
}

Node& at(std::vector<Node>& bucket, Pos p) {
  Node& t = bucket[p.top];
  return p.part < 0 ? t : t.sub[static_cast<std::size_t>(p.part)];
}

TensorId owner_of(const MemoryPlan& mp, TensorId id) {
  if (id == kNoTensor) return kNoTensor;
  const auto it = mp.aliases().find(id);
  return it == mp.aliases().end() ? id : it->second;
}

/// A fused node's operands: the union of its parts' inputs and outputs, in part order (as the compiler groups them).
void refresh_operands(Node& f) {
  f.inputs.clear();
  f.outputs.clear();
  for (const Node& s : f.sub) {
    for (TensorId t : s.inputs)
      if (t != kNoTensor && std::find(f.inputs.begin(), f.inputs.end(), t) == f.inputs.end()) f.inputs.push_back(t);
    for (TensorId t : s.outputs)
      if (t != kNoTensor && std::find(f.outputs.begin(), f.outputs.end(), t) == f.outputs.end())
        f.outputs.push_back(t);
  }
}

struct Candidate {
  Node bn, relu;  // the forward pair
  TensorId value = kNoTensor;  // the ReLU's output
  const Node* fused = nullptr;  // the fused node the pair is part of (nullptr: plain layers)
};

/// Where the forward and the backward of one recomputation scope stand: the forward is fwd[0, fwd_end), the backward
/// bwd[bwd_begin, end); both may be one bucket. `elsewhere`: backward nodes of another bucket that must not read a
/// value this scope recomputes (the deep backward, for the first layer's scope).
struct Scope {
  std::vector<Node>& fwd;
  std::size_t fwd_end;
  std::vector<Node>& bwd;
  std::size_t bwd_begin;
  const std::vector<Node>* elsewhere;
  std::size_t elsewhere_begin;
};

/// The next BN_FWD_TRAIN → in-place RELU_FWD pair of the forward whose output is worth recomputing, skipping the
/// values (owners) in `done`.
std::optional<Candidate> next_candidate(const Scope& sc, const MemoryPlan& mp, const std::vector<TensorId>& done) {
  const std::vector<Pos> fwd = plain_nodes(sc.fwd, 0, sc.fwd_end);
  std::vector<std::pair<const Node*, bool>> nodes;  // every plain node of the scope's buckets, and whether backward
  for (const Pos p : plain_nodes(sc.fwd, 0, sc.fwd.size())) nodes.emplace_back(&at(sc.fwd, p), &sc.fwd == &sc.bwd && p.top >= sc.bwd_begin);
  if (&sc.bwd != &sc.fwd)
    for (const Pos p : plain_nodes(sc.bwd, 0, sc.bwd.size())) nodes.emplace_back(&at(sc.bwd, p), p.top >= sc.bwd_begin);
  auto check = [&](const Node& b, const Node& r, const Node* fused) -> std::optional<Candidate> {
    if (b.type != NodeType::COMPUTE || r.type != NodeType::COMPUTE || b.op != OpKind::BN_FWD_TRAIN ||
        r.op != OpKind::RELU_FWD || b.accumulate || r.accumulate || b.inputs.size() < 4 || b.outputs.size() < 4 ||
        r.inputs.empty() || r.outputs.empty())
      return std::nullopt;
    const TensorId o = owner_of(mp, b.outputs[0]);
    const Region region = mp.tensor(o).region;
    if (owner_of(mp, r.inputs[0]) != o || owner_of(mp, r.outputs[0]) != o || owner_of(mp, b.inputs[0]) == o ||
        (region != Region::F_FEATURE_FP16 && region != Region::F_FEATURE_FP32) ||
        std::find(done.begin(), done.end(), o) != done.end())
      return std::nullopt;
    const DTensor& y = mp.tensor(r.outputs[0]);
    const DTensor& x = mp.tensor(b.inputs[0]);
    if (!(y.shape == x.shape) || y.dtype != x.dtype) return std::nullopt;
    // Nothing but the pair writes the value's bytes; the backward reads them (as this shape and type) and holds the
    // BN's backward (so the BN's input and statistics stay live there anyway); no other backward reads them.
    bool written = false, read = false, odd = false, bn_bwd = false;
    for (const auto& [n, backward] : nodes) {
      if (n == &b || n == &r || n->type != NodeType::COMPUTE) continue;
      for (TensorId t : n->outputs) written = written || owner_of(mp, t) == o;
      if (!backward) continue;
      for (TensorId t : n->inputs)
        if (owner_of(mp, t) == o) {
          read = true;
          const DTensor& v = mp.tensor(t);
          odd = odd || !(v.shape == y.shape) || v.dtype != y.dtype;
        }
      bn_bwd = bn_bwd || (n->op == OpKind::BN_BWD && !n->inputs.empty() && n->inputs[0] == b.inputs[0]);
    }
    if (sc.elsewhere)
      for (const Pos p : plain_nodes(*sc.elsewhere, 0, sc.elsewhere->size())) {
        const Node& n = at(const_cast<std::vector<Node>&>(*sc.elsewhere), p);
        for (TensorId t : n.outputs) written = written || owner_of(mp, t) == o;
        if (p.top >= sc.elsewhere_begin)
          for (TensorId t : n.inputs) odd = odd || owner_of(mp, t) == o;
      }
    if (written || !read || odd || !bn_bwd) return std::nullopt;
    return Candidate{b, r, r.outputs[0], fused};
  };
  // Consecutive plain nodes of the forward: parts of one fused node, or top-level nodes (plain layers).
  for (std::size_t k = 0; k + 1 < fwd.size(); ++k) {
    const Pos a = fwd[k], b = fwd[k + 1];
    if (a.top != b.top && (a.part >= 0 || b.part >= 0)) continue;
    if (auto c = check(at(sc.fwd, a), at(sc.fwd, b), a.part >= 0 ? &sc.fwd[a.top] : nullptr)) return c;
  }
  return std::nullopt;
}

int recompute_scope(const Scope& sc, std::vector<MemoryPlan>& plans) {
  RN_CHECK(!plans.empty(), "internal: recomputation without memory plans");
  std::vector<Node>& bucket = sc.bwd;
  const MemoryPlan& mp = plans[0];
  std::vector<TensorId> done;
  int count = 0;
  while (auto c = next_candidate(sc, mp, done)) {
    const TensorId o = owner_of(mp, c->value);
    done.push_back(o);
    // The first backward reader.
    const std::vector<Pos> bwd = plain_nodes(bucket, sc.bwd_begin, bucket.size());
    std::size_t first = bwd.size();
    for (std::size_t k = 0; k < bwd.size() && first == bwd.size(); ++k) {
      const Node& n = at(bucket, bwd[k]);
      for (TensorId t : n.inputs)
        if (owner_of(mp, t) == o) first = k;
    }
    RN_CHECK(first < bwd.size(), "internal: recomputed value '{}' has no backward reader", mp.tensor(o).name);
    // Its copy: a feature of its own in every variant (the largest slot of any variant); the first layer's A and B
    // buckets share it.
    const std::string name = mp.tensor(c->value).name + ".recomputed";
    TensorId copy = mp.find(name);
    if (copy == kNoTensor) {
      std::int64_t slot = 0;
      for (const MemoryPlan& p : plans) {
        const DTensor& v = p.tensor(c->value);
        slot = std::max(slot, compute_slot_bytes(v.shape, v.dtype, p.tensor(o).region));
      }
      for (MemoryPlan& p : plans) {
        const DTensor& v = p.tensor(c->value);
        const TensorId id = p.alloc_feature(name, v.shape, v.dtype, slot);
        RN_CHECK(copy == kNoTensor || id == copy, "internal: tensor ids diverge between variants");
        copy = id;
      }
    }
    // Every backward read of the value reads the copy.
    for (std::size_t k = first; k < bwd.size(); ++k)
      for (TensorId& t : at(bucket, bwd[k]).inputs)
        if (owner_of(mp, t) == o) t = copy;
    // BN_APPLY (x, gamma, beta, batch mean, invstd) -> copy; RELU_FWD in place; before the first reader.
    Node apply = c->bn;
    apply.op = OpKind::BN_APPLY;
    apply.inputs = {c->bn.inputs[0], c->bn.inputs[1], c->bn.inputs[2], c->bn.outputs[1], c->bn.outputs[3]};
    apply.outputs = {copy};
    Node relu = c->relu;
    relu.inputs = {copy};
    relu.outputs = {copy};
    const Pos p = bwd[first];
    if (p.part < 0 && c->fused) {
      // The reader is a plain layer's node: the pair gets a fused node of the BN's layer of its own, so the fusion
      // phase plans it as one pass too.
      Node f = compute_node(OpKind::FUSED_BWD, {}, {}, c->fused->params);
      f.layer_kind = c->fused->layer_kind;
      f.layer_index = c->fused->layer_index;
      f.sub = {apply, relu};
      refresh_operands(f);
      bucket.insert(bucket.begin() + static_cast<std::ptrdiff_t>(p.top), std::move(f));
    } else if (p.part < 0) {
      const auto it = bucket.begin() + static_cast<std::ptrdiff_t>(p.top);
      bucket.insert(it, {apply, relu});
    } else {
      Node& f = bucket[p.top];
      f.sub.insert(f.sub.begin() + p.part, {apply, relu});
      refresh_operands(f);
    }
    for (Node& n : bucket)
      if (!n.sub.empty()) refresh_operands(n);
    ++count;
  }
  return count;
}

}  // namespace

int plan_recompute_bn_relu(ComputationGraph& train, std::size_t deep_backward_begin, std::vector<MemoryPlan>& plans) {
  std::vector<Node>& deep = train.mutable_bucket(GraphId::DEEP_FWD_BWD);
  int count = recompute_scope(Scope{deep, deep_backward_begin, deep, deep_backward_begin, nullptr, 0}, plans);
  // The first layer: its forward and backward are buckets of their own, one pair per input buffer (the same tensors).
  for (auto [f, b] : {std::pair{GraphId::FIRST_LAYER_FWD_A, GraphId::FIRST_LAYER_BWD_A},
                      std::pair{GraphId::FIRST_LAYER_FWD_B, GraphId::FIRST_LAYER_BWD_B}}) {
    std::vector<Node>& fwd = train.mutable_bucket(f);
    std::vector<Node>& bwd = train.mutable_bucket(b);
    if (fwd.empty() || bwd.empty()) continue;
    const int n = recompute_scope(Scope{fwd, fwd.size(), bwd, 0, &deep, deep_backward_begin}, plans);
    if (f == GraphId::FIRST_LAYER_FWD_A) count += n;
  }
  return count;
}

}  // namespace renaissance::plan
