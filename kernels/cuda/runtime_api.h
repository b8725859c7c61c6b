// The CUDA runtime calls the (C++-only) runtime library needs: memory, copies, streams and graphs.
// No CUDA types leak out, so lib/renaissance/runtime compiles the same with and without a CUDA toolkit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace renaissance::cuda {

using StreamHandle = void*;  ///< a cudaStream_t

void set_device(int index);
int current_device();
/// cudaMalloc + zero fill; an out-of-memory error names `what`, the request and the free/total bytes.
void* device_alloc(std::int64_t bytes, const char* what);
void device_free(void* p) noexcept;
void* pinned_alloc(std::int64_t bytes);
void pinned_free(void* p) noexcept;
/// Synchronous copies (setup, checkpoints, per-epoch reads): they wait for the whole device first.
void copy_h2d(void* dst, const void* src, std::int64_t bytes);
void copy_d2h(void* dst, const void* src, std::int64_t bytes);
/// Synchronous fill of `bytes` device bytes with `value` (after and before waiting for the whole device).
void fill_device(void* dst, int value, std::int64_t bytes);
/// The same fill queued on stream `s` (capturable).
void fill_device_async(void* dst, int value, std::int64_t bytes, StreamHandle s);
/// Asynchronous copy on `stream` (capturable into a graph when src is pinned host memory).
void copy_h2d_async(void* dst, const void* src, std::int64_t bytes, StreamHandle stream);
/// Asynchronous device-to-device copy on `stream`.
void copy_d2d_async(void* dst, const void* src, std::int64_t bytes, StreamHandle stream);

/// The number of hardware work queues CUDA spreads this process's streams over (CUDA_DEVICE_MAX_CONNECTIONS, read
/// when the first CUDA context is made). This library sets it to kHardwareQueues before main() unless the environment
/// already names one: with CUDA's default of 8, a run's ~10 streams share queues, and work queued on one stream waits
/// behind unrelated work of another (nvJPEG's batched decode waited for a whole training step that way; measured in
/// docs/input-pipeline.md). `set_by_user`: the value came from the environment.
constexpr int kHardwareQueues = 32;
int hardware_queues(bool* set_by_user = nullptr);

StreamHandle stream_create();
/// A non-blocking stream of the device's greatest priority: its kernels are dispatched before the other streams'
/// as SMs free up (the JPEG decoders: nvJPEG's call returns only once its kernels have run).
StreamHandle stream_create_urgent();
void stream_destroy(StreamHandle s) noexcept;
void stream_synchronize(StreamHandle s);
using EventHandle = void*;  ///< a cudaEvent_t (timing disabled)
EventHandle event_create();
void event_destroy(EventHandle e) noexcept;
void event_record(EventHandle e, StreamHandle s);
/// Host waits until the work before the last record of `e` has finished.
void event_synchronize(EventHandle e);
/// Work launched on `s` after this call waits for the last record of `e`.
void stream_wait_event(StreamHandle s, EventHandle e);
/// Debugging stream races: a one-thread kernel on `s` that spins for `microseconds` (%globaltimer), so whatever is
/// queued on `s` after it starts that much later than the work of the streams beside it (RN_DEBUG_STREAM_DELAY,
/// runtime/cuda_session.cpp). Captured like any kernel.
void stream_delay(StreamHandle s, int microseconds);
/// Debugging schedule-dependent kernels: `blocks` blocks of 1024 threads on `s` that spin for `microseconds`,
/// holding that many SMs' thread slots (about half an SM each) while other streams' kernels run beside them.
void occupy_sms(StreamHandle s, int blocks, int microseconds);
/// Lets the calling thread make any CUDA call while another thread captures a graph (cudaStreamCaptureModeRelaxed;
/// for debugging threads beside a trainer, which captures in the global mode).
void relax_capture_mode_for_this_thread();
/// Debugging where two runs part (RN_DEBUG_NODE_HASHES, runtime/executor.cpp): kHashParts blocks on `s` hash the
/// `bytes` bytes at `p` (4-byte words, each mixed with its index; a wrapping sum, so the order in which threads add
/// changes nothing), block b writing its part to parts[b]; the hash is the wrapping sum of the parts (hash_combine).
/// Captured like any kernel.
inline constexpr int kHashParts = 32;
void hash_device_async(const void* p, std::int64_t bytes, unsigned long long* parts, StreamHandle s);
/// An event that records a time stamp (profiling only: timing events are slower to record and wait on).
EventHandle event_create_timed();
/// Milliseconds between the last records of `a` and `b`, both made by event_create_timed; waits until `b` has
/// completed first.
float event_elapsed_ms(EventHandle a, EventHandle b);
/// cudaMalloc calls made through device_alloc so far (tests: no allocation after start-up).
std::int64_t device_alloc_count();

/// An instantiated CUDA graph: `capture` records everything `body` launches on `stream` (which must not be
/// the legacy default stream), `launch` replays it.
class GraphExec {
 public:
  static std::unique_ptr<GraphExec> capture(StreamHandle stream, const std::function<void()>& body);
  ~GraphExec();
  void launch(StreamHandle stream) const;
  std::size_t node_count() const { return m_nodes; }

 private:
  GraphExec() = default;
  void* m_graph = nullptr;  // cudaGraph_t
  void* m_exec = nullptr;   // cudaGraphExec_t
  std::size_t m_nodes = 0;
};

}  // namespace renaissance::cuda
