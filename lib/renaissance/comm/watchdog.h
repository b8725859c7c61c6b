// CommWatchdog: a thread that ends the job when a collective (or a host wait for device work holding one) does
// not finish within the timeout: a dead, hung or stopped rank must never leave the others waiting forever.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace renaissance::comm {

class CommWatchdog {
 public:
  /// `poll` (optional) runs about every 100 ms while armed and returns a non-empty message on an asynchronous
  /// failure (NCCL); `before_exit` (optional) runs once before the process ends (ncclCommAbort).
  CommWatchdog(int rank, double timeout_s, std::function<std::string()> poll = {},
               std::function<void()> before_exit = {});
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  /// Starts timing `what` (a string literal); disarm() stops. Not nested.
  void arm(const char* what);
  void disarm();
  void set_step(std::int64_t step) { m_step.store(step); }
  double timeout_s() const { return m_timeout_s; }

  /// Prints "rank R: <message> at step S ...; aborting the job" to stderr, runs before_exit and ends the process
  /// with kExitCommFailure (_exit: no destructor, no MPI call that could block). The launcher (mpirun,
  /// srun --kill-on-bad-exit) then ends the other ranks; each of them also has its own watchdog.
  [[noreturn]] void fail(const std::string& message);

 private:
  void run();

  const int m_rank;
  const double m_timeout_s;
  std::function<std::string()> m_poll;
  std::function<void()> m_before_exit;
  std::atomic<const char*> m_what{nullptr};
  std::atomic<std::int64_t> m_armed_at_ns{0};
  std::atomic<std::int64_t> m_step{0};
  std::atomic<bool> m_failing{false};
  std::mutex m_mutex;
  std::condition_variable m_cv;
  bool m_stop = false;
  std::thread m_thread;
};

/// The collective timeout: RENAISSANCE_COMM_TIMEOUT (seconds) when set, else `fallback_s`.
double comm_timeout_from_env(double fallback_s);

}  // namespace renaissance::comm
