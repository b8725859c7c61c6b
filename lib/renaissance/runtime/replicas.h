// Replica check of a data-parallel run (DESIGN §9): rank 0's compiled plan and run options are broadcast and
// every rank compares them with its own, so a configuration that differs between ranks is an error on every
// rank instead of a silent divergence.
#pragma once

#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/trainer.h>

#include <string>

namespace renaissance::runtime {

/// "key=value" lines of the options that shape training but are not in the plan (seed, lr, epochs, schedule,
/// augmentation, ...), in a fixed order.
std::string describe_run_options(const TrainOptions& o);

/// Collective. Broadcasts rank 0's serialised plan and `run_options`; a rank whose own plan hash or options
/// differ describes the difference (the fields that differ, both plan hashes), the highest such rank's
/// description is broadcast, and every rank throws the same Error naming that rank. One rank: nothing to check.
void check_replicas(Communicator& comm, const plan::CompiledPlan& plan, const std::string& run_options);

}  // namespace renaissance::runtime
