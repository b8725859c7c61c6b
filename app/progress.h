// `renaissance train` progress: a bar over the whole run (bounded by --max-steps) with the running loss, images/s
// and ETA on a terminal; a one-line heartbeat every --log-every steps (Slurm logs, any non-terminal); one line per
// epoch always.
#pragma once

#include <renaissance/runtime/trainer.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace renaissance::app {

struct ProgressOptions {
  std::int64_t epochs = 1;
  std::int64_t max_steps = -1;  ///< --max-steps (-1: the whole run)
  std::int64_t start_step = 0;  ///< a resumed run starts here
  std::int64_t batch = 1;       ///< global batch
  std::int64_t log_every = 0;   ///< heartbeat every this many steps (0: none)
  bool tty = false;  ///< draw the bar (stdout is a terminal)
  std::FILE* out = stdout;
};

class Progress {
 public:
  explicit Progress(ProgressOptions o);

  /// After every optimizer step (TrainObserver::on_step). Draws the bar unless a loss is wanted for this step
  /// (then loss() draws it with the new value).
  void step(std::int64_t epoch, std::int64_t batch, std::int64_t batches, double images_per_s);
  /// Whether the loss of `step` should be read back (a host sync): for a redraw of the bar or a heartbeat.
  bool wants_loss(std::int64_t step) const;
  /// The loss of step `step` (TrainObserver::on_step_loss); updates the running loss, then draws.
  void loss(std::int64_t step, std::int64_t epoch, double loss);
  /// The epoch's line.
  void epoch(const runtime::EpochMetrics& m);

  /// Steps the whole run takes (min(--max-steps, epochs x batches)); 0 before the first step.
  std::int64_t total_steps() const { return m_total; }
  /// Epochs the run trains in (the last one partly when --max-steps ends it early).
  std::int64_t run_epochs() const { return m_run_epochs; }
  /// Seconds left at the current rate; negative when not known yet.
  double eta_seconds() const;
  /// The running loss (exponential average of the losses read), or NaN before the first.
  double running_loss() const { return m_running; }

  /// "1:02:03", "4:05", "17s".
  static std::string format_duration(double seconds);
  /// The heartbeat line (also a test hook).
  std::string heartbeat_line() const;

 private:
  void draw();
  void heartbeat();
  ProgressOptions m_o;
  std::int64_t m_total = 0, m_run_epochs = 0;
  std::int64_t m_step = 0, m_epoch = 0, m_batch = 0, m_batches = 0;
  std::int64_t m_loss_step = 0;    ///< the step of the last loss read
  std::int64_t m_first_step = -1;  ///< the step at which this process's timing starts
  double m_ips = 0;
  double m_running = 0;
  bool m_have_loss = false;
  bool m_bar_shown = false;
  bool m_due_draw = false;
  std::chrono::steady_clock::time_point m_t_first{}, m_last_draw{};
};

}  // namespace renaissance::app
