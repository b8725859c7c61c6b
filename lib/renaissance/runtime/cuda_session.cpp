// The CUDA backend's session: streams, events, workspaces and pinned staging of one GPU rank (DESIGN §7).
#include <renaissance/runtime/cuda_adapters.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace renaissance::runtime {

namespace cuda_backend {
namespace {

/// RN_DEBUG_STREAM_DELAY (a debugging aid, docs/kernels-cuda.md): "who:microseconds,...", each delaying one side of
/// one kind of fork by a spin kernel, so a missing wait between two streams shows as other bits (the same run must
/// give the same bits with any delay). who: wgrad, branch, comm, update, transfer (the forked stream's work starts
/// later) or main-wgrad, main-branch, main-comm, main-update (the forking stream's work after the fork does).
struct StreamDelays {
  enum Who { kWgrad, kBranch, kComm, kUpdate, kTransfer, kCount };
  int side[kCount] = {}, main[kCount] = {};
  static StreamDelays from_environment() {
    StreamDelays d;
    const char* v = std::getenv("RN_DEBUG_STREAM_DELAY");
    if (v == nullptr || *v == '\0') return d;
    static const char* const names[kCount] = {"wgrad", "branch", "comm", "update", "transfer"};
    std::string list = v;
    for (std::size_t a = 0; a < list.size();) {
      const std::size_t b = std::min(list.find(',', a), list.size());
      std::string item = list.substr(a, b - a);
      a = b + 1;
      const std::size_t colon = item.find(':');
      RN_CHECK(colon != std::string::npos, "RN_DEBUG_STREAM_DELAY: '{}' is not who:microseconds", item);
      std::string who = item.substr(0, colon);
      const int us = std::atoi(item.c_str() + colon + 1);
      const bool on_main = who.rfind("main-", 0) == 0;
      if (on_main) who = who.substr(5);
      int k = 0;
      while (k < kCount && who != names[k]) ++k;
      RN_CHECK(k < kCount && !(on_main && k == kTransfer), "RN_DEBUG_STREAM_DELAY: unknown stream '{}'", item);
      (on_main ? d.main : d.side)[k] = us;
    }
    spdlog::warn("RN_DEBUG_STREAM_DELAY={}: streams are delayed on purpose (race hunting), the run is slower", v);
    return d;
  }
};

/// The GPU session (DESIGN §7): the main compute stream with its handles and workspace; a second compute stream for
/// weight gradients (its own cuDNN handle and workspace); the transfer stream (input double buffering); the side
/// stream of the bucket-1 all-reduce; pinned staging.
class CudaSession : public BackendSession, public ComputeStreams {
 public:
  CudaSession(ExecEnv& env, std::int64_t workspace_bytes, bool concurrent)
      : m_delays(StreamDelays::from_environment()) {
    m_stream = cuda::stream_create();
    m_env.dnn = &cuda::DnnHandles::for_device(cuda::current_device());
    m_env.dnn->set_stream(static_cast<cudaStream_t>(m_stream));
    m_env.label_errors = static_cast<std::int32_t*>(cuda::device_alloc(256, "the label error counter"));
    guard_device_memory({"the cuDNN/cuBLASLt workspace", 0, workspace_bytes * (concurrent ? 2 : 1), 0});
    m_workspace = static_cast<std::byte*>(cuda::device_alloc(workspace_bytes, "the cuDNN/cuBLASLt workspace"));
    m_workspace_bytes = workspace_bytes;
    if (concurrent) {
      for (auto& st : m_side_streams) st = cuda::stream_create();
      m_side_dnn = std::make_unique<cuda::DnnHandles>();
      m_env.wgrad_dnn = m_side_dnn.get();
      m_side_env = m_env;
      m_side_env.dnn = m_side_dnn.get();
      m_side_workspace =
          static_cast<std::byte*>(cuda::device_alloc(workspace_bytes, "the side compute streams' workspace"));
      for (auto& e : m_side_fork) e = cuda::event_create();
      for (auto& e : m_side_done) e = cuda::event_create();
      env.streams = this;
    }
    env.stream = m_stream;
    env.dnn = &m_env;
    env.workspace = m_workspace;
    env.workspace_bytes = workspace_bytes;
    m_transfer_stream = cuda::stream_create();
    m_transferred = cuda::event_create();
    for (auto& e : m_slot_done) e = cuda::event_create();
    m_comm_stream = cuda::stream_create();
    m_fork = cuda::event_create();
    m_joined = cuda::event_create();
    m_update_stream = cuda::stream_create();
    m_update_fork = cuda::event_create();
    m_update_done = cuda::event_create();
    if (const char* path = std::getenv("RN_DEBUG_NODE_HASHES"); path != nullptr && *path != '\0') {
      m_hash_path = path;
      const char* steps = std::getenv("RN_DEBUG_NODE_HASH_STEPS");
      m_hash_steps = steps != nullptr ? std::max(1, std::atoi(steps)) : 2;
      m_hashes.capacity = 1 << 16;
      m_hashes.device = static_cast<unsigned long long*>(cuda::device_alloc(
          static_cast<std::int64_t>(m_hashes.capacity) * cuda::kHashParts * 8, "the RN_DEBUG_NODE_HASHES slots"));
      env.node_hashes = &m_hashes;
      spdlog::warn("RN_DEBUG_NODE_HASHES={}: every node's inputs and outputs are hashed in the first {} steps (slower)",
                   path, m_hash_steps);
    }
  }
  ~CudaSession() override {
    if (m_side_streams[0]) {
      for (std::size_t i = 0; i < 2; ++i) {
        cuda::stream_synchronize(m_side_streams[i]);
        cuda::event_destroy(m_side_fork[i]);
        cuda::event_destroy(m_side_done[i]);
        cuda::stream_destroy(m_side_streams[i]);
      }
      cuda::device_free(m_side_workspace);
    }
    cuda::stream_synchronize(m_update_stream);
    cuda::event_destroy(m_update_fork);
    cuda::event_destroy(m_update_done);
    cuda::stream_destroy(m_update_stream);
    cuda::stream_synchronize(m_transfer_stream);
    cuda::stream_synchronize(m_comm_stream);
    cuda::stream_synchronize(m_stream);
    cuda::event_destroy(m_fork);
    cuda::event_destroy(m_joined);
    cuda::stream_destroy(m_comm_stream);
    for (auto& e : m_slot_done) cuda::event_destroy(e);
    cuda::event_destroy(m_transferred);
    cuda::stream_destroy(m_transfer_stream);
    cuda::device_free(m_workspace);
    cuda::device_free(m_hashes.device);  // after every stream is done (hash kernels run on all of them)
    cuda::device_free(m_env.label_errors);
    cuda::stream_destroy(m_stream);
  }
  void synchronize() override { cuda::stream_synchronize(m_stream); }
  std::byte* host_alloc(std::int64_t bytes) override {
    auto* p = static_cast<std::byte*>(cuda::pinned_alloc(bytes));
    std::memset(p, 0, static_cast<std::size_t>(bytes));
    return p;
  }
  void host_free(std::byte* p) noexcept override { cuda::pinned_free(p); }

  void wait_slot(int s) override { cuda::event_synchronize(m_slot_done[s & 1]); }
  void transfer(ExecEnv& env, int s, const std::function<void()>& launch) override {
    // The copy into device buffer s waits for the compute work that last read it (the step two batches ago),
    // runs beside the current step on its own stream, and the next compute work waits for it.
    cuda::stream_wait_event(m_transfer_stream, m_slot_done[s & 1]);
    cuda::stream_delay(m_transfer_stream, m_delays.side[StreamDelays::kTransfer]);
    launch_on(env, m_transfer_stream, launch);
    cuda::event_record(m_transferred, m_transfer_stream);
    cuda::stream_wait_event(m_stream, m_transferred);
  }
  void upload_async(std::byte* dst, const std::byte* src, std::int64_t bytes) override {
    cuda::copy_h2d_async(dst, src, bytes, m_stream);
  }
  void release_slot(int s) override { cuda::event_record(m_slot_done[s & 1], m_stream); }
  void side(ExecEnv& env, const std::function<void()>& launch) override {
    cuda::event_record(m_fork, m_stream);
    cuda::stream_wait_event(m_comm_stream, m_fork);
    cuda::stream_delay(m_comm_stream, m_delays.side[StreamDelays::kComm]);
    cuda::stream_delay(m_stream, m_delays.main[StreamDelays::kComm]);
    launch_on(env, m_comm_stream, launch);
    cuda::event_record(m_joined, m_comm_stream);
  }
  void join_side(ExecEnv& env) override { cuda::stream_wait_event(m_stream, m_joined); }
  void update(ExecEnv& env, const std::function<void()>& launch) override {
    cuda::event_record(m_update_fork, m_stream);
    cuda::stream_wait_event(m_update_stream, m_update_fork);
    cuda::stream_delay(m_update_stream, m_delays.side[StreamDelays::kUpdate]);
    cuda::stream_delay(m_stream, m_delays.main[StreamDelays::kUpdate]);
    launch_on(env, m_update_stream, launch);
    cuda::event_record(m_update_done, m_update_stream);
  }
  void join_update(ExecEnv& env) override { cuda::stream_wait_event(m_stream, m_update_done); }

  // ComputeStreams: the weight-gradient and branch streams.
  void begin_side(ExecEnv& env, SideStream s) override {
    const auto i = static_cast<std::size_t>(s);
    cuda::event_record(m_side_fork[i], env.stream);
    cuda::stream_wait_event(m_side_streams[i], m_side_fork[i]);
    const int who = s == SideStream::kWeightGrad ? StreamDelays::kWgrad : StreamDelays::kBranch;
    cuda::stream_delay(m_side_streams[i], m_delays.side[who]);
    cuda::stream_delay(env.stream, m_delays.main[who]);
    m_main_stream_of_side = env.stream;
    env.stream = m_side_streams[i];
    env.workspace = m_side_workspace;
    env.dnn = &m_side_env;
  }
  void end_side(ExecEnv& env, SideStream s) override {
    const auto i = static_cast<std::size_t>(s);
    cuda::event_record(m_side_done[i], m_side_streams[i]);
    env.stream = m_main_stream_of_side;
    env.workspace = m_workspace;
    env.dnn = &m_env;
  }
  void join(ExecEnv& env, SideStream s) override {
    cuda::stream_wait_event(env.stream, m_side_done[static_cast<std::size_t>(s)]);
  }
  void* side_dnn() override { return &m_side_env; }
  void trace_node_hashes(std::int64_t step) override {
    if (m_hashes.device == nullptr || step > m_hash_steps) return;
    for (cuda::StreamHandle st :
         {m_stream, m_transfer_stream, m_comm_stream, m_update_stream, m_side_streams[0], m_side_streams[1]})
      if (st) cuda::stream_synchronize(st);
    const std::size_t n = m_hashes.labels.size();
    std::vector<unsigned long long> parts(n * cuda::kHashParts);
    if (n > 0) cuda::copy_d2h(parts.data(), m_hashes.device, static_cast<std::int64_t>(parts.size() * 8));
    std::FILE* f = std::fopen(m_hash_path.c_str(), step <= 1 ? "w" : "a");
    RN_CHECK(f != nullptr, "RN_DEBUG_NODE_HASHES: cannot write '{}'", m_hash_path);
    for (std::size_t i = 0; i < n; ++i) {
      unsigned long long h = 0;
      for (int k = 0; k < cuda::kHashParts; ++k) h += parts[i * cuda::kHashParts + static_cast<std::size_t>(k)];
      std::fprintf(f, "step %lld\tslot %zu\t%016llx\t%s\n", static_cast<long long>(step), i, h,
                   m_hashes.labels[i].c_str());
    }
    std::fclose(f);
  }
  void fill_workspaces(int byte) override {
    cuda::fill_device(m_workspace, byte, m_workspace_bytes);
    if (m_side_workspace) cuda::fill_device(m_side_workspace, byte, m_workspace_bytes);
  }

 private:
  /// Runs `launch` with env.stream = `s` (what every op launches on), back to the compute stream after.
  void launch_on(ExecEnv& env, cuda::StreamHandle s, const std::function<void()>& launch) {
    env.stream = s;
    try {
      launch();
    } catch (...) {
      env.stream = m_stream;
      throw;
    }
    env.stream = m_stream;
  }

  StreamDelays m_delays;
  NodeHashes m_hashes;
  std::string m_hash_path;
  std::int64_t m_hash_steps = 0;
  cuda::StreamHandle m_stream = nullptr;
  cuda::StreamHandle m_transfer_stream = nullptr;
  cuda::EventHandle m_transferred = nullptr;
  cuda::EventHandle m_slot_done[2] = {nullptr, nullptr};
  cuda::StreamHandle m_comm_stream = nullptr;  ///< bucket-1 all-reduce beside the first layer's backward
  cuda::EventHandle m_fork = nullptr, m_joined = nullptr;
  cuda::StreamHandle m_update_stream = nullptr;  ///< optimizer, casts and EMA beside the statistics and metrics
  cuda::EventHandle m_update_fork = nullptr, m_update_done = nullptr;
  CudaEnv m_env;
  std::byte* m_workspace = nullptr;
  std::int64_t m_workspace_bytes = 0;  ///< of each workspace
  // the side compute streams (SideStream order; null when not concurrent), sharing one workspace and handles
  cuda::StreamHandle m_side_streams[2] = {nullptr, nullptr};
  cuda::EventHandle m_side_fork[2] = {nullptr, nullptr}, m_side_done[2] = {nullptr, nullptr};
  cuda::StreamHandle m_main_stream_of_side = nullptr;  ///< the stream begin_side forked from (main or the comm side)
  std::unique_ptr<cuda::DnnHandles> m_side_dnn;
  CudaEnv m_side_env;
  std::byte* m_side_workspace = nullptr;
};

}  // namespace
}  // namespace cuda_backend

std::unique_ptr<BackendSession> open_cuda_backend(ExecEnv& env, std::int64_t workspace_bytes, bool concurrent) {
  return std::make_unique<cuda_backend::CudaSession>(env, workspace_bytes, concurrent);
}

}  // namespace renaissance::runtime
