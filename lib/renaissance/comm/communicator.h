// The communicator of this process, picked by backend (DESIGN §9): none with one rank, MPI on CPU ranks,
// NCCL on GPU ranks (each rank on the GPU of its node-local rank).
#pragma once

#include <renaissance/core/backend.h>
#include <renaissance/core/communicator.h>

#include <memory>

namespace renaissance::comm {

/// Default of --comm-timeout, seconds.
constexpr double kDefaultCommTimeout = 300.0;

/// nullptr with one rank (or without an MpiSession: unit tests); MpiCommunicator for CPU ranks; for CUDA ranks,
/// cudaSetDevice(local_rank) (an error when the node has fewer GPUs than ranks) then an NcclCommunicator.
/// Collective: every rank calls it with the same backend.
std::unique_ptr<Communicator> open_communicator(Backend backend, double timeout_s);

/// CUDA builds: the GPU this rank uses, cudaSetDevice(local_rank) (before any CUDA allocation of the rank).
void select_device(int local_rank, int local_size);

}  // namespace renaissance::comm
