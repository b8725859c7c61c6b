// A diagnosis tool for the GPU machine, not a test: trains the realistic residual model (or MODEL_YAML) several
// times in one process with one set of runtime options and prints one hash per training of its per-step losses,
// weights and BN statistics. Run several copies at once (the GPU then interleaves their kernels and shifts every
// stream's timing) and compare the hashes: a run whose hash differs from the others of its variant read bytes
// another stream was still writing, or a buffer it had not written.
//   gpu_race_probe VARIANT REPEATS ENGINE_CACHE DATA [MODEL_YAML]
//   VARIANT: comma-separated: amp, fp32, nostreams, nocache, nofold, nofuse, noreuse, legacy
#include "gpu_models.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/hash.h>
#include <renaissance/io/importers.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

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
  for (int r = 0; r < repeats; ++r) {
    runtime::TrainOptions o = test::residual_run_options(data, has("amp"));
    o.concurrent_streams = !has("nostreams");
    o.fold_residual_sums = !has("nofold");
    o.fuse_kernels = !has("nofuse");
    o.reuse_memory = !has("noreuse");
    if (has("nocache")) o.data_cache = runtime::DataCacheMode::off;
    if (has("legacy")) o.conv_api = 2;
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
  return 0;
}
