// The plan of a data-parallel run (DESIGN §9): rank 0 alone builds the ArchPlan and compiles it, serialises the
// CompiledPlan and MPI_Bcasts it; every other rank deserialises it (checking its hash) and builds its ArenaKeeper,
// atlas and graphs from those bytes, so every rank holds the same plan by construction. Before that, each rank's
// own inputs of the plan (model, input, per-rank batch, ...) and its run options are compared with rank 0's, so a
// configuration that differs between ranks is the same error on every rank instead of a silent divergence.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/trainer.h>

#include <cstdint>
#include <memory>
#include <string>

namespace renaissance::runtime {

/// "key=value" lines of the options that shape training but are not in the plan (seed, lr, epochs, schedule,
/// augmentation, ...), in a fixed order.
std::string describe_run_options(const TrainOptions& o);

/// "key=value" lines of everything a plan is compiled from: the model (its name, input and a hash of its whole
/// layer tree), the build options and this rank's TrainConfig. Equal texts compile to equal plans.
std::string describe_plan_inputs(const blueprint::BluePrint& model, const plan::BuildOptions& build,
                                 const plan::TrainConfig& config);

/// Collective. Broadcasts rank 0's `description` ("key=value" lines); a rank whose own differs lists the keys that
/// differ, the highest such rank's list is broadcast, and every rank throws the same Error naming that rank.
/// One rank: nothing to check.
void check_replica_inputs(Communicator& comm, const std::string& description);

/// Where this rank's plan came from.
struct PlanOrigin {
  bool compiled_here = true;  ///< false: received from rank 0
  std::int64_t bytes = 0;     ///< size of the serialised plan broadcast (0 with one rank)
  double seconds = 0;         ///< checking, compiling (rank 0) or waiting and deserialising (the others)
};

/// Collective when `comm` has several ranks (nullptr or one rank: compiles here). check_replica_inputs of this
/// rank's describe_plan_inputs + `run_options`; then rank 0 builds and compiles the plan and broadcasts its
/// serialisation (or the error it raised: every rank then throws that error), the other ranks deserialise it and
/// check that it was compiled for their TrainConfig. Only rank 0 calls ArchPlan::build and Compiler::compile.
/// With RENAISSANCE_TEST_PLAN_REPORT set every rank prints one line on stderr: where its plan came from and how
/// many compilations ran in its process (Compiler::compilations()).
std::unique_ptr<plan::CompiledPlan> distribute_plan(Communicator* comm, const blueprint::BluePrint& model,
                                                    const plan::BuildOptions& build, const plan::TrainConfig& config,
                                                    const std::string& run_options, PlanOrigin* origin = nullptr);

}  // namespace renaissance::runtime
