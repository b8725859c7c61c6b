// Executing a ComputationGraph: a kernel table keyed by (op, backend), nodes resolved once per
// (variant, GraphId) into a CapturedGraph, and the GraphAtlas that deduplicates shape-identical captures.
#pragma once

#include <renaissance/core/communicator.h>
#include <renaissance/plan/computation_graph.h>
#include <renaissance/runtime/device_context.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::runtime {

/// The collectives a RANGE op may need (core/communicator.h; comm/ implements them).
using renaissance::Communicator;

/// A node with every tensor and range resolved for one variant.
struct ResolvedNode {
  const plan::Node* node = nullptr;
  std::vector<TensorView> in, out;
  std::vector<RangeView> in_ranges, out_ranges;
  std::vector<ResolvedNode> sub;
  /// Backend state made once by the op's `prepare` before capture (cuDNN descriptors and algorithms, ...).
  std::shared_ptr<void> state;
  std::string layer;  ///< the ArchPlan layer's name ("" for none)
  /// What `prepare` chose, for the profile (GPU convolutions: "s1.b1.c1 dgrad graph eng63_k25=1"); "" for most ops.
  std::string detail;
  /// A node the backend made itself (a CPU fusion group over plain nodes, KernelTable::fuse_graph); `node` points
  /// into it. Null for the plan's own nodes.
  std::shared_ptr<const plan::Node> owned_node;
};

struct ExecEnv;

/// Kernel timing (`renaissance bench --profile`): when ExecEnv::timer is set, un-captured execution brackets every
/// node with begin/end, except FUSED_* nodes, whose runners bracket each of their steps (a plain part, or one fused
/// kernel group such as "bn+add+relu"). GPU timers record events on env.stream; CPU timers read the clock.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  /// The subgraph whose nodes follow (CapturedGraph::label()).
  virtual void graph(const std::string& label) { (void)label; }
  /// `detail`: the node's ResolvedNode::detail (the profile lists every node that has one on its own row).
  virtual void begin(ExecEnv& env, const std::string& what, const std::string& detail = {}) = 0;
  virtual void end(ExecEnv& env) = 0;
};

/// The compute streams besides the main one (DESIGN §7, §11 lever 3). GPU sessions implement them; CPU: none.
///   kWeightGrad: a weight-gradient pass beside the data-gradient pass that follows it (plan::runs_beside);
///   kBranch: the projection shortcut of a residual block (its conv and BN statistics) beside the main branch.
/// The two never run at the same time (every fork is joined before the next), so they share one workspace and one
/// set of library handles of their own.
enum class SideStream : int { kWeightGrad = 0, kBranch = 1 };
class ComputeStreams {
 public:
  virtual ~ComputeStreams() = default;
  /// From now on env launches on side stream `s` (after everything launched so far on the current one), with the
  /// side streams' workspace and library handles.
  virtual void begin_side(ExecEnv& env, SideStream s) = 0;
  /// env launches on the stream it launched on before begin_side again.
  virtual void end_side(ExecEnv& env, SideStream s) = 0;
  /// Later work on the current stream waits for side stream `s`'s work.
  virtual void join(ExecEnv& env, SideStream s) = 0;
  /// What ops on the side streams must be prepared with in ExecEnv::dnn (the CUDA backend's handle set).
  virtual void* side_dnn() = 0;
};

/// What ops may touch besides the arena.
struct ExecEnv {
  const std::byte* host_input[2] = {nullptr, nullptr};  ///< staging buffers TRANSFER_A/B copy from
  Communicator* comm = nullptr;
  // GPU backend
  void* stream = nullptr;          ///< the compute stream (cudaStream_t) every op launches on
  void* dnn = nullptr;             ///< cuda::DnnHandles*
  std::byte* workspace = nullptr;  ///< one device workspace for cuDNN/cuBLASLt, sized at start-up
  std::int64_t workspace_bytes = 0;
  /// Engines and reductions restricted to deterministic ones (same inputs, same bits). Off: cuDNN engines cuDNN marks
  /// non-deterministic and cuBLASLt's in-place split-K reductions are admitted when they are faster.
  bool deterministic = true;
  /// GPU convolutions: which cuDNN API (0 auto: the graph API, the legacy API where no graph plan supports a pass;
  /// 1 the graph API only; 2 the legacy API only, for comparisons). cuda::ConvEngine's values.
  int conv_api = 0;
  bool sync_bn = false;  ///< BN training statistics over all ranks' samples (--sync-bn; CPU and GPU ranks)
  /// Fused layers run their element-wise work as fused kernels (BN-apply + residual add + ReLU in one pass, the ReLU
  /// backward folded into the BN backward); the CPU also fuses those tails between plain nodes (FP32 plans). Off:
  /// every part runs as its own kernel (for comparisons; the same bits).
  bool fuse_kernels = true;
  OpTimer* timer = nullptr;           ///< set only while profiling, never during a capture
  ComputeStreams* streams = nullptr;  ///< GPU: the weight-gradient stream; null: everything in order on `stream`
};

/// Runs items 0..count-1 in order with `run(i)`. When env.streams is set (and no timer), an item whose node is a
/// weight-gradient pass followed by its data-gradient pass (plan::runs_beside; node_of(i) == nullptr: not a plain node)
/// runs on the side stream beside it, joined right after the data-gradient pass: the two share one program point of
/// the liveness analysis, so no other node sees the overlap.
void run_in_order(std::size_t count, const std::function<const plan::Node*(std::size_t)>& node_of,
                  const std::function<void(std::size_t)>& run, ExecEnv& env);

using OpFn = std::function<void(const ResolvedNode&, ExecEnv&)>;
/// Optional per-node setup before capture (never inside a captured region).
using PrepareFn = std::function<void(ResolvedNode&, ExecEnv&)>;
/// Optional per-backend rewrite of a capture's resolved node list before it is prepared (the CPU backend groups plain
/// nodes whose element-wise tails it fuses, checked by address and against `graph`, the whole graph they come from).
using FuseGraphFn =
    std::function<void(std::vector<ResolvedNode>& nodes, std::vector<const OpFn*>& fns, const plan::CompiledPlan& plan,
                       const plan::ComputationGraph& graph, ExecEnv& env)>;

class KernelTable {
 public:
  /// The built-in table of a backend (CPU today).
  static const KernelTable& for_backend(Backend b);
  void add_compute(plan::OpKind op, OpFn fn, PrepareFn prepare = {});  ///< registering twice is an error
  void add_range(plan::RangeOp op, OpFn fn, PrepareFn prepare = {});
  const OpFn& compute(plan::OpKind op) const;  ///< missing: error naming the op and backend
  const OpFn& range(plan::RangeOp op) const;
  /// Runs the prepare step of a node and of its sub-nodes (recursively), where the op has one.
  void prepare(ResolvedNode& r, ExecEnv& env) const;
  void set_fuse_graph(FuseGraphFn f) { m_fuse_graph = std::move(f); }
  const FuseGraphFn& fuse_graph() const { return m_fuse_graph; }
  Backend backend = Backend::CPU;

 private:
  std::map<plan::OpKind, OpFn> m_compute;
  std::map<plan::RangeOp, OpFn> m_range;
  std::map<plan::OpKind, PrepareFn> m_compute_prepare;
  std::map<plan::RangeOp, PrepareFn> m_range_prepare;
  FuseGraphFn m_fuse_graph;
};

namespace cuda_detail {
struct GraphHolder;
}

/// A captured subgraph. CPU: the resolved node list replayed in order. CUDA: the same list launched once
/// inside a stream capture, instantiated as a cudaGraphExec and replayed with one cudaGraphLaunch.
class CapturedGraph {
 public:
  CapturedGraph(std::vector<ResolvedNode> nodes, std::vector<const OpFn*> fns, std::string label, Backend backend,
                ExecEnv& env);
  ~CapturedGraph();
  void replay(ExecEnv& env) const;
  /// Runs the nodes one by one without the graph (tests: replay must equal this bit for bit).
  void run_uncaptured(ExecEnv& env) const;
  std::size_t size() const { return m_nodes.size(); }
  const std::string& label() const { return m_label; }
  const std::vector<ResolvedNode>& nodes() const { return m_nodes; }

 private:
  std::vector<ResolvedNode> m_nodes;
  std::vector<const OpFn*> m_fns;
  std::string m_label;
  Backend m_backend;
  std::unique_ptr<cuda_detail::GraphHolder> m_graph;
};

/// Resolves one node (and its sub-nodes) for a variant.
ResolvedNode resolve(const plan::Node& n, const DeviceContext& ctx, plan::Variant v);

/// (variant, GraphId) → capture, built lazily once; variants whose resolved tensors are identical share it.
class GraphAtlas {
 public:
  GraphAtlas(const DeviceContext& ctx, const KernelTable& table);
  /// The train graph for train variants, the inference graph for the GraphIds that live there. The first
  /// request of a (variant, GraphId) prepares and captures it with `env`; later ones return the capture.
  const CapturedGraph& get(plan::Variant v, plan::GraphId g, ExecEnv& env);
  std::size_t captures() const { return m_unique.size(); }
  /// Every distinct capture made so far, in signature order.
  std::vector<const CapturedGraph*> all() const;
  std::size_t lookups_deduplicated() const { return m_dedup_hits; }

 private:
  const DeviceContext& m_ctx;
  const KernelTable& m_table;
  std::map<std::pair<int, int>, const CapturedGraph*> m_by_key;
  std::map<std::string, std::unique_ptr<CapturedGraph>> m_unique;  // signature → capture
  std::size_t m_dedup_hits = 0;
};

/// The built-in tables (cpu_ops.cpp; cuda_kernel_table.cpp in CUDA builds).
void register_cpu_ops(KernelTable& t);
void register_cuda_ops(KernelTable& t);

/// What a backend needs alive while a trainer runs (GPU: the stream, cuDNN/cuBLASLt handles, the workspace),
/// wired into an ExecEnv by open_backend.
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  /// Waits until everything launched so far has finished (GPU: the stream; CPU: nothing to wait for).
  virtual void synchronize() {}
  /// Host memory the backend copies from fastest (GPU: pinned), zeroed.
  virtual std::byte* host_alloc(std::int64_t bytes);
  virtual void host_free(std::byte* p) noexcept;

  // Input double buffering (DESIGN §7): batch k+1 is staged on the host and copied to the device while step k
  // runs. Slot s (A = 0, B = 1) owns a pinned staging buffer, a device input buffer and pinned step scalars.
  /// Blocks the host until the work that last used slot `s` (released by release_slot) has finished, so its
  /// pinned buffers may be rewritten. CPU: returns at once.
  virtual void wait_slot(int s) { (void)s; }
  /// Runs `launch` (the TRANSFER graph of slot `s`) on the transfer stream, after the compute work that last
  /// read slot `s`; later compute work waits for the copy. CPU: calls `launch`.
  virtual void transfer(ExecEnv& env, int s, const std::function<void()>& launch) { (void)env, (void)s, launch(); }
  /// Copies per-step scalars from pinned host memory to the device, ordered with the compute work (GPU: an
  /// asynchronous copy on the compute stream). CPU: memcpy.
  virtual void upload_async(std::byte* dst, const std::byte* src, std::int64_t bytes);
  /// Marks the end of the compute work that uses slot `s`.
  virtual void release_slot(int s) { (void)s; }
  /// Runs `launch` on the side stream after everything launched so far on the compute stream (GPU: the gradient
  /// all-reduce of bucket 1 beside the first layer's backward). CPU: calls `launch`.
  virtual void side(ExecEnv& env, const std::function<void()>& launch) { (void)env, launch(); }
  /// Later compute work waits for the side stream's work.
  virtual void join_side(ExecEnv& env) { (void)env; }
  /// Runs `launch` on the update stream after everything launched so far on the compute stream (GPU: the optimizer,
  /// the W → A cast and the EMA beside the BN running statistics and the metrics). CPU: calls `launch`.
  virtual void update(ExecEnv& env, const std::function<void()>& launch) { (void)env, launch(); }
  /// Later compute work waits for the update stream's work.
  virtual void join_update(ExecEnv& env) { (void)env; }
};
/// CPU: a session that does nothing. CUDA: streams + handles + a `workspace_bytes` device workspace (two with
/// `concurrent`: the weight-gradient stream has its own).
std::unique_ptr<BackendSession> open_backend(Backend b, ExecEnv& env, std::int64_t workspace_bytes,
                                             bool concurrent = true);
#ifdef RENAISSANCE_HAVE_CUDA
/// `concurrent`: a second compute stream for weight gradients (ExecEnv::streams).
std::unique_ptr<BackendSession> open_cuda_backend(ExecEnv& env, std::int64_t workspace_bytes,
                                                  bool concurrent);  // cuda_session.cpp
#endif

/// Where a GraphId lives: the train graph or the inference graph.
bool in_inference_graph(plan::GraphId g);

}  // namespace renaissance::runtime
