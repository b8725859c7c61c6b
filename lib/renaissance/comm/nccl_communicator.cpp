#include <renaissance/comm/nccl_communicator.h>
#include <renaissance/core/error.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace renaissance::comm {

#define RN_NCCL_CHECK(call)                                                                            \
  do {                                                                                                 \
    const ncclResult_t rn_nccl_rc = (call);                                                            \
    if (rn_nccl_rc != ncclSuccess)                                                                     \
      RN_FAIL("{} failed: {} ({})", #call, ncclGetErrorString(rn_nccl_rc), ncclGetLastError(nullptr)); \
  } while (0)

struct NcclCommunicator::State {
  /// The lanes (core/communicator.h): comm[0] for the compute stream's collectives, comm[1] for bucket 1 on the
  /// trainer's side stream (the same communicator as comm[0] with RENAISSANCE_NCCL_LANES=1).
  ncclComm_t comm[kLanes] = {nullptr, nullptr};
  int lanes = kLanes;
  std::atomic<bool> aborted{false};
  void abort() noexcept {
    if (aborted.exchange(true)) return;
    for (int i = 0; i < lanes; ++i)
      if (comm[i]) ncclCommAbort(comm[i]);  // does not wait for the peers
  }
};

namespace {
/// RENAISSANCE_NCCL_LANES=1: one NCCL communicator for every collective (bucket 2 then waits for bucket 1, as before
/// issue 16); anything else: two.
int lanes_from_env() {
  const char* v = std::getenv("RENAISSANCE_NCCL_LANES");
  return v && std::string(v) == "1" ? 1 : kLanes;
}
}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, double timeout_s)
    : MpiCommunicator(comm, timeout_s), m_state(std::make_unique<State>()) {
  m_state->lanes = lanes_from_env();
  // Every rank makes as many communicators: RENAISSANCE_NCCL_LANES=1 on some ranks only left the others waiting in
  // their second ncclCommInitRank until the watchdog. Agreed over MPI first; every rank then says the same error.
  const std::int64_t most = agree_max(m_state->lanes), least = -agree_max(-m_state->lanes);
  RN_CHECK_CTX(most == least, "RENAISSANCE_NCCL_LANES",
               "the ranks make different numbers of NCCL communicators ({} on this rank, {} to {} over the job): "
               "set it alike on every rank, or on none",
               m_state->lanes, least, most);
  for (int lane = 0; lane < m_state->lanes; ++lane) {
    // One unique id per communicator, made by rank 0 and broadcast over MPI.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (m_rank == 0) RN_NCCL_CHECK(ncclGetUniqueId(&id));
    std::vector<std::uint8_t> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    broadcast(bytes, 0);
    std::memcpy(&id, bytes.data(), sizeof id);
    m_watchdog->arm("ncclCommInitRank");
    const ncclResult_t rc = ncclCommInitRank(&m_state->comm[lane], m_world, id, m_rank);
    m_watchdog->disarm();
    if (rc != ncclSuccess)
      m_watchdog->fail(
          fmt::format("ncclCommInitRank failed: {} ({})", ncclGetErrorString(rc), ncclGetLastError(nullptr)));
  }
  State* st = m_state.get();
  m_device_watchdog = std::make_unique<CommWatchdog>(
      m_rank, timeout_s,
      [st]() -> std::string {
        for (int i = 0; i < st->lanes; ++i) {
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(st->comm[i], &async) != ncclSuccess || async == ncclSuccess) continue;
          if (async == ncclInProgress) continue;
          return fmt::format("NCCL asynchronous error: {} ({})", ncclGetErrorString(async),
                             ncclGetLastError(st->comm[i]));
        }
        return {};
      },
      [st] { st->abort(); });
}

NcclCommunicator::~NcclCommunicator() {
  m_device_watchdog.reset();
  // Abort, not destroy: it frees the communicator without waiting for peers that may be gone.
  m_state->abort();
}

void NcclCommunicator::allreduce_device(float* data, std::int64_t count, bool mean, void* stream) {
  allreduce_device_lane(kLaneCompute, data, count, mean, stream);
}

void NcclCommunicator::allreduce_device_lane(int lane, float* data, std::int64_t count, bool mean, void* stream) {
  RN_CHECK(lane >= 0 && lane < kLanes, "internal: no communicator lane {}", lane);
  ncclComm_t c = m_state->comm[lane < m_state->lanes ? lane : 0];
  RN_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat32, mean ? ncclAvg : ncclSum, c,
                              static_cast<cudaStream_t>(stream)));
}

void NcclCommunicator::device_wait_begin(const char* what) { m_device_watchdog->arm(what); }
void NcclCommunicator::device_wait_end() { m_device_watchdog->disarm(); }
void NcclCommunicator::set_step(std::int64_t step) {
  MpiCommunicator::set_step(step);
  m_device_watchdog->set_step(step);
}

}  // namespace renaissance::comm
