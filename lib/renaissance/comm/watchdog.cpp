#include <renaissance/comm/mpi_session.h>
#include <renaissance/comm/watchdog.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <unistd.h>

namespace renaissance::comm {

namespace {
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

double comm_timeout_from_env(double fallback_s) {
  const char* v = std::getenv("RENAISSANCE_COMM_TIMEOUT");
  if (!v || !*v) return fallback_s;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  return end && *end == '\0' && x > 0 ? x : fallback_s;
}

CommWatchdog::CommWatchdog(int rank, double timeout_s, std::function<std::string()> poll,
                           std::function<void()> before_exit)
    : m_rank(rank), m_timeout_s(timeout_s), m_poll(std::move(poll)), m_before_exit(std::move(before_exit)) {
  m_thread = std::thread([this] { run(); });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_cv.notify_all();
  m_thread.join();
}

void CommWatchdog::arm(const char* what) {
  m_armed_at_ns.store(now_ns());
  m_what.store(what);
}

void CommWatchdog::disarm() { m_what.store(nullptr); }

void CommWatchdog::fail(const std::string& message) {
  if (m_failing.exchange(true)) {  // the other thread is already on its way out
    for (;;) pause();
  }
  const long long step = static_cast<long long>(m_step.load());
  const std::string at = step >= 0 ? fmt::format(" at step {}", step) : std::string();  // -1: start-up, shutdown
  if (m_rank >= 0)
    std::fprintf(stderr, "renaissance: error: rank %d: %s%s; aborting the job\n", m_rank, message.c_str(), at.c_str());
  else
    std::fprintf(stderr, "renaissance: error: %s%s; aborting the job\n", message.c_str(), at.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (m_before_exit) {
    // ncclCommAbort can itself wait on the device; the exit must not depend on it: give it a few seconds.
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([f = m_before_exit, done] {
      f();
      done->store(true);
    }).detach();
    for (int i = 0; i < 50 && !done->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  _exit(kExitCommFailure);
}

void CommWatchdog::run() {
  std::unique_lock<std::mutex> lock(m_mutex);
  while (!m_stop) {
    m_cv.wait_for(lock, std::chrono::milliseconds(100));
    if (m_stop) break;
    const char* what = m_what.load();
    if (!what) continue;
    if (m_poll) {
      const std::string err = m_poll();
      if (!err.empty()) fail(err);
    }
    const double armed_s = static_cast<double>(now_ns() - m_armed_at_ns.load()) * 1e-9;
    if (m_what.load() == what && armed_s > m_timeout_s)
      fail(fmt::format("{} did not finish within {:g} s (--comm-timeout): another rank died, hangs or is stopped", what,
                       m_timeout_s));
  }
}

}  // namespace renaissance::comm
