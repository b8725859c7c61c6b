#include <kernels/cuda/common.h>
#include <kernels/cuda/runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace renaissance::cuda {

namespace {
std::atomic<std::int64_t> g_allocs{0};

// Before main(), so before any CUDA context exists (CUDA reads the variable once, when it makes one): 32 hardware
// queues instead of 8, unless the user chose a number (runtime_api.h says why).
struct HardwareQueues {
  bool user = false;
  int n = kHardwareQueues;
  HardwareQueues() {
    const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    user = v && *v;
    if (user)
      n = std::atoi(v) > 0 ? std::atoi(v) : 8;  // CUDA's default for a value it cannot use
    else
      ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(kHardwareQueues).c_str(), 0);
  }
};
const HardwareQueues g_hardware_queues;
}  // namespace

int hardware_queues(bool* set_by_user) {
  if (set_by_user) *set_by_user = g_hardware_queues.user;
  return g_hardware_queues.n;
}

void set_device(int index) { CUDA_CHECK(cudaSetDevice(index)); }

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void* device_alloc(std::int64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Error(fmt::format("cannot allocate {} of {:.2f} GiB on the GPU ({:.2f} GiB free of {:.2f} GiB): {}", what,
                            static_cast<double>(bytes) / (1 << 30), static_cast<double>(free_b) / (1 << 30),
                            static_cast<double>(total_b) / (1 << 30), cudaGetErrorName(e)),
                "cuda", "reduce --batch or the resolution; `renaissance plan` shows the arena size");
  }
  // cudaMemset runs on the legacy default stream, which does not order against the project's streams
  // (cudaStreamNonBlocking): without this wait the zeroing could land after work those streams queue into the new
  // buffer (it did: a JPEG batch's table, copied on the transfer stream right after its allocation, was zeroed
  // under load, GpuJpeg.DecodeAndRenderMatchTheCpuPath).
  CUDA_CHECK(cudaMemset(p, 0, static_cast<size_t>(bytes)));
  CUDA_CHECK(cudaStreamSynchronize(nullptr));
  ++g_allocs;
  return p;
}

void fill_device(void* dst, int value, std::int64_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemset(dst, value, static_cast<size_t>(bytes)));
  CUDA_CHECK(cudaDeviceSynchronize());
}

void fill_device_async(void* dst, int value, std::int64_t bytes, StreamHandle s) {
  CUDA_CHECK(cudaMemsetAsync(dst, value, static_cast<size_t>(bytes), static_cast<cudaStream_t>(s)));
}

void device_free(void* p) noexcept {
  if (p) CUDA_CHECK_NOTHROW(cudaFree(p));
}

void* pinned_alloc(std::int64_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, static_cast<size_t>(bytes)));
  return p;
}

void pinned_free(void* p) noexcept {
  if (p) CUDA_CHECK_NOTHROW(cudaFreeHost(p));
}

// The runtime's streams are non-blocking, which the legacy stream of a plain cudaMemcpy does not wait for: wait for
// the whole device first, so a read sees every launched step and a write never races one.
void copy_h2d(void* dst, const void* src, std::int64_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy returns once the bytes are staged, possibly before the DMA into `dst` is done,
  // and it orders only against the legacy default stream: work launched next on a non-blocking stream (every stream
  // of the runtime) could read `dst` half-written. Wait for the copy itself.
  CUDA_CHECK(cudaDeviceSynchronize());
}
void copy_d2h(void* dst, const void* src, std::int64_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
}
void copy_h2d_async(void* dst, const void* src, std::int64_t bytes, StreamHandle stream) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                             static_cast<cudaStream_t>(stream)));
}

void copy_d2d_async(void* dst, const void* src, std::int64_t bytes, StreamHandle stream) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(stream)));
}

StreamHandle stream_create() {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
StreamHandle stream_create_urgent() {
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  return s;
}
void stream_destroy(StreamHandle s) noexcept {
  if (s) CUDA_CHECK_NOTHROW(cudaStreamDestroy(static_cast<cudaStream_t>(s)));
}
void stream_synchronize(StreamHandle s) { CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s))); }

EventHandle event_create() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void event_destroy(EventHandle e) noexcept {
  if (e) CUDA_CHECK_NOTHROW(cudaEventDestroy(static_cast<cudaEvent_t>(e)));
}
void event_record(EventHandle e, StreamHandle s) {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
}
void event_synchronize(EventHandle e) { CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); }
void stream_wait_event(StreamHandle s, EventHandle e) {
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
}

namespace {
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
}  // namespace

void occupy_sms(StreamHandle s, int blocks, int microseconds) {
  if (microseconds <= 0 || blocks <= 0) return;
  spin_kernel<<<blocks, 1024, 0, static_cast<cudaStream_t>(s)>>>(static_cast<unsigned long long>(microseconds) *
                                                                 1000ull);
  CUDA_CHECK(cudaGetLastError());
}

void relax_capture_mode_for_this_thread() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
}

void stream_delay(StreamHandle s, int microseconds) {
  if (microseconds <= 0) return;
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(static_cast<unsigned long long>(microseconds) * 1000ull);
  CUDA_CHECK(cudaGetLastError());
}

namespace {
__device__ unsigned long long mix64(unsigned long long z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__global__ void __launch_bounds__(256) hash_kernel(const unsigned char* p, long long bytes, unsigned long long* parts) {
  __shared__ unsigned long long partial[256];
  const long long words = bytes / 4;
  const auto* w = reinterpret_cast<const unsigned int*>(p);
  unsigned long long h = 0;
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < words; i += 256ll * gridDim.x)
    h += mix64((static_cast<unsigned long long>(i) << 32) ^ w[i]);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (long long i = words * 4; i < bytes; ++i) h += mix64((static_cast<unsigned long long>(i) << 40) ^ p[i]);
  partial[threadIdx.x] = h;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) parts[blockIdx.x] = partial[0] ^ static_cast<unsigned long long>(bytes);
}
}  // namespace

void hash_device_async(const void* p, std::int64_t bytes, unsigned long long* parts, StreamHandle s) {
  RN_CHECK(reinterpret_cast<std::uintptr_t>(p) % 4 == 0, "hash_device_async: {} is not 4-byte aligned", p);
  hash_kernel<<<kHashParts, 256, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const unsigned char*>(p), bytes, parts);
  CUDA_CHECK(cudaGetLastError());
}

EventHandle event_create_timed() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return e;
}
float event_elapsed_ms(EventHandle a, EventHandle b) {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(b)));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)));
  return ms;
}

std::int64_t device_alloc_count() { return g_allocs.load(); }

std::unique_ptr<GraphExec> GraphExec::capture(StreamHandle stream, const std::function<void()>& body) {
  // The CUDA-graph guard (STYLE habit 12): never capture the legacy default stream.
  RN_CHECK(stream != nullptr, "refusing to capture a CUDA graph on the legacy default stream");
  auto s = static_cast<cudaStream_t>(stream);
  std::unique_ptr<GraphExec> g(new GraphExec());
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  g->m_graph = graph;
  g->m_exec = exec;
  g->m_nodes = nodes;
  return g;
}

GraphExec::~GraphExec() {
  if (m_exec) CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(m_exec)));
  if (m_graph) CUDA_CHECK_NOTHROW(cudaGraphDestroy(static_cast<cudaGraph_t>(m_graph)));
}

void GraphExec::launch(StreamHandle stream) const {
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(m_exec), static_cast<cudaStream_t>(stream)));
}

}  // namespace renaissance::cuda
