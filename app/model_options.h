// Options every command that builds a model shares: --model NAME | --model-file F.yaml, --resolution, --classes.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/runtime/arena_keeper.h>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace renaissance::app {

struct ModelOptions {
  std::string model = "fmnist_cnn";
  std::string model_file;
  std::int64_t resolution = 0;
  std::int64_t classes = 0;

  void add_to(CLI::App& cmd);
  /// The zoo model or the YAML file; errors name the model or file.
  blueprint::BluePrint load() const;
};

/// Throws when launched as several ranks (mpirun/srun -n > 1): multi-rank training is not in this build.
void refuse_multi_rank_launch(const char* command);

/// --device cpu|cuda|auto → a backend; auto picks CUDA when this build has it and a device is visible.
runtime::Backend pick_backend(const std::string& device);

}  // namespace renaissance::app
