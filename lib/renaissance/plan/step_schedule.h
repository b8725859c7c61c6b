// The step schedule: the ordered (GraphId, stream, phase) list the runtime replays, a plan output (DESIGN §6, §7).
// The trainer replays it (Trainer::Impl::step, validation), capture walks it (every bucket a run can replay is
// captured at start-up), and the liveness analysis measures lifetimes on it (plan/liveness.cpp): one list, so the
// three cannot disagree. `renaissance plan --graph` prints it bucket by bucket.
#pragma once

#include <renaissance/plan/computation_graph.h>

#include <cstdint>
#include <vector>

namespace renaissance::plan {

/// Where a bucket runs. The trainer forks SIDE and UPDATE off the compute stream at their first entry in a phase
/// and joins them where an entry says so (`joins`) and at the end of the phase. TRANSFER: the H2D of a batch.
enum class Stream : std::uint8_t { COMPUTE, SIDE, UPDATE, TRANSFER };
const char* stream_name(Stream s);

/// When the runtime replays a run of entries.
enum class StepPhase : std::uint8_t {
  TRANSFER,         ///< per batch, before its step (train and validation variants)
  TRAIN_STEP,       ///< one optimizer step
  TRAIN_RESULT,     ///< after an epoch's last step: the train metrics summed over the ranks (then read)
  TRAIN_EPOCH_END,  ///< after they are read
  VAL_BEGIN,        ///< before a validation pass
  VAL_EMA_BEGIN,    ///< before a validation pass of the EMA weights under AMP
  VAL_BATCH_MAIN,   ///< per validation batch, the trained weights
  VAL_BATCH_EMA,    ///< per validation batch, the EMA weights
  VAL_RESULT,       ///< after a validation pass: the metrics summed over the ranks (then read)
  VAL_END,          ///< after they are read
};
const char* step_phase_name(StepPhase p);
/// Phases of the inference graph (the others replay buckets of the train graph).
bool is_inference_phase(StepPhase p);

struct ScheduleEntry {
  GraphId graph = GraphId::ZERO_GRAD;
  Stream stream = Stream::COMPUTE;
  StepPhase phase = StepPhase::TRAIN_STEP;
  /// 0 or 1: replayed only for the batch in input buffer A or B; -1: for every batch.
  std::int8_t slot = -1;
  /// SIDE: the side stream's work is joined into the compute stream before this entry runs (it reads what the side
  /// stream wrote). COMPUTE otherwise (nothing to join).
  Stream joins = Stream::COMPUTE;
};

struct StepSchedule {
  std::vector<ScheduleEntry> entries;  ///< grouped by phase, each phase in replay order
  /// The entries of `phase` in order (with `slot` >= 0: those for every batch and those of that slot).
  std::vector<ScheduleEntry> of(StepPhase phase, int slot = -1) const;
};

/// The schedule the compiler emits into every CompiledPlan (Compiler::compile's last phase and deserialize).
StepSchedule build_step_schedule();

}  // namespace renaissance::plan
