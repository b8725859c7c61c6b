// NcclCommunicator: the collectives of GPU ranks (DESIGN §9). Ranges of the RANGE ops are all-reduced with
// ncclAllReduce on the compute stream, so they are captured in the CUDA graphs with the rest of the step; host
// agreements and the plan broadcast stay on MPI. Rank 0 makes the NCCL unique id and broadcasts it over MPI.
// Failures: a watchdog polls ncclCommGetAsyncError while the host waits for a step and bounds that wait by the
// timeout; either ends in ncclCommAbort (never a blocking destroy) and the process exit that ends the job.
#pragma once

#include <renaissance/dist/mpi_communicator.h>

namespace renaissance::dist {

class NcclCommunicator : public MpiCommunicator {
 public:
  /// Call after cudaSetDevice (select_device). Collective over `comm`.
  NcclCommunicator(MPI_Comm comm, double timeout_s);
  ~NcclCommunicator() override;

  void allreduce_device(float* data, std::int64_t count, bool mean, void* stream) override;
  void device_wait_begin(const char* what) override;
  void device_wait_end() override;
  void set_step(std::int64_t step) override;

 private:
  struct State;
  std::unique_ptr<State> m_state;
  std::unique_ptr<CommWatchdog> m_device_watchdog;
};

}  // namespace renaissance::dist
