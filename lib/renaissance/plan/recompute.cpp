// Activation recomputation: see recompute.h.
#include <renaissance/core/error.h>
#include <renaissance/plan/recompute.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

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
const Node& at(const std::vector<Node>& bucket, Pos p) { return at(const_cast<std::vector<Node>&>(bucket), p); }

struct Candidate {
  Node bn, relu;               // the forward pair
  TensorId value = kNoTensor;  // the ReLU's output
  bool in_fused = false;       // the pair is part of a fused node (of this layer kind, index and parameters)
  LayerKind fused_kind = LayerKind::Identity;
  std::int32_t fused_index = -1;
  LayerParams fused_params;
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

/// The BN_FWD_TRAIN → in-place RELU_FWD pairs of the forward whose output is worth recomputing, in forward order:
/// nothing but the pair writes the value's bytes; the scope's backward reads them (as this shape and type) and holds
/// the BN's backward (so the BN's input and statistics stay live there anyway); no other backward reads them. One
/// walk over the scope's nodes gathers what every pair is checked against.
std::vector<Candidate> candidates(const Scope& sc, const MemoryPlan& mp) {
  std::unordered_map<TensorId, int> writers;        // owner -> plain nodes writing it
  std::unordered_map<TensorId, bool> read_back;     // owner -> read backward, every time by the scope as its shape
  std::unordered_set<TensorId> bn_backward_inputs;  // x of every BN_BWD of the scope's backward
  auto walk = [&](const std::vector<Node>& bucket, std::size_t backward_begin, bool scope) {
    for (const Pos p : plain_nodes(bucket, 0, bucket.size())) {
      const Node& n = at(bucket, p);
      if (n.type != NodeType::COMPUTE) continue;
      for (TensorId t : n.outputs) ++writers[mp.owner_of(t)];
      if (p.top < backward_begin) continue;
      for (TensorId t : n.inputs) {
        const TensorId o = mp.owner_of(t);
        const DTensor &v = mp.tensor(t), &w = mp.tensor(o);
        const bool ok = scope && v.shape == w.shape && v.dtype == w.dtype;
        const auto [it, fresh] = read_back.emplace(o, ok);
        if (!fresh) it->second = it->second && ok;
      }
      if (scope && n.op == OpKind::BN_BWD && !n.inputs.empty()) bn_backward_inputs.insert(n.inputs[0]);
    }
  };
  walk(sc.fwd, &sc.fwd == &sc.bwd ? sc.bwd_begin : sc.fwd.size(), true);
  if (&sc.bwd != &sc.fwd) walk(sc.bwd, sc.bwd_begin, true);
  if (sc.elsewhere) walk(*sc.elsewhere, sc.elsewhere_begin, false);

  std::vector<Candidate> out;
  const std::vector<Pos> fwd = plain_nodes(sc.fwd, 0, sc.fwd_end);
  for (std::size_t k = 0; k + 1 < fwd.size(); ++k) {
    // Consecutive plain nodes of the forward: parts of one fused node, or top-level nodes (plain layers).
    const Pos pa = fwd[k], pb = fwd[k + 1];
    if (pa.top != pb.top && (pa.part >= 0 || pb.part >= 0)) continue;
    const Node& b = at(sc.fwd, pa);
    const Node& r = at(sc.fwd, pb);
    if (b.type != NodeType::COMPUTE || r.type != NodeType::COMPUTE || b.op != OpKind::BN_FWD_TRAIN ||
        r.op != OpKind::RELU_FWD || b.accumulate || r.accumulate || b.inputs.size() < 4 || b.outputs.size() < 4 ||
        r.inputs.empty() || r.outputs.empty())
      continue;
    const TensorId o = mp.owner_of(b.outputs[0]);
    const DTensor& owner = mp.tensor(o);
    if (mp.owner_of(r.inputs[0]) != o || mp.owner_of(r.outputs[0]) != o || mp.owner_of(b.inputs[0]) == o ||
        (owner.region != Region::F_FEATURE_FP16 && owner.region != Region::F_FEATURE_FP32))
      continue;
    const DTensor& y = mp.tensor(r.outputs[0]);
    const DTensor& x = mp.tensor(b.inputs[0]);
    if (!(y.shape == x.shape) || y.dtype != x.dtype || !(owner.shape == y.shape) || owner.dtype != y.dtype) continue;
    const auto read = read_back.find(o);
    if (writers[o] != 2 || read == read_back.end() || !read->second || !bn_backward_inputs.count(b.inputs[0]))
      continue;  // written by another node too, not read backward (or oddly, or elsewhere), or no BN backward
    Candidate c;
    c.bn = b;
    c.relu = r;
    c.value = r.outputs[0];
    if (pa.part >= 0) {
      const Node& f = sc.fwd[pa.top];
      c.in_fused = true;
      c.fused_kind = f.layer_kind;
      c.fused_index = f.layer_index;
      c.fused_params = f.params;
    }
    out.push_back(std::move(c));
  }
  return out;
}

int recompute_scope(const Scope& sc, std::vector<MemoryPlan>& plans, int limit) {
  RN_CHECK(!plans.empty(), "internal: recomputation without memory plans");
  std::vector<Node>& bucket = sc.bwd;
  const MemoryPlan& mp = plans[0];
  int count = 0;
  for (const Candidate& c : candidates(sc, mp)) {
    if (limit >= 0 && count >= limit) break;
    const TensorId o = mp.owner_of(c.value);
    // The first backward reader.
    const std::vector<Pos> bwd = plain_nodes(bucket, sc.bwd_begin, bucket.size());
    std::size_t first = bwd.size();
    for (std::size_t k = 0; k < bwd.size() && first == bwd.size(); ++k) {
      const Node& n = at(bucket, bwd[k]);
      for (TensorId t : n.inputs)
        if (mp.owner_of(t) == o) first = k;
    }
    RN_CHECK(first < bwd.size(), "internal: recomputed value '{}' has no backward reader", mp.tensor(o).name);
    // Its copy: a feature of its own in every variant (the largest slot of any variant); the first layer's A and B
    // buckets share it.
    const std::string name = mp.tensor(c.value).name + ".recomputed";
    TensorId copy = mp.find(name);
    if (copy == kNoTensor) {
      std::int64_t slot = 0;
      for (const MemoryPlan& p : plans) {
        const DTensor& v = p.tensor(c.value);
        slot = std::max(slot, compute_slot_bytes(v.shape, v.dtype, p.tensor(o).region));
      }
      for (MemoryPlan& p : plans) {
        const DTensor& v = p.tensor(c.value);
        const TensorId id = p.alloc_feature(name, v.shape, v.dtype, slot);
        RN_CHECK(copy == kNoTensor || id == copy, "internal: tensor ids diverge between variants");
        copy = id;
      }
    }
    // Every backward read of the value reads the copy (and the fused nodes holding such reads say so).
    for (std::size_t k = first; k < bwd.size(); ++k) {
      bool changed = false;
      for (TensorId& t : at(bucket, bwd[k]).inputs)
        if (mp.owner_of(t) == o) {
          t = copy;
          changed = true;
        }
      if (changed && bwd[k].part >= 0) set_fused_operands(bucket[bwd[k].top]);
    }
    // BN_APPLY (x, gamma, beta, batch mean, invstd) -> copy; RELU_FWD in place; before the first reader.
    Node apply = c.bn;
    apply.op = OpKind::BN_APPLY;
    apply.inputs = {c.bn.inputs[0], c.bn.inputs[1], c.bn.inputs[2], c.bn.outputs[1], c.bn.outputs[3]};
    apply.outputs = {copy};
    Node relu = c.relu;
    relu.inputs = {copy};
    relu.outputs = {copy};
    const Pos p = bwd[first];
    if (p.part < 0 && c.in_fused) {
      // The reader is a plain layer's node: the pair gets a fused node of the BN's layer of its own, so the fusion
      // phase plans it as one pass too.
      Node f = compute_node(OpKind::FUSED_BWD, {}, {}, c.fused_params);
      f.layer_kind = c.fused_kind;
      f.layer_index = c.fused_index;
      f.sub = {apply, relu};
      set_fused_operands(f);
      bucket.insert(bucket.begin() + static_cast<std::ptrdiff_t>(p.top), std::move(f));
    } else if (p.part < 0) {
      const auto it = bucket.begin() + static_cast<std::ptrdiff_t>(p.top);
      bucket.insert(it, {apply, relu});
    } else {
      Node& f = bucket[p.top];
      f.sub.insert(f.sub.begin() + p.part, {apply, relu});
      set_fused_operands(f);
    }
    ++count;
  }
  return count;
}

}  // namespace

int plan_recompute_bn_relu(ComputationGraph& train, std::size_t deep_backward_begin, std::vector<MemoryPlan>& plans,
                           int limit) {
  std::vector<Node>& deep = train.mutable_bucket(GraphId::DEEP_FWD_BWD);
  int count = recompute_scope(Scope{deep, deep_backward_begin, deep, deep_backward_begin, nullptr, 0}, plans, limit);
  const int left = limit < 0 ? -1 : std::max(0, limit - count);
  // The first layer: its forward and backward are buckets of their own, one pair per input buffer (the same tensors).
  for (auto [f, b] : {std::pair{GraphId::FIRST_LAYER_FWD_A, GraphId::FIRST_LAYER_BWD_A},
                      std::pair{GraphId::FIRST_LAYER_FWD_B, GraphId::FIRST_LAYER_BWD_B}}) {
    std::vector<Node>& fwd = train.mutable_bucket(f);
    std::vector<Node>& bwd = train.mutable_bucket(b);
    if (fwd.empty() || bwd.empty()) continue;
    const int n = recompute_scope(Scope{fwd, fwd.size(), bwd, 0, &deep, deep_backward_begin}, plans, left);
    if (f == GraphId::FIRST_LAYER_FWD_A) count += n;
  }
  return count;
}

}  // namespace renaissance::plan
