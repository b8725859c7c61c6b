// Learning-rate schedules as pure functions of the optimizer step, so a resumed run gets the same rates.
#pragma once

#include <cstdint>
#include <string>

namespace renaissance::runtime {

enum class ScheduleKind : std::uint8_t { CONSTANT, STEP, COSINE, ONE_CYCLE };
const char* schedule_name(ScheduleKind k);
ScheduleKind schedule_from_name(const std::string& s);  ///< "constant", "step", "cosine", "onecycle"

struct Schedule {
  ScheduleKind kind = ScheduleKind::COSINE;
  double base_lr = 0.1;
  std::int64_t total_steps = 1;
  std::int64_t warmup_steps = 0;   ///< linear warm-up from 0 (constant/step/cosine)
  std::int64_t step_size = 0;      ///< STEP: decay every step_size steps (after warm-up)
  double gamma = 0.1;              ///< STEP: decay factor
  double final_lr_fraction = 0.0;  ///< COSINE: lr at the end = base_lr · fraction
  double one_cycle_pct = 0.25;     ///< ONE_CYCLE: fraction of steps rising (PyTorch OneCycleLR, cos annealing)
  double div_factor = 25.0;        ///< ONE_CYCLE: initial lr = base_lr / div_factor
  double final_div_factor = 1e4;   ///< ONE_CYCLE: final lr = initial / final_div_factor

  /// lr for optimizer step `step` (0-based).
  double lr(std::int64_t step) const;
};

}  // namespace renaissance::runtime
