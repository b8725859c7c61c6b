#include <renaissance/core/error.h>
#include <renaissance/dist/nccl_communicator.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>

namespace renaissance::dist {

#define RN_NCCL_CHECK(call)                                                                            \
  do {                                                                                                 \
    const ncclResult_t rn_nccl_rc = (call);                                                            \
    if (rn_nccl_rc != ncclSuccess)                                                                     \
      RN_FAIL("{} failed: {} ({})", #call, ncclGetErrorString(rn_nccl_rc), ncclGetLastError(nullptr)); \
  } while (0)

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  std::atomic<bool> aborted{false};
  void abort() noexcept {
    if (comm && !aborted.exchange(true)) ncclCommAbort(comm);  // does not wait for the peers
  }
};

NcclCommunicator::NcclCommunicator(MPI_Comm comm, double timeout_s)
    : MpiCommunicator(comm, timeout_s), m_state(std::make_unique<State>()) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (m_rank == 0) RN_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<std::uint8_t> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  broadcast(bytes, 0);
  std::memcpy(&id, bytes.data(), sizeof id);
  m_watchdog->arm("ncclCommInitRank");
  const ncclResult_t rc = ncclCommInitRank(&m_state->comm, m_world, id, m_rank);
  m_watchdog->disarm();
  if (rc != ncclSuccess)
    m_watchdog->fail(
        fmt::format("ncclCommInitRank failed: {} ({})", ncclGetErrorString(rc), ncclGetLastError(nullptr)));
  State* st = m_state.get();
  m_device_watchdog = std::make_unique<CommWatchdog>(
      m_rank, timeout_s,
      [st]() -> std::string {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(st->comm, &async) != ncclSuccess || async == ncclSuccess) return {};
        if (async == ncclInProgress) return {};
        return fmt::format("NCCL asynchronous error: {} ({})", ncclGetErrorString(async), ncclGetLastError(st->comm));
      },
      [st] { st->abort(); });
}

NcclCommunicator::~NcclCommunicator() {
  m_device_watchdog.reset();
  // Abort, not destroy: it frees the communicator without waiting for peers that may be gone.
  m_state->abort();
}

void NcclCommunicator::allreduce_device(float* data, std::int64_t count, bool mean, void* stream) {
  RN_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat32, mean ? ncclAvg : ncclSum,
                              m_state->comm, static_cast<cudaStream_t>(stream)));
}

void NcclCommunicator::device_wait_begin(const char* what) { m_device_watchdog->arm(what); }
void NcclCommunicator::device_wait_end() { m_device_watchdog->disarm(); }
void NcclCommunicator::set_step(std::int64_t step) {
  MpiCommunicator::set_step(step);
  m_device_watchdog->set_step(step);
}

}  // namespace renaissance::dist
