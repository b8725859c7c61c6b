#include "gpu_options.h"

#include <renaissance/core/error.h>
#include <renaissance/runtime/engine_cache_file.h>

#include <CLI/CLI.hpp>

#include <filesystem>

namespace renaissance::app {

void GpuOptions::add_to(CLI::App& cmd) {
  cmd.add_option("--deterministic", deterministic,
                 "GPU: on: deterministic engines and reductions only (same seed, same bits); off: admit "
                 "non-deterministic ones where faster")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--engine-cache", engine_cache,
                 "GPU: file of timed convolution engine choices, reused at the next start-up (auto: engines.txt in "
                 "the checkpoint directory or beside --save, else $XDG_CACHE_HOME/renaissance/engines.txt, by default "
                 "~/.cache/renaissance/engines.txt; off: none)")
      ->capture_default_str();
  cmd.add_option("--conv-api", conv_api,
                 "GPU: cuDNN API of the convolutions: auto (graph API, legacy where no graph plan supports a pass), "
                 "graph (graph API only), legacy (legacy API only, for comparisons)")
      ->check(CLI::IsMember({"auto", "graph", "legacy"}))
      ->capture_default_str();
  cmd.add_option("--own-kernels", own_kernels,
                 "GPU: on: the own depthwise convolution kernels are timed beside cuDNN's engines and kept where "
                 "faster (with --conv-api auto); off: cuDNN only")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--streams", streams,
                 "GPU: on: weight gradients and projection shortcuts on side streams beside the main one; off: one "
                 "compute stream (faster on every model measured on an H100, docs/benchmarks.md)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--conv-stats", conv_stats,
                 "GPU, --amp: on: a batch norm's statistics from its convolution's epilogue (cuDNN GEN_STATS) where "
                 "the start-up timing finds it faster, layer by layer (other bits than off; needs --deterministic off: "
                 "no GEN_STATS plan repeats its bits); off: the own statistics kernel; auto: on with --deterministic "
                 "off, else off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
}

void GpuOptions::apply(runtime::TrainOptions& t, const std::string& run_dir) const {
  t.deterministic = deterministic == "on";
  t.conv_api = conv_api == "graph" ? 1 : conv_api == "legacy" ? 2 : 0;
  t.own_kernels = own_kernels == "on" ? 1 : 0;
  t.concurrent_streams = streams == "on";
  t.conv_stats = conv_stats == "on" || (conv_stats == "auto" && !t.deterministic);
  RN_CHECK(!engine_cache.empty(), "--engine-cache needs a path, auto or off");
  if (engine_cache == "off")
    t.engine_cache.clear();
  else if (engine_cache == "auto")
    t.engine_cache = run_dir.empty() ? runtime::default_engine_cache_path()
                                     : (std::filesystem::path(run_dir) / "engines.txt").string();
  else
    t.engine_cache = engine_cache;
}

}  // namespace renaissance::app
