#include "progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace renaissance::app {

namespace {
constexpr auto kRedraw = std::chrono::milliseconds(200);
constexpr int kBarWidth = 24;
/// Weight of one step in the running loss (it spans about the last 10 steps).
constexpr double kRunningWeight = 0.1;
}  // namespace

Progress::Progress(ProgressOptions o) : m_o(o) { m_running = std::numeric_limits<double>::quiet_NaN(); }

std::string Progress::format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const auto t = static_cast<long long>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}:{:02}", t / 60, t % 60);
  return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
}

double Progress::eta_seconds() const {
  const std::int64_t timed = m_step - m_first_step;  // steps after the first one this process ran
  if (m_first_step < 0 || timed <= 0) return -1;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - m_t_first).count();
  return elapsed / static_cast<double>(timed) * static_cast<double>(std::max<std::int64_t>(0, m_total - m_step));
}

void Progress::step(std::int64_t epoch, std::int64_t batch, std::int64_t batches, double ips) {
  if (m_total == 0) {  // the first step of this process: the run's length is known now
    const std::int64_t all = batches * m_o.epochs;
    m_total = m_o.max_steps > 0 ? std::min(m_o.max_steps, all) : all;
    m_run_epochs = std::max<std::int64_t>(1, (m_total + batches - 1) / std::max<std::int64_t>(1, batches));
    m_step = m_o.start_step;
  }
  ++m_step;
  m_epoch = epoch;
  m_batch = batch;
  m_batches = batches;
  m_ips = ips;
  const auto now = std::chrono::steady_clock::now();
  if (m_first_step < 0) {
    m_first_step = m_step;
    m_t_first = now;
  }
  m_due_draw = m_o.tty && (m_step == m_total || now - m_last_draw >= kRedraw);
  if (!wants_loss(m_step) && m_due_draw) draw();
}

bool Progress::wants_loss(std::int64_t step) const {
  return m_due_draw || (m_o.log_every > 0 && step % m_o.log_every == 0) || (m_o.log_every > 0 && step == m_total);
}

void Progress::loss(std::int64_t step, std::int64_t /*epoch*/, double loss) {
  if (std::isfinite(loss)) {
    // An exponential average over steps, not over the losses read: a loss read after k unread steps stands for
    // those k steps (weight 1 - 0.9^k), so the average spans about 10 steps however sparsely it is sampled.
    const double k = static_cast<double>(std::max<std::int64_t>(1, step - m_loss_step));
    const double w = m_have_loss ? 1 - std::pow(1 - kRunningWeight, k) : 1.0;
    m_running = (1 - w) * (m_have_loss ? m_running : 0.0) + w * loss;
    m_have_loss = true;
    m_loss_step = step;
  }
  if (m_o.log_every > 0 && (step % m_o.log_every == 0 || step == m_total)) heartbeat();
  if (m_due_draw) draw();
}

void Progress::draw() {
  m_due_draw = false;
  m_last_draw = std::chrono::steady_clock::now();
  const double frac = m_total > 0 ? static_cast<double>(m_step) / static_cast<double>(m_total) : 0;
  const int done = std::clamp(static_cast<int>(kBarWidth * frac), 0, kBarWidth);
  const std::string loss = m_have_loss ? fmt::format("  loss {:.4f}", m_running) : std::string();
  const std::string line =
      fmt::format("\r[{}{}] {:3.0f}%  step {}/{}  epoch {}/{} ({}/{}){}  {:.0f} img/s  ETA {}\x1b[K",
                  std::string(static_cast<std::size_t>(done), '#'),
                  std::string(static_cast<std::size_t>(kBarWidth - done), '.'), 100 * frac, m_step, m_total, m_epoch,
                  m_run_epochs, m_batch, m_batches, loss, m_ips, format_duration(eta_seconds()));
  std::fputs(line.c_str(), m_o.out);
  std::fflush(m_o.out);
  m_bar_shown = true;
}

std::string Progress::heartbeat_line() const {
  const std::string loss = m_have_loss ? fmt::format("{:.4f}", m_running) : std::string("?");
  return fmt::format("step {}/{}  epoch {}/{}  batch {}/{}  loss {}  {:.0f} img/s  ETA {}", m_step, m_total, m_epoch,
                     m_run_epochs, m_batch, m_batches, loss, m_ips, format_duration(eta_seconds()));
}

void Progress::heartbeat() {
  if (m_bar_shown) std::fputs("\r\x1b[K", m_o.out);
  m_bar_shown = false;
  std::fprintf(m_o.out, "%s\n", heartbeat_line().c_str());
  std::fflush(m_o.out);
}

void Progress::epoch(const runtime::EpochMetrics& m) {
  if (m_bar_shown) std::fputs("\r\x1b[K", m_o.out);
  m_bar_shown = false;
  std::string ema = m.ema_val_top1 >= 0 ? fmt::format("  ema_top1 {:.4f}", m.ema_val_top1) : "";
  if (m.tta_val_top1 >= 0) ema += fmt::format("  tta_top1 {:.4f}", m.tta_val_top1);
  const std::string val = m.validated ? fmt::format("  val_loss {:.4f}  val_top1 {:.4f}  val_top5 {:.4f}{}",
                                                    m.val_loss, m.val_top1, m.val_top5, ema)
                                      : std::string("  (no validation)");
  const std::int64_t epochs = m_run_epochs > 0 ? m_run_epochs : m_o.epochs;
  std::fprintf(m_o.out, "epoch %lld/%lld  step %lld  train_loss %.4f  train_top1 %.4f%s  %.0f img/s  %.1fs\n",
               static_cast<long long>(m.epoch), static_cast<long long>(epochs), static_cast<long long>(m.step),
               m.train_loss, m.train_top1, val.c_str(), m.images_per_s, m.seconds);
  std::fflush(m_o.out);
}

}  // namespace renaissance::app
