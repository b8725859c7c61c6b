#include <kernels/cpu/thread_pool.h>

#include <renaissance/core/error.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RN_CPU_RELAX() _mm_pause()
#else
#define RN_CPU_RELAX() std::this_thread::yield()
#endif

namespace renaissance::cpu {

namespace {

// Set on pool threads and on a caller while it runs chunks: a nested parallel_for runs inline.
thread_local bool t_inside_pool = false;

// Kernels come back to back within a training step; a worker that just finished one spins this long
// before sleeping, so the next call does not pay a condition-variable wake-up (~20-50 us).
constexpr auto kSpinTime = std::chrono::microseconds(200);

template <class Pred>
bool spin_until(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (pred()) return true;
    RN_CPU_RELAX();
    if ((i & 255) == 0 && std::chrono::steady_clock::now() > until) return pred();
  }
}

int default_thread_count() {
  if (const char* env = std::getenv("RENAISSANCE_CPU_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return affinity_cpu_count();
}

std::mutex& global_pool_mutex() {
  static std::mutex m;
  return m;
}

std::unique_ptr<ThreadPool>& global_pool() {
  // Never destroyed: exit() run on a worker (libgomp's "Out of memory" calls it from the worker that set its OpenMP
  // thread count) destroyed a static pool, whose destructor then joined the calling thread itself: std::system_error
  // "Resource deadlock avoided", std::terminate, exit 134. The process's end stops the workers.
  static auto* pool = new std::unique_ptr<ThreadPool>();
  return *pool;
}

}  // namespace

int affinity_cpu_count() {
#if defined(__linux__)
  // The processors this process may run on (taskset, a Slurm step's cgroup, mpirun --bind-to), not all the
  // machine's: hardware_concurrency counts every online CPU, and threads beyond the mask only take turns.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int num_threads) {
  RN_CHECK(num_threads >= 0, "ThreadPool: thread count {} is negative", num_threads);
  const int n = num_threads == 0 ? default_thread_count() : num_threads;
  m_workers.reserve(static_cast<std::size_t>(n - 1));
  try {
    for (int i = 1; i < n; ++i) m_workers.emplace_back([this] { worker_loop(); });
  } catch (...) {
    // A worker that could not start (EAGAIN: a process or memory limit): no destructor runs for a constructor that
    // throws, so the workers already started are stopped here (left running, the teardown of the members waited on
    // them forever or called std::terminate).
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
    m_generation.fetch_add(1, std::memory_order_release);
  }
  m_work_cv.notify_all();
  for (auto& t : m_workers) t.join();
  m_workers.clear();
}

void ThreadPool::run_chunks() {
  const std::int64_t threads = size();
  for (;;) {
    // Guided self-scheduling: each claim takes a share of what is left (at least the grain), so the chunks
    // shrink towards the end and a thread that was descheduled mid-job (the cores are shared) holds up at
    // most a small last chunk while the others take the rest. Where a chunk ends never changes results
    // (file comment of thread_pool.h).
    std::int64_t b = m_next.load(std::memory_order_relaxed), e = 0;
    do {
      if (b >= m_end) return;
      e = std::min(m_end, b + std::max(m_grain, (m_end - b) / (2 * threads)));
    } while (!m_next.compare_exchange_weak(b, e, std::memory_order_relaxed));
    try {
      (*m_fn)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_error_mutex);
      if (!m_error) m_error = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  t_inside_pool = true;
  std::uint64_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return m_generation.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_work_cv.wait(lock, [&] { return m_generation.load(std::memory_order_acquire) != seen; });
    }
    seen = m_generation.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      if (m_stop) return;
    }
    // Join, then check that the job is still open (seq_cst on both sides, Dekker style): either the
    // caller sees this worker in m_active, or this worker sees the job closed and leaves it alone. A job
    // found open may already be the next one; its fields were published before it opened.
    m_active.fetch_add(1);
    if (m_open.load()) run_chunks();
    if (m_active.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_done_cv.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const RangeFn& fn) {
  if (end <= begin) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t n = end - begin;
  if (m_workers.empty() || t_inside_pool || n <= grain) {
    fn(begin, end);
    return;
  }
  std::lock_guard<std::mutex> call_lock(m_call_mutex);
  m_grain = grain;
  m_fn = &fn;
  m_end = end;
  m_next.store(begin, std::memory_order_relaxed);
  m_error = nullptr;
  m_open.store(true);
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_generation.fetch_add(1, std::memory_order_release);
  }
  m_work_cv.notify_all();

  t_inside_pool = true;
  run_chunks();
  t_inside_pool = false;

  m_open.store(false);
  if (!spin_until([&] { return m_active.load() == 0; })) {
    std::unique_lock<std::mutex> lock(m_mutex);
    m_done_cv.wait(lock, [&] { return m_active.load() == 0; });
  }
  m_fn = nullptr;
  if (m_error) std::rethrow_exception(m_error);
}

ThreadPool& thread_pool() {
  std::lock_guard<std::mutex> lock(global_pool_mutex());
  auto& pool = global_pool();
  if (!pool) pool = std::make_unique<ThreadPool>(0);
  return *pool;
}

void set_num_threads(int num_threads) {
  std::lock_guard<std::mutex> lock(global_pool_mutex());
  auto& pool = global_pool();
  pool.reset();
  pool = std::make_unique<ThreadPool>(num_threads);
}

int num_threads() { return thread_pool().size(); }

}  // namespace renaissance::cpu
