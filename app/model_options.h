// Options every command that builds a model shares: --model NAME | --model-file F.yaml, --resolution, --classes.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/runtime/arena_keeper.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/trainer.h>

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

/// Data-parallel launches (mpirun/srun -n N): true on rank 0 and in a one-rank run. Progress, summaries and
/// output files are rank 0's; every rank still reports its own errors, prefixed with its rank.
bool is_root_rank();
/// A barrier over all ranks (no-op with one rank), under the communicator's watchdog.
void barrier(runtime::Communicator* comm);
/// --comm-timeout on `cmd`: seconds a collective may take before the job is aborted (RENAISSANCE_COMM_TIMEOUT
/// is the default when set; the command line wins).
void add_comm_timeout_option(CLI::App& cmd, double& seconds);

/// --device cpu|cuda|auto → a backend; auto picks CUDA when this build has it and a device is visible.
runtime::Backend pick_backend(const std::string& device);

/// eval's and predict's --val-resize (default -1: the one the weights or checkpoint record, else 0).
void add_val_resize_option(CLI::App& cmd, std::int64_t& val_resize);
/// The short side eval and predict resize images of another size to: --val-resize when given, else the writer's run's
/// (recorded in checkpoints and weights files), else 0 (size/0.875). The run validated with it: scoring with the
/// default gave another top-1 than training reported for the same weights.
std::int64_t scoring_val_resize(std::int64_t given, const runtime::InitialState& file);

}  // namespace renaissance::app
