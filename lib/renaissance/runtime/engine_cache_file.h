// The convolution engine cache on disk (`--engine-cache PATH`, DESIGN §11 lever 5): the process-wide engine choices
// (kernels/cuda/engine_cache.h) loaded before the GPU convolutions choose their engines and saved after, so a second
// start-up neither times again nor chooses differently. A text file, one line per choice, keyed by layer shape,
// dtype, pass, determinism, workspace limit, GPU and cuDNN/cudnn-frontend versions (docs/kernels-cuda.md).
//
// Never fatal: a missing file starts empty, a file that is not an engine cache is ignored with a warning, a file that
// cannot be written is reported and the run goes on. Several processes (ranks, runs) may share one file: writes
// hold an advisory lock (flock on PATH.lock), merge with what the file holds by then (entries already there win,
// so a shared file never changes its mind) and replace it atomically (temporary file, rename).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace renaissance::runtime {

/// Loads `path` into the process-wide engine cache. Returns a line for the log ("" when there is nothing to say);
/// `*entries` gets the number of entries read. CPU-only builds: nothing.
std::string load_engine_cache(const std::string& path, std::size_t* entries = nullptr);
/// Saves the new choices of this process into `path` (nothing when there are none). Returns a line for the log.
/// Takes PATH.lock for the write, unless `held` says this process holds it already (lock_engine_cache).
class EngineCacheLock;
std::string save_engine_cache(const std::string& path, const EngineCacheLock* held = nullptr);

/// The start-up lock of a shared engine cache: held by one process from before it loads the file until it has saved
/// the engines it timed, so that runs starting at the same time on an empty (or incomplete) cache do not each time
/// their own engines, which may differ and then give other bits: the second waits, then reads the first's choices.
/// For single-process runs (under mpirun/srun the ranks start together and may meet in collectives while one times,
/// so they do not hold it). Waits at most `wait_s` seconds for another process (a start-up that hangs must not
/// hang this one too); then goes on without it and `*log` says so. `*log` also says when it waited. nullptr when
/// `path` is empty, the lock file cannot be made, or the wait ran out. CPU-only builds: nullptr.
class EngineCacheLock {
 public:
  ~EngineCacheLock();
  EngineCacheLock(const EngineCacheLock&) = delete;
  EngineCacheLock& operator=(const EngineCacheLock&) = delete;
  const std::string& path() const { return m_path; }

 private:
  friend std::unique_ptr<EngineCacheLock> lock_engine_cache(const std::string&, double, std::string*);
  EngineCacheLock(std::string path, int fd) : m_path(std::move(path)), m_fd(fd) {}
  std::string m_path;
  int m_fd = -1;
};
std::unique_ptr<EngineCacheLock> lock_engine_cache(const std::string& path, double wait_s, std::string* log);
/// Process-wide totals of the GPU convolutions' engine choice so far (start-up figures): seconds spent choosing,
/// choices found in the cache, choices made (timed or from the heuristics). CPU-only builds: zeros.
struct EngineStats {
  double seconds = 0;
  std::size_t cached = 0, chosen = 0;
  std::size_t rejected = 0;   ///< cached choices that could not be made real again (chosen afresh)
  std::string first_rejection;
};
EngineStats engine_stats();

/// Where `--engine-cache auto` keeps the file when a run names no directory of its own:
/// $XDG_CACHE_HOME/renaissance/engines.txt, else ~/.cache/renaissance/engines.txt, else ./renaissance-engines.txt.
std::string default_engine_cache_path();

}  // namespace renaissance::runtime
