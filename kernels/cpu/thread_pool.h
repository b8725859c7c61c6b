// A persistent thread pool for the CPU kernels, and the rule that keeps their results independent of it.
//
// Determinism contract: every kernel decomposes its work into pieces whose boundaries depend only on the
// problem shape (never on the thread count), writes each output element from exactly one piece, and
// combines partial reductions in a fixed order. The pool only decides WHICH thread runs a piece, so a
// run with 1 thread and a run with 2 threads give the same bits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace renaissance::cpu {

/// Body of a parallel loop: processes the half-open index range [begin, end).
using RangeFn = std::function<void(std::int64_t begin, std::int64_t end)>;

class ThreadPool {
 public:
  /// `num_threads` counts the calling thread; 0 means affinity_cpu_count().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(m_workers.size()) + 1; }

  /// Runs fn over [begin, end) in chunks of at least `grain` indices, claimed dynamically by the workers
  /// and the calling thread (guided: each claim takes 1/(2·size) of what is left, so the last chunks are
  /// small and a descheduled thread delays the call by little); returns when all chunks are done. The first exception thrown by a
  /// chunk is rethrown here (the remaining chunks still run). A call from inside a chunk (nesting) or
  /// a range of one chunk runs inline on the calling thread.
  void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const RangeFn& fn);

 private:
  void worker_loop();
  void stop_and_join();  ///< stops the workers and joins them (the destructor, and a constructor that failed)
  void run_chunks();

  std::vector<std::thread> m_workers;
  std::mutex m_call_mutex;  // one parallel_for at a time when several outside threads share the pool
  std::mutex m_mutex;
  std::condition_variable m_work_cv, m_done_cv;
  std::atomic<std::uint64_t> m_generation{0};
  // A worker joins a job (m_active + 1) only while it is open; the caller closes it when its own chunks
  // are done and then waits for the joined workers only, so a worker that was asleep or descheduled
  // (the 2 cores are shared) never holds the caller up.
  std::atomic<bool> m_open{false};
  std::atomic<int> m_active{0};
  bool m_stop = false;

  // The current job (written before m_generation is bumped, read after it is observed).
  const RangeFn* m_fn = nullptr;
  std::int64_t m_end = 0, m_grain = 1;
  std::atomic<std::int64_t> m_next{0};
  std::mutex m_error_mutex;
  std::exception_ptr m_error;
};

/// Processors in this process's affinity mask (sched_getaffinity: taskset, a Slurm step's binding, mpirun
/// --bind-to); std::thread::hardware_concurrency() where there is no mask.
int affinity_cpu_count();

/// The process-wide pool every kernel uses (created on first use with affinity_cpu_count() threads, or
/// RENAISSANCE_CPU_THREADS when that variable is set).
ThreadPool& thread_pool();
/// Replaces the process-wide pool (0: affinity_cpu_count()). Not safe while kernels run.
void set_num_threads(int num_threads);
int num_threads();

/// parallel_for on the process-wide pool; see ThreadPool::parallel_for.
inline void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const RangeFn& fn) {
  thread_pool().parallel_for(begin, end, grain, fn);
}

}  // namespace renaissance::cpu
