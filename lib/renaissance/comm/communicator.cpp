#include <renaissance/core/error.h>
#include <renaissance/comm/communicator.h>
#include <renaissance/comm/mpi_communicator.h>
#include <renaissance/comm/mpi_session.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <renaissance/comm/nccl_communicator.h>

#include <kernels/cuda/device_info.h>
#include <kernels/cuda/runtime_api.h>
#endif

namespace renaissance::comm {

void select_device(int local_rank, int local_size) {
#ifdef RENAISSANCE_HAVE_CUDA
  const int n = cuda::device_count();
  RN_CHECK(local_rank < n,
           "node-local rank {} of {} has no GPU: this node shows {} device(s) (hint: one task per GPU, e.g. "
           "#SBATCH --ntasks-per-node equal to --gpus-per-node; do not narrow CUDA_VISIBLE_DEVICES per rank)",
           local_rank, local_size, n);
  cuda::set_device(local_rank);
#else
  (void)local_rank, (void)local_size;
  RN_FAIL("this build has no CUDA backend");
#endif
}

std::unique_ptr<runtime::Communicator> open_communicator(runtime::Backend backend, double timeout_s) {
  MpiSession* s = MpiSession::current();
  if (backend == runtime::Backend::CUDA && s) select_device(s->local_rank(), s->local_size());
  if (!s || s->world_size() == 1) return nullptr;
  RN_CHECK(timeout_s > 0, "--comm-timeout must be > 0 seconds, got {}", timeout_s);
#ifdef RENAISSANCE_HAVE_CUDA
  if (backend == runtime::Backend::CUDA) return std::make_unique<NcclCommunicator>(s->world(), timeout_s);
#endif
  RN_CHECK(backend == runtime::Backend::CPU, "no communicator for this backend");
  return std::make_unique<MpiCommunicator>(s->world(), timeout_s);
}

}  // namespace renaissance::comm
