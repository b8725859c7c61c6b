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
#include <string>

namespace renaissance::runtime {

/// Loads `path` into the process-wide engine cache. Returns a line for the log ("" when there is nothing to say);
/// `*entries` gets the number of entries read. CPU-only builds: nothing.
std::string load_engine_cache(const std::string& path, std::size_t* entries = nullptr);
/// Saves the new choices of this process into `path` (nothing when there are none). Returns a line for the log.
std::string save_engine_cache(const std::string& path);
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
