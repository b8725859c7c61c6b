// A diagnosis tool for the GPU machine, not a test: trains the realistic residual model (or MODEL_YAML) several
// times in one process with one set of runtime options and prints one hash per training of its per-step losses,
// weights and BN statistics. Run several copies at once (the GPU then interleaves their kernels and shifts every
// stream's timing) and compare the hashes: a run whose hash differs from the others of its variant read bytes
// another stream was still writing, or a buffer it had not written.
//   gpu_race_probe VARIANT REPEATS ENGINE_CACHE DATA [MODEL_YAML]
//   VARIANT: comma-separated: amp, fp32, nostreams, nocache, nofold, nofuse, noreuse, legacy, noown;
//   busy: a host thread keeps 33, 66 or 99 blocks of spinning threads (each about half an SM) on a stream of its own
//   for the whole run, so the training's kernels get other SMs in another order than alone: a kernel whose bits
//   depend on its blocks' schedule (an unordered reduction, a race inside it) shows as another hash.
#include "gpu_models.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/hash.h>
#include <renaissance/io/importers.h>

#include <kernels/cuda/runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

using namespace renaissance;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: gpu_race_probe VARIANT REPEATS ENGINE_CACHE DATA [MODEL_YAML]\n");
    return 2;
  }
  const std::string v = std::string(",") + argv[1] + ",";
  auto has = [&](const char* k) { return v.find(std::string(",") + k + ",") != std::string::npos; };
  const int repeats = std::atoi(argv[2]);
  const std::string data = argv[4];
  if (!std::ifstream(data).good()) io::make_synthetic(data, 700, 256, 32, 32, 3, 10, 11);
  const blueprint::BluePrint model =
      argc > 5 ? blueprint::load_blueprint_file(argv[5]) : test::realistic_residual_model();
  std::atomic<bool> stop{false};
  std::thread busy;
  if (has("busy")) {
    busy = std::thread([&] {
      cuda::relax_capture_mode_for_this_thread();
      cuda::StreamHandle st = cuda::stream_create();
      for (int k = 0; !stop.load(); ++k) {
        cuda::occupy_sms(st, 33 * (1 + k % 3), 300 + 100 * (k % 7));
        cuda::stream_synchronize(st);
      }
      cuda::stream_destroy(st);
    });
  }
  for (int r = 0; r < repeats; ++r) {
    runtime::TrainOptions o = test::residual_run_options(data, has("amp"));
    o.concurrent_streams = !has("nostreams");
    o.fold_residual_sums = !has("nofold");
    o.fuse_kernels = !has("nofuse");
    o.reuse_memory = !has("noreuse");
    if (has("nocache")) o.data_cache = runtime::DataCacheMode::off;
    if (has("legacy")) o.conv_api = 2;
    if (has("noown")) o.own_kernels = 0;
    o.engine_cache = argv[3];
    std::vector<double> losses;
    runtime::Trainer t(model, o);
    runtime::TrainObserver obs;
    obs.on_step_loss = [&](std::int64_t, std::int64_t, double loss) { losses.push_back(loss); };
    const auto history = t.run(obs);
    const std::vector<float> state = t.state_values();
    const std::uint64_t hl = fnv1a(losses.data(), losses.size() * sizeof(double));
    const std::uint64_t hs = fnv1a(state.data(), state.size() * sizeof(float));
    std::printf("probe %s run %d losses %016llx state %016llx first_loss %.9g val_loss %.9g\n", argv[1], r,
                static_cast<unsigned long long>(hl), static_cast<unsigned long long>(hs),
                losses.empty() ? 0.0 : losses[0], history.back().val_loss);
    std::fflush(stdout);
  }
  stop = true;
  if (busy.joinable()) busy.join();
  return 0;
}
