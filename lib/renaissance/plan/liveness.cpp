#include <renaissance/core/error.h>
#include <renaissance/plan/liveness.h>

#include <algorithm>
#include <limits>
#include <set>

namespace renaissance::plan {

std::vector<Phase> liveness_phases(const StepSchedule& schedule) {
  // Each bucket once per phase, in schedule order.
  auto phase_of = [&schedule](std::initializer_list<StepPhase> phases, int slot, bool inference) {
    Phase ph;
    ph.inference = inference;
    for (StepPhase p : phases)
      for (const ScheduleEntry& e : schedule.entries)
        if (e.phase == p && (slot < 0 || e.slot == slot) &&
            std::find(ph.buckets.begin(), ph.buckets.end(), e.graph) == ph.buckets.end()) {
          ph.buckets.push_back(e.graph);
          ph.slots.push_back(slot < 0 ? e.slot : std::int8_t{-1});
        }
    return ph;
  };
  std::vector<Phase> v;
  v.push_back(phase_of({StepPhase::TRAIN_STEP, StepPhase::TRAIN_RESULT, StepPhase::TRAIN_EPOCH_END}, -1, false));
  for (StepPhase p : {StepPhase::VAL_BATCH_MAIN, StepPhase::VAL_BATCH_EMA})
    for (int slot : {0, 1}) v.push_back(phase_of({p}, slot, true));
  v.push_back(
      phase_of({StepPhase::VAL_BEGIN, StepPhase::VAL_EMA_BEGIN, StepPhase::VAL_RESULT, StepPhase::VAL_END}, -1, true));
  return v;
}

const std::vector<Phase>& replay_phases() {
  static const std::vector<Phase> phases = liveness_phases(build_step_schedule());
  return phases;
}

namespace {

constexpr std::int32_t kUntouched = -1;

struct Walker {
  const MemoryPlan& mp;
  std::vector<TensorId> owner_of;  // tensor id -> owner id if in the pool, else kNoTensor
  std::vector<std::int32_t> first, last;
  std::vector<bool> written;  // per phase
  std::set<TensorId> pinned;

  explicit Walker(const MemoryPlan& m) : mp(m) {
    const auto n = m.tensors().size();
    owner_of.assign(n, kNoTensor);
    for (const DTensor& t : m.tensors()) {
      if (!is_pool_region(t.region)) continue;
      auto it = m.aliases().find(t.id);
      owner_of[static_cast<std::size_t>(t.id)] = it == m.aliases().end() ? t.id : it->second;
    }
    first.assign(n, kUntouched);
    last.assign(n, kUntouched);
    written.assign(n, false);
  }

  TensorId owner(TensorId id) const {
    return id >= 0 && static_cast<std::size_t>(id) < owner_of.size() ? owner_of[static_cast<std::size_t>(id)]
                                                                     : kNoTensor;
  }
  void touch(TensorId o, std::int32_t p) {
    auto& f = first[static_cast<std::size_t>(o)];
    auto& l = last[static_cast<std::size_t>(o)];
    if (f == kUntouched) {
      f = l = p;
      return;
    }
    f = std::min(f, p);  // a fused pass touches its operands after its parts
    l = std::max(l, p);
  }
  // Plain nodes in execution order: a value read before anything wrote it in this phase comes from an earlier
  // replay, so its owner cannot give its bytes away.
  void order_check(const Node& n) {
    if (!n.sub.empty()) {
      for (const Node& s : n.sub) order_check(s);
      return;
    }
    const bool acc = n.accumulate || n.op == OpKind::ACCUMULATE;
    auto read = [&](TensorId id) {
      const TensorId o = owner(id);
      if (o != kNoTensor && !written[static_cast<std::size_t>(o)]) pinned.insert(o);
    };
    for (TensorId id : n.inputs) read(id);
    if (n.type == NodeType::COMPUTE)
      for (TensorId id : n.outputs) {
        if (acc) read(id);
        const TensorId o = owner(id);
        if (o != kNoTensor) written[static_cast<std::size_t>(o)] = true;
      }
  }
  // Every pool owner a node touches, including whole pool regions a RANGE node spans.
  void touch_node(const Node& n, std::int32_t p) {
    for (const auto* ids : {&n.inputs, &n.outputs})
      for (TensorId id : *ids)
        if (const TensorId o = owner(id); o != kNoTensor) touch(o, p);
    if (n.type == NodeType::RANGE) {
      for (const auto* ranges : {&n.input_ranges, &n.output_ranges})
        for (RegionRange r : *ranges)
          for (int ri = region_index(r.first); ri <= region_index(r.last); ++ri) {
            if (!is_pool_region(region_at(ri))) continue;
            for (const DTensor& t : mp.tensors())
              if (region_index(t.region) == ri && !mp.aliases().count(t.id))
                pinned.insert(t.id);  // in and out: unknown order
          }
    }
    if (n.type == NodeType::COMPUTE) order_check(n);
  }
  // One program point per plain node, in order; see the header for the two exceptions. A fused node's parts keep
  // their points (the plain fallback, --sync-bn and profiled runs, executes them), and each fused pass touches its
  // operands too: a value it never forms still has bytes for the plain parts.
  //  - A pass over consecutive parts [first, last] (BN+ReLU, ReLU+BN backward, ...) is the only thing that runs over
  //    those points in the fused program: its inputs are touched at first and last, its outputs at last. So an output
  //    may take the bytes of a value only the replaced parts read (the ReLU backward's saved output under the BN
  //    backward's dx), as the plain parts alone allow; the fused pass never reads that value.
  //  - Any other pass (a deferred shortcut BN apply reaching back to the shortcut's statistics) touches all of its
  //    operands at the point of the part it runs at: a pass that reads the shortcut's input at the block's end keeps
  //    that input alive until then.
  void visit(const std::vector<Node>& seq, std::int32_t& next, const std::vector<FusedPass>* passes = nullptr) {
    const Node* prev = nullptr;
    std::vector<std::int32_t> point_of(seq.size(), -1);
    for (std::size_t k = 0; k < seq.size(); ++k) {
      const Node& n = seq[k];
      if (!n.sub.empty()) {
        visit(n.sub, next, &n.fusions);
        prev = nullptr;
        continue;
      }
      const bool with_prev = prev && runs_beside(prev->op, n.op);
      const std::int32_t point = with_prev ? next - 1 : next++;
      point_of[k] = point;
      touch_node(n, point);
      prev = &n;
    }
    if (!passes) return;
    auto touch_all = [&](const std::vector<FusedOperand>& ops, std::int32_t point) {
      for (const FusedOperand& o : ops)
        if (const TensorId ow = owner(o.id); ow != kNoTensor) touch(ow, point);
    };
    auto valid = [&](std::int32_t k) { return k >= 0 && static_cast<std::size_t>(k) < seq.size(); };
    for (const FusedPass& f : *passes) {
      if (!valid(f.at) || f.parts.empty()) continue;
      const auto [lo, hi] = std::minmax_element(f.parts.begin(), f.parts.end());
      const bool span = valid(*lo) && valid(*hi) && static_cast<std::size_t>(*hi - *lo + 1) == f.parts.size();
      if (span) {
        const std::int32_t first = point_of[static_cast<std::size_t>(*lo)], last = point_of[static_cast<std::size_t>(*hi)];
        touch_all(f.inputs, first);
        touch_all(f.inputs, last);
        touch_all(f.outputs, last);
      } else {
        const std::int32_t point = point_of[static_cast<std::size_t>(f.at)];
        touch_all(f.inputs, point);
        touch_all(f.outputs, point);
      }
    }
  }
};

}  // namespace

Liveness compute_liveness(const MemoryPlan& mp, const ComputationGraph& train, const ComputationGraph& inference,
                          const StepSchedule* schedule) {
  return compute_liveness(mp, train, inference, schedule ? liveness_phases(*schedule) : replay_phases());
}

Liveness compute_liveness(const MemoryPlan& mp, const ComputationGraph& train, const ComputationGraph& inference,
                          const std::vector<Phase>& phases) {
  Walker w(mp);
  Liveness out;
  std::map<TensorId, Lifetime>& life = out.lifetimes;
  std::int32_t p = 0;
  std::set<GraphId> listed[2];
  for (const Phase& ph : phases) {
    const ComputationGraph& graph = ph.inference ? inference : train;
    std::fill(w.first.begin(), w.first.end(), kUntouched);
    std::fill(w.last.begin(), w.last.end(), kUntouched);
    std::fill(w.written.begin(), w.written.end(), false);
    // A twin (slot 1 right after slot 0) starts over at its twin's first point, with what was written before it:
    // a step replays one of the two.
    std::int32_t twin_begin = p, twin_end = p;
    std::vector<bool> written_before_twin, written_by_twin;
    for (std::size_t i = 0; i < ph.buckets.size(); ++i) {
      const GraphId g = ph.buckets[i];
      listed[ph.inference ? 1 : 0].insert(g);
      const bool second = i > 0 && ph.slot_of(i) == 1 && ph.slot_of(i - 1) == 0;
      if (second) {
        twin_end = p;
        written_by_twin = w.written;
        p = twin_begin;
        w.written = written_before_twin;
      } else if (ph.slot_of(i) == 0) {
        twin_begin = p;
        written_before_twin = w.written;
      }
      w.visit(graph.bucket(g), p);
      if (second) {
        p = std::max(p, twin_end);
        for (std::size_t k = 0; k < w.written.size(); ++k) w.written[k] = w.written[k] || written_by_twin[k];
      }
    }
    for (std::size_t id = 0; id < w.first.size(); ++id)
      if (w.first[id] != kUntouched) life[static_cast<TensorId>(id)].push_back(LiveInterval{w.first[id], w.last[id]});
  }
  // A bucket in no phase (its own stream, or replayed at times no phase describes) pins what it touches.
  for (int gi = 0; gi < 2; ++gi)
    for (int g = 0; g < kGraphIds; ++g) {
      const std::vector<Node>& bucket = (gi ? inference : train).bucket(static_cast<GraphId>(g));
      if (listed[gi].count(static_cast<GraphId>(g)) || bucket.empty()) continue;
      Walker other(mp);
      for (const Node& n : bucket) other.touch_node(n, 0);
      for (std::size_t id = 0; id < other.first.size(); ++id)
        if (other.first[id] != kUntouched) w.pinned.insert(static_cast<TensorId>(id));
      w.pinned.insert(other.pinned.begin(), other.pinned.end());
    }
  out.points = p;
  for (const DTensor& t : mp.tensors()) {
    const TensorId o = w.owner(t.id);
    if (o == kNoTensor) continue;
    // Padded channel lanes are written by nobody and read as zeros by some kernels: keep them out of reuse.
    if (t.shape.c % channel_alignment(t.dtype, t.region) != 0) w.pinned.insert(o);
    if (o == t.id && !life.count(o)) w.pinned.insert(o);
  }
  for (TensorId o : w.pinned) life[o] = Lifetime{LiveInterval{0, std::max<std::int32_t>(p - 1, 0)}};
  out.pinned.assign(w.pinned.begin(), w.pinned.end());
  return out;
}

}  // namespace renaissance::plan
