// GPU options shared by `train` and `bench`: --deterministic, --engine-cache, --conv-api, --own-kernels, --streams,
// --conv-stats.
#pragma once

#include <renaissance/runtime/trainer.h>

#include <string>

namespace CLI {
class App;
}

namespace renaissance::app {

struct GpuOptions {
  std::string deterministic = "on";
  std::string engine_cache = "auto";
  std::string conv_api = "auto";
  std::string own_kernels = "on";
  std::string streams = "off";
  std::string conv_stats = "auto";
  void add_to(CLI::App& cmd);
  /// Sets t.deterministic, t.conv_api, t.own_kernels, t.conv_stats, t.concurrent_streams and t.engine_cache.
  /// `--engine-cache auto` is `run_dir`/engines.txt when the run has a directory of its own (its --checkpoint-dir,
  /// else the directory of --save), else the per-user cache (runtime::default_engine_cache_path()); `off` is none.
  void apply(runtime::TrainOptions& t, const std::string& run_dir) const;
};

}  // namespace renaissance::app
