#include "model_options.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>

#include <fmt/format.h>

#include <cstdlib>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/device_info.h>
#endif

namespace renaissance::app {

void ModelOptions::add_to(CLI::App& cmd) {
  auto* m = cmd.add_option("--model", model, "Zoo model name (resnet18, resnet50, fmnist_cnn, ...)")->capture_default_str();
  auto* f = cmd.add_option("--model-file", model_file, "Model definition in YAML (see models/)");
  m->excludes(f);
  f->excludes(m);
  cmd.add_option("--resolution", resolution, "Input resolution (default: the model's)");
  cmd.add_option("--classes", classes, "Number of classes (default: the model's)");
}

blueprint::BluePrint ModelOptions::load() const {
  if (!model_file.empty()) return blueprint::load_blueprint_file(model_file);
  blueprint::ZooOptions z;
  z.num_classes = classes;
  return blueprint::zoo_model(model, z);
}

void refuse_multi_rank_launch(const char* command) {
  // Data-parallel SPMD training is not in this build yet; N copies of a single-rank run would each train the
  // whole model on the whole data set and write the same files, so refuse instead of wasting the allocation.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {  // set per launched step
    const char* v = std::getenv(var);
    if (v && std::atoi(v) > 1)
      throw Error(fmt::format("launched as {} ranks ({}={}), but multi-rank training is not available in this build",
                              v, var, v),
                  std::string("renaissance ") + command, "run one task (srun -n 1 / mpirun -n 1)");
  }
}

runtime::Backend pick_backend(const std::string& device) {
  RN_CHECK(device == "cpu" || device == "cuda" || device == "auto", "--device must be cpu, cuda or auto, got '{}'",
           device);
#ifdef RENAISSANCE_HAVE_CUDA
  if (device == "cuda" || (device == "auto" && cuda::device_count() > 0)) {
    RN_CHECK(cuda::device_count() > 0, "--device cuda: no CUDA device is visible");
    return runtime::Backend::CUDA;
  }
#else
  RN_CHECK(device != "cuda", "--device cuda: this build has no CUDA backend (configure with -DRENAISSANCE_CUDA=ON)");
#endif
  return runtime::Backend::CPU;
}

}  // namespace renaissance::app
