// Host threads for the input pipeline (issue 12): the loader threads that decode and augment samples, and the
// thread count a machine should use by default (its affinity mask, so a Slurm job's cgroup or `taskset` is honoured).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace renaissance::io {

/// CPUs this process may run on (sched_getaffinity; 1 when unknown).
int available_cpus();

/// A fixed pool of threads running parallel loops. Several callers may submit at once (the batch loader's thread and
/// the trainer's staging); each call blocks until its own loop is done. With 0 threads (or 1) loops run on the
/// calling thread, so results never depend on the thread count: every index is one independent piece of work.
class LoaderPool {
 public:
  explicit LoaderPool(int threads);
  ~LoaderPool();
  LoaderPool(const LoaderPool&) = delete;
  LoaderPool& operator=(const LoaderPool&) = delete;

  int threads() const { return static_cast<int>(m_threads.size()); }
  /// Runs fn(i) for every i in [0, n) on the pool's threads and the calling one (which takes part, so a loop
  /// submitted while the pool is busy still progresses). Scratch memory belongs in thread_local storage of fn. After
  /// an exception no new index starts; the first one is rethrown here once the running ones are done.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t i)>& fn);

 private:
  struct Loop;
  void run();
  void stop_and_join();  ///< stops the threads and joins them (the destructor, and a constructor that failed)
  /// Takes the next index of `loop` (under m_mutex); false when it has none left.
  static bool take(Loop& loop, std::int64_t& i);
  void finish(Loop& loop, std::exception_ptr error);

  std::vector<std::thread> m_threads;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::vector<Loop*> m_loops;  ///< loops with work left
  bool m_stop = false;
};

}  // namespace renaissance::io
