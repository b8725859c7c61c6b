// NcclCommunicator: the collectives of GPU ranks (DESIGN §9). Ranges of the RANGE ops are all-reduced with
// ncclAllReduce on the compute stream, so they are captured in the CUDA graphs with the rest of the step; host
// agreements and the plan broadcast stay on MPI. Two NCCL communicators (lanes): one for the collectives of the
// compute stream, one for gradient bucket 1 on the side stream. Rank 0 makes their unique ids and broadcasts them over
// MPI.
// Failures: a watchdog polls ncclCommGetAsyncError while the host waits for a step and bounds that wait by the
// timeout; either ends in ncclCommAbort (never a blocking destroy) and the process exit that ends the job.
#pragma once

#include <renaissance/comm/mpi_communicator.h>

namespace renaissance::comm {

class NcclCommunicator : public MpiCommunicator {
 public:
  /// Call after cudaSetDevice (select_device). Collective over `comm`.
  NcclCommunicator(MPI_Comm comm, double timeout_s);
  ~NcclCommunicator() override;

  void allreduce_device(float* data, std::int64_t count, bool mean, void* stream) override;
  /// Lane 0: the compute stream's communicator; lane 1 (bucket 1 on the side stream): a second one, so the two
  /// collectives run side by side (core/communicator.h). RENAISSANCE_NCCL_LANES=1: one communicator for both.
  void allreduce_device_lane(int lane, float* data, std::int64_t count, bool mean, void* stream) override;
  void device_wait_begin(const char* what) override;
  void device_wait_end() override;
  void set_step(std::int64_t step) override;

 private:
  struct State;
  std::unique_ptr<State> m_state;
  std::unique_ptr<CommWatchdog> m_device_watchdog;
};

}  // namespace renaissance::comm
