#include <renaissance/comm/mpi_communicator.h>
#include <renaissance/comm/mpi_session.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <climits>

namespace renaissance::comm {

namespace {
/// MPI counts are int: longer ranges go in pieces.
constexpr std::int64_t kMaxChunk = std::int64_t{1} << 30;

/// Arms the watchdog for one blocking call.
struct Armed {
  CommWatchdog& w;
  Armed(CommWatchdog& wd, const char* what) : w(wd) { w.arm(what); }
  ~Armed() { w.disarm(); }
};
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : m_comm(comm) {
  MPI_Comm_rank(comm, &m_rank);
  MPI_Comm_size(comm, &m_world);
  // The node-local count MpiSession found (MPI_COMM_TYPE_SHARED) when this is its world, as it always is.
  const MpiSession* session = MpiSession::current();
  if (session && comm == session->world()) m_local_size = session->local_size();
  m_watchdog = std::make_unique<CommWatchdog>(m_rank, timeout_s);
}

MpiCommunicator::~MpiCommunicator() = default;

void MpiCommunicator::checked(const char* what, int rc) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  // A failed collective leaves the other ranks inside it: end the job rather than unwind on this rank alone.
  m_watchdog->fail(fmt::format("{} failed: {}", what, msg));
}

void MpiCommunicator::allreduce_sum(float* data, std::int64_t count) {
  Armed a(*m_watchdog, "MPI_Allreduce (sum)");
  for (std::int64_t off = 0; off < count; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - off));
    checked("MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT, MPI_SUM, m_comm));
  }
}

std::int64_t MpiCommunicator::agree_max(std::int64_t value) {
  Armed a(*m_watchdog, "MPI_Allreduce (max)");
  std::int64_t out = value;
  checked("MPI_Allreduce", MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, m_comm));
  return out;
}

void MpiCommunicator::broadcast(std::vector<std::uint8_t>& bytes, int root) {
  Armed a(*m_watchdog, "MPI_Bcast");
  std::int64_t n = static_cast<std::int64_t>(bytes.size());
  checked("MPI_Bcast", MPI_Bcast(&n, 1, MPI_INT64_T, root, m_comm));
  if (m_rank != root) bytes.resize(static_cast<std::size_t>(n));
  for (std::int64_t off = 0; off < n; off += kMaxChunk) {
    const int c = static_cast<int>(std::min(kMaxChunk, n - off));
    checked("MPI_Bcast", MPI_Bcast(bytes.data() + off, c, MPI_BYTE, root, m_comm));
  }
}

}  // namespace renaissance::comm
