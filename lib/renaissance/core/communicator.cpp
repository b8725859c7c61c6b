#include <renaissance/core/communicator.h>
#include <renaissance/core/error.h>

namespace renaissance {

void Communicator::allreduce_device(float* data, std::int64_t count, bool mean, void* stream) {
  (void)data, (void)count, (void)mean, (void)stream;
  RN_CHECK(world_size() == 1, "this communicator has no device all-reduce (a GPU run of {} ranks needs NCCL)",
           world_size());
}

}  // namespace renaissance
