// MpiCommunicator: the collectives of CPU ranks (DESIGN §9): the gradient buckets, BN statistics and metric
// ranges of the RANGE ops go through MPI_Allreduce in place; host agreements and the plan broadcast too.
// Every blocking call runs under the CommWatchdog.
#pragma once

#include <renaissance/comm/watchdog.h>
#include <renaissance/core/communicator.h>

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace renaissance::comm {

class MpiCommunicator : public Communicator {
 public:
  /// `comm` is borrowed (MpiSession::world()); `timeout_s` bounds every collective.
  MpiCommunicator(MPI_Comm comm, double timeout_s);
  ~MpiCommunicator() override;

  int world_size() const override { return m_world; }
  int rank() const override { return m_rank; }
  int ranks_on_this_node() const override { return m_local_size; }
  void allreduce_sum(float* data, std::int64_t count) override;
  std::int64_t agree_max(std::int64_t value) override;
  void broadcast(std::vector<std::uint8_t>& bytes, int root = 0) override;
  void set_step(std::int64_t step) override { m_watchdog->set_step(step); }

 protected:
  /// Runs an MPI call under the watchdog; an MPI error (MPI_ERRORS_RETURN) becomes an Error naming `what`.
  void checked(const char* what, int rc);
  MPI_Comm m_comm;
  int m_rank = 0, m_world = 1, m_local_size = 1;
  std::unique_ptr<CommWatchdog> m_watchdog;
};

}  // namespace renaissance::comm
