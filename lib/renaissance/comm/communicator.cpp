#include <renaissance/comm/communicator.h>
#include <renaissance/comm/mpi_communicator.h>
#include <renaissance/comm/mpi_session.h>
#include <renaissance/core/error.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <renaissance/comm/nccl_communicator.h>

#include <cuda_runtime_api.h>
#endif

namespace renaissance::comm {

void select_device(int local_rank, int local_size) {
#ifdef RENAISSANCE_HAVE_CUDA
  // The CUDA runtime directly (comm links it for NCCL): comm does not include the kernels (DESIGN §12).
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    n = 0;
  }
  RN_CHECK(local_rank < n,
           "node-local rank {} of {} has no GPU: this node shows {} device(s) (hint: one task per GPU, e.g. "
           "#SBATCH --ntasks-per-node equal to --gpus-per-node; do not narrow CUDA_VISIBLE_DEVICES per rank)",
           local_rank, local_size, n);
  const cudaError_t e = cudaSetDevice(local_rank);
  RN_CHECK(e == cudaSuccess, "cudaSetDevice({}) failed: {}", local_rank, cudaGetErrorString(e));
#else
  (void)local_rank, (void)local_size;
  RN_FAIL("this build has no CUDA backend");
#endif
}

std::unique_ptr<Communicator> open_communicator(Backend backend, double timeout_s) {
  MpiSession* s = MpiSession::current();
  if (backend == Backend::CUDA && s) select_device(s->local_rank(), s->local_size());
  if (!s || s->world_size() == 1) return nullptr;
  RN_CHECK(timeout_s > 0, "--comm-timeout must be > 0 seconds, got {}", timeout_s);
#ifdef RENAISSANCE_HAVE_CUDA
  if (backend == Backend::CUDA) return std::make_unique<NcclCommunicator>(s->world(), timeout_s);
#endif
  RN_CHECK(backend == Backend::CPU, "no communicator for this backend");
  return std::make_unique<MpiCommunicator>(s->world(), timeout_s);
}

}  // namespace renaissance::comm
