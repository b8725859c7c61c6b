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
  /// ONE_CYCLE with cycle_momentum (PyTorch OneCycleLR's cycle_momentum, base_momentum, max_momentum): the momentum
  /// falls from max_momentum to base_momentum while the rate rises and climbs back while it falls; otherwise
  /// momentum(step) is `momentum` throughout.
  bool cycle_momentum = false;
  double base_momentum = 0.85, max_momentum = 0.95;
  double momentum = 0.9;

  /// lr for optimizer step `step` (0-based).
  double lr(std::int64_t step) const;
  /// Momentum (SGD family, LARS) for optimizer step `step` (0-based).
  double momentum_at(std::int64_t step) const;
};

}  // namespace renaissance::runtime
