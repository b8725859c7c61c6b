#include <renaissance/io/loader_pool.h>

#include <algorithm>

#include <sched.h>

namespace renaissance::io {

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

struct LoaderPool::Loop {
  const std::function<void(std::int64_t)>* fn = nullptr;
  std::int64_t n = 0, taken = 0, finished = 0;
  bool stop = false;
  std::exception_ptr error;
  std::condition_variable done;
  bool has_work() const { return !stop && taken < n; }
};

LoaderPool::LoaderPool(int threads) {
  try {
    for (int t = 0; t < threads; ++t) m_threads.emplace_back([this] { run(); });
  } catch (...) {
    // A thread that could not start (EAGAIN: a process or memory limit): the destructor does not run for a
    // constructor that throws, so the threads already started are stopped here (left running, the members' teardown
    // waited on them forever or called std::terminate).
    stop_and_join();
    throw;
  }
}

LoaderPool::~LoaderPool() { stop_and_join(); }

void LoaderPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_cv.notify_all();
  for (std::thread& t : m_threads) t.join();
  m_threads.clear();
}

bool LoaderPool::take(Loop& loop, std::int64_t& i) {
  if (!loop.has_work()) return false;
  i = loop.taken++;
  return true;
}

void LoaderPool::finish(Loop& loop, std::exception_ptr error) {
  // m_mutex held.
  if (error && !loop.error) {
    loop.error = error;
    loop.stop = true;
  }
  ++loop.finished;
  if (!loop.has_work()) {
    m_loops.erase(std::remove(m_loops.begin(), m_loops.end(), &loop), m_loops.end());
    if (loop.finished == loop.taken) loop.done.notify_all();
  }
}

void LoaderPool::run() {
  std::unique_lock<std::mutex> lock(m_mutex);
  for (;;) {
    m_cv.wait(lock, [&] { return m_stop || !m_loops.empty(); });
    if (m_stop) return;
    Loop& loop = *m_loops.front();
    std::int64_t i = 0;
    if (!take(loop, i)) {  // cannot happen: loops without work leave the list
      m_loops.erase(m_loops.begin());
      continue;
    }
    if (!loop.has_work()) m_loops.erase(std::remove(m_loops.begin(), m_loops.end(), &loop), m_loops.end());
    lock.unlock();
    std::exception_ptr error;
    try {
      (*loop.fn)(i);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    finish(loop, error);
  }
}

void LoaderPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  if (m_threads.empty() || n == 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Loop loop;
  loop.fn = &fn;
  loop.n = n;
  std::unique_lock<std::mutex> lock(m_mutex);
  m_loops.push_back(&loop);
  m_cv.notify_all();
  std::int64_t i = 0;
  while (take(loop, i)) {
    if (!loop.has_work()) m_loops.erase(std::remove(m_loops.begin(), m_loops.end(), &loop), m_loops.end());
    lock.unlock();
    std::exception_ptr error;
    try {
      fn(i);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    finish(loop, error);
  }
  loop.done.wait(lock, [&] { return !loop.has_work() && loop.finished == loop.taken; });
  m_loops.erase(std::remove(m_loops.begin(), m_loops.end(), &loop), m_loops.end());
  if (loop.error) std::rethrow_exception(loop.error);
}

}  // namespace renaissance::io
