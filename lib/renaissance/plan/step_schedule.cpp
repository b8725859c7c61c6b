#include <renaissance/plan/step_schedule.h>

namespace renaissance::plan {

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::COMPUTE: return "compute";
    case Stream::SIDE: return "side";
    case Stream::UPDATE: return "update";
    case Stream::TRANSFER: return "transfer";
  }
  return "?";
}

const char* step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::TRANSFER: return "transfer";
    case StepPhase::TRAIN_STEP: return "train step";
    case StepPhase::TRAIN_RESULT: return "train result";
    case StepPhase::TRAIN_EPOCH_END: return "train epoch end";
    case StepPhase::VAL_BEGIN: return "validation begin";
    case StepPhase::VAL_EMA_BEGIN: return "validation begin (EMA, AMP)";
    case StepPhase::VAL_BATCH_MAIN: return "validation batch";
    case StepPhase::VAL_BATCH_EMA: return "validation batch (EMA)";
    case StepPhase::VAL_RESULT: return "validation result";
    case StepPhase::VAL_END: return "validation end";
  }
  return "?";
}

bool is_inference_phase(StepPhase p) {
  return p == StepPhase::VAL_BEGIN || p == StepPhase::VAL_EMA_BEGIN || p == StepPhase::VAL_BATCH_MAIN ||
         p == StepPhase::VAL_BATCH_EMA || p == StepPhase::VAL_RESULT || p == StepPhase::VAL_END;
}

std::vector<ScheduleEntry> StepSchedule::of(StepPhase phase, int slot) const {
  std::vector<ScheduleEntry> v;
  for (const ScheduleEntry& e : entries)
    if (e.phase == phase && (slot < 0 || e.slot < 0 || e.slot == slot)) v.push_back(e);
  return v;
}

StepSchedule build_step_schedule() {
  StepSchedule s;
  StepPhase phase = StepPhase::TRAIN_STEP;
  auto add = [&](GraphId g, Stream st = Stream::COMPUTE, int slot = -1, Stream joins = Stream::COMPUTE) {
    s.entries.push_back(ScheduleEntry{g, st, phase, static_cast<std::int8_t>(slot), joins});
  };
  using G = GraphId;
  phase = StepPhase::TRANSFER;
  add(G::TRANSFER_A, Stream::TRANSFER, 0);
  add(G::TRANSFER_B, Stream::TRANSFER, 1);

  // One optimizer step on the batch in input buffer A (slot 0) or B (slot 1).
  phase = StepPhase::TRAIN_STEP;
  // forward, backward
  add(G::ZERO_GRAD);
  add(G::FIRST_LAYER_FWD_A, Stream::COMPUTE, 0);
  add(G::FIRST_LAYER_FWD_B, Stream::COMPUTE, 1);
  add(G::DEEP_FWD_BWD);
  // reduce: bucket 1 (deep convolutions) as soon as the deep backward ends, on the side stream, overlapping the first
  // layer's backward; bucket 2 on the compute stream beside it (GPU: each on its own NCCL communicator,
  // runtime/collectives.h); the NaN check reads both.
  add(G::DEEP_COMM, Stream::SIDE);
  add(G::FIRST_LAYER_BWD_A, Stream::COMPUTE, 0);
  add(G::FIRST_LAYER_BWD_B, Stream::COMPUTE, 1);
  add(G::CAST_G16_TO_G);
  add(G::FIRST_COMM);
  add(G::NAN_CHECK_AND_GRAD_SCALING, Stream::COMPUTE, -1, Stream::SIDE);
  // update (weights, moments, the FP16 copies, the EMA) on the update stream, beside the BN running statistics and
  // the metrics (other regions); the next step's work waits for both.
  add(G::OPTIMIZER, Stream::UPDATE);
  add(G::LARS_NORM_OPT, Stream::UPDATE);
  add(G::LARS_BIAS_OPT, Stream::UPDATE);
  add(G::LARS_WEIGHT_OPT, Stream::UPDATE);
  add(G::CAST_W_TO_A, Stream::UPDATE);
  add(G::EMA_UPDATE, Stream::UPDATE);
  add(G::STATS_COMM);
  add(G::UPDATE_STATS);
  // log
  add(G::ACCUM_METRICS_TRAIN);

  phase = StepPhase::TRAIN_RESULT;
  add(G::TRAIN_RESULT_COMM);
  phase = StepPhase::TRAIN_EPOCH_END;
  add(G::CLEAR_METRICS);

  phase = StepPhase::VAL_BEGIN;
  add(G::CLEAR_METRICS);
  phase = StepPhase::VAL_EMA_BEGIN;
  add(G::CAST_E_TO_E16);
  phase = StepPhase::VAL_BATCH_MAIN;
  add(G::INF_MAIN_A, Stream::COMPUTE, 0);
  add(G::ACCUM_METRICS_VAL_A, Stream::COMPUTE, 0);
  add(G::INF_MAIN_B, Stream::COMPUTE, 1);
  add(G::ACCUM_METRICS_VAL_B, Stream::COMPUTE, 1);
  phase = StepPhase::VAL_BATCH_EMA;
  add(G::INF_EMA_A, Stream::COMPUTE, 0);
  add(G::ACCUM_METRICS_VAL_A, Stream::COMPUTE, 0);
  add(G::INF_EMA_B, Stream::COMPUTE, 1);
  add(G::ACCUM_METRICS_VAL_B, Stream::COMPUTE, 1);
  phase = StepPhase::VAL_RESULT;
  add(G::VAL_RESULT_COMM);
  phase = StepPhase::VAL_END;
  add(G::CLEAR_METRICS);
  return s;
}

}  // namespace renaissance::plan
