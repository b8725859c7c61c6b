// Liveness of the activation pool: when each feature and gradient buffer holds a value that a later node reads,
// measured on the order in which the runtime replays the subgraphs (DESIGN §5; STYLE habit 8, MegEngine's planner).
#pragma once

#include <renaissance/plan/computation_graph.h>
#include <renaissance/plan/memory_plan.h>
#include <renaissance/plan/step_schedule.h>

#include <map>
#include <vector>

namespace renaissance::plan {

/// A run of buckets the runtime replays one after the other on one stream, with no value of the activation pool
/// carried into it from before (checked: a pool tensor read before it is written in its phase is pinned).
struct Phase {
  bool inference = false;  ///< buckets of the inference graph (else of the train graph)
  std::vector<GraphId> buckets;
  /// Per bucket: 0 or 1, replayed only for the batch in input buffer A or B (ScheduleEntry::slot); -1 (or no entry):
  /// for every batch. A slot-1 bucket right after a slot-0 bucket is its twin: a step replays one of the two, so the
  /// analysis walks both over the same program points.
  std::vector<std::int8_t> slots;
  int slot_of(std::size_t i) const { return i < slots.size() ? slots[i] : -1; }
};
/// The phases of a run, read from the step schedule (plan/step_schedule.h), each bucket once per phase: the train
/// step and the epoch end (where the step picks one of two buckets, the A or B input buffer, both are listed with
/// their slots: twins share program points, so a lifetime measured on the phase contains the real one of either
/// replay); then each validation batch per input buffer (its INF_* bucket and its ACCUM_METRICS_VAL_*), and the
/// validation bookkeeping.
/// TRANSFER entries run on their own stream: they are in no phase, so what they touch is pinned.
std::vector<Phase> liveness_phases(const StepSchedule& schedule);
/// liveness_phases(build_step_schedule()).
const std::vector<Phase>& replay_phases();

struct Liveness {
  /// Every owner of pool bytes (F_FEATURE_*, F_GRAD_SLOT_*) -> the program points where it or one of its aliases is
  /// touched, one closed interval per phase that touches it. Program points number the plain nodes in replay
  /// order (a FUSED_* node's parts one by one; where the compiler planned a fused pass (Node::fusions), it touches
  /// its operands too: over consecutive parts its inputs at its first and last part and its outputs at its last,
  /// otherwise all at the part it runs at; a B bucket right after its A twin (Phase::slots) reuses the twin's
  /// points), except that a layer's weight-
  /// gradient node and the data-gradient node after it share one point: they may run on two streams at once
  /// (DESIGN §11, lever 3), so neither may write bytes the other still reads.
  std::map<TensorId, Lifetime> lifetimes;
  std::int32_t points = 0;  ///< program points in all
  /// Pool owners that must keep their bytes for the whole run: read before written in a phase (their value comes
  /// from an earlier replay), touched by a bucket outside the two orders (e.g. TRANSFER_*, on its own stream),
  /// never touched at all, or with padded channels (padding lanes are never written, so must stay zero).
  std::vector<TensorId> pinned;
};

/// Measures the lifetimes of `mp`'s pool owners over the train graph and the inference graph, in the order of
/// `schedule` (nullptr: build_step_schedule()).
Liveness compute_liveness(const MemoryPlan& mp, const ComputationGraph& train, const ComputationGraph& inference,
                          const StepSchedule* schedule = nullptr);
/// The same over explicit phases (tests).
Liveness compute_liveness(const MemoryPlan& mp, const ComputationGraph& train, const ComputationGraph& inference,
                          const std::vector<Phase>& phases);

}  // namespace renaissance::plan
