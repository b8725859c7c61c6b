// Communicator: the collectives a data-parallel step needs (DESIGN §9). The interface lives in core so that runtime
// (which calls it) and comm (which implements it with MPI and NCCL) never include each other (DESIGN §12).
#pragma once

#include <cstdint>
#include <vector>

namespace renaissance {

/// Device communicators of a GPU rank ("lanes"). kCompute: every collective launched on the compute stream (bucket 2,
/// BN statistics, metrics, --sync-bn); kSide: bucket 1 (G_DEEP_CONV, the DEEP_COMM subgraph), which the trainer replays
/// on its side stream beside the first layer's backward. Two NCCL communicators, so neither queue waits for the other.
enum CommLane : int { kLaneCompute = 0, kLaneSide = 1, kLanes = 2 };

/// Collective operations a RANGE op may need. One rank: the default does nothing.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int world_size() const { return 1; }
  virtual int rank() const { return 0; }
  /// The ranks of this job on this rank's node (1 alone): they share its memory.
  virtual int ranks_on_this_node() const { return 1; }
  virtual void allreduce_sum(float* data, std::int64_t count) { (void)data, (void)count; }
  /// Host-side agreement at a step boundary: the maximum of `value` over all ranks (blocking; e.g. "a rank
  /// received SIGUSR1, so every rank checkpoints and stops"). One rank: `value`.
  virtual std::int64_t agree_max(std::int64_t value) { return value; }
  /// Host-side broadcast of a byte string from `root` (non-roots are resized to the root's length).
  virtual void broadcast(std::vector<std::uint8_t>& bytes, int root = 0) { (void)bytes, (void)root; }
  /// Device all-reduce of `count` floats at device pointer `data`, enqueued on `stream` (a cudaStream_t) so a
  /// CUDA graph captures it; `mean` divides by the world size. Only communicators of GPU ranks have one: the default
  /// throws unless the world has one rank (core/communicator.cpp).
  virtual void allreduce_device(float* data, std::int64_t count, bool mean, void* stream);
  /// The same on device communicator `lane` (CommLane: 0 the compute stream's, 1 bucket 1's on the trainer's side
  /// stream). Communicators with one device communicator: allreduce_device.
  virtual void allreduce_device_lane(int lane, float* data, std::int64_t count, bool mean, void* stream) {
    (void)lane;
    allreduce_device(data, count, mean, stream);
  }
  /// The optimizer step now running (1-based), for the watchdog's messages.
  virtual void set_step(std::int64_t step) { (void)step; }
  /// Brackets a host wait for device work that contains collectives (GPU: the stream synchronisation after a
  /// step), so a watchdog can abort a wait that never ends.
  virtual void device_wait_begin(const char* what) { (void)what; }
  virtual void device_wait_end() {}
};

}  // namespace renaissance
