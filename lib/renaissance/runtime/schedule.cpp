#include <renaissance/core/error.h>
#include <renaissance/runtime/schedule.h>

#include <algorithm>
#include <cmath>

namespace renaissance::runtime {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::CONSTANT: return "constant";
    case ScheduleKind::STEP: return "step";
    case ScheduleKind::COSINE: return "cosine";
    case ScheduleKind::ONE_CYCLE: return "onecycle";
  }
  return "?";
}

ScheduleKind schedule_from_name(const std::string& s) {
  for (auto k : {ScheduleKind::CONSTANT, ScheduleKind::STEP, ScheduleKind::COSINE, ScheduleKind::ONE_CYCLE})
    if (s == schedule_name(k)) return k;
  RN_FAIL("unknown schedule '{}' (known: constant, step, cosine, onecycle)", s);
}

namespace {
constexpr double kPi = 3.14159265358979323846;

/// PyTorch's cosine anneal from `start` to `end`, `pct` of the way.
double anneal(double start, double end, double pct) { return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0); }

/// OneCycleLR's two phases (anneal_strategy='cos', three_phase=False): the value at `step` of `total` that goes from
/// `first` to `peak` over the first `pct` of the steps and from `peak` to `last` over the rest.
double one_cycle(std::int64_t step, std::int64_t total, double pct, double first, double peak, double last) {
  const double up_end = pct * static_cast<double>(total) - 1.0;
  const double s = static_cast<double>(step);
  if (s <= up_end) return anneal(first, peak, up_end > 0 ? s / up_end : 1.0);
  const double down = static_cast<double>(total) - 1.0 - up_end;
  return anneal(peak, last, down > 0 ? (s - up_end) / down : 1.0);
}
}  // namespace

double Schedule::momentum_at(std::int64_t step) const {
  if (kind != ScheduleKind::ONE_CYCLE || !cycle_momentum) return momentum;
  const std::int64_t total = std::max<std::int64_t>(total_steps, 1);
  step = std::clamp<std::int64_t>(step, 0, total - 1);
  return one_cycle(step, total, one_cycle_pct, max_momentum, base_momentum, max_momentum);
}

double Schedule::lr(std::int64_t step) const {
  const std::int64_t total = std::max<std::int64_t>(total_steps, 1);
  step = std::clamp<std::int64_t>(step, 0, total - 1);
  if (kind == ScheduleKind::ONE_CYCLE) {
    // PyTorch OneCycleLR with anneal_strategy='cos' and two phases.
    const double initial = base_lr / div_factor, final_lr = initial / final_div_factor;
    return one_cycle(step, total, one_cycle_pct, initial, base_lr, final_lr);
  }
  if (step < warmup_steps) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const std::int64_t t = step - warmup_steps;
  const std::int64_t span = std::max<std::int64_t>(total - warmup_steps - 1, 1);  // the last step reaches the end
  switch (kind) {
    case ScheduleKind::CONSTANT: return base_lr;
    case ScheduleKind::STEP: return step_size > 0 ? base_lr * std::pow(gamma, static_cast<double>(t / step_size)) : base_lr;
    case ScheduleKind::COSINE: {
      const double end = base_lr * final_lr_fraction;
      return end + (base_lr - end) * 0.5 * (1.0 + std::cos(kPi * static_cast<double>(t) / static_cast<double>(span)));
    }
    case ScheduleKind::ONE_CYCLE: break;
  }
  return base_lr;
}

}  // namespace renaissance::runtime
