// What an op runs with: a node resolved for one variant (ResolvedNode), the environment ops may touch besides the
// arena (ExecEnv: streams, library handles, workspace, communicator, timer) and the side compute streams.
#pragma once

#include <renaissance/core/communicator.h>
#include <renaissance/plan/computation_graph.h>
#include <renaissance/runtime/device_context.h>

#include <cstdint>
#include <functional>
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
  /// FUSED_*: per fused pass (plan::Node::fusions), its "mask" operand (plan_relu_masks; a null view: none).
  std::vector<TensorView> pass_masks;
  /// pass_masks[pass], or a null view (no such pass, no mask).
  TensorView pass_mask(int pass) const {
    return pass >= 0 && static_cast<std::size_t>(pass) < pass_masks.size() ? pass_masks[static_cast<std::size_t>(pass)]
                                                                           : TensorView{};
  }
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

/// RN_DEBUG_NODE_HASHES (debugging where two runs part, docs/kernels-cuda.md): one slot of cuda::kHashParts partial
/// hashes per hashed tensor (the inputs of every node before it runs, its outputs after), on the device; labels[i]
/// names slot i ("<graph> #<node> <op> <layer> in0"). Slots are handed out as nodes are launched or captured, so a
/// captured graph rewrites its own slots at every replay. Made by the CUDA session when the variable is set.
struct NodeHashes {
  unsigned long long* device = nullptr;
  int capacity = 0;  ///< slots
  std::vector<std::string> labels;
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
  /// With conv_api 0, the own depthwise kernels: 1 timed beside cuDNN's choice, the faster kept; 0 off; 2 always
  /// (TrainOptions::own_kernels).
  int own_kernels = 1;
  /// GPU, FP16 fused layers: a training BN's statistics from its convolution's GEN_STATS epilogue where that is timed
  /// faster (TrainOptions::conv_stats, cuda::ConvOp::choose_stats).
  bool conv_stats = false;
  bool sync_bn = false;  ///< BN training statistics over all ranks' samples (--sync-bn; CPU and GPU ranks)
  /// Fused layers run their element-wise work as the compiler's fused passes (BN-apply + residual add + ReLU in one
  /// pass, the ReLU backward folded into the BN backward), FP32 and AMP plans alike. Off: every part runs as its own
  /// kernel (for comparisons; the same bits).
  bool fuse_kernels = true;
  OpTimer* timer = nullptr;           ///< set only while profiling, never during a capture
  ComputeStreams* streams = nullptr;  ///< GPU: the weight-gradient stream; null: everything in order on `stream`
  NodeHashes* node_hashes = nullptr;  ///< RN_DEBUG_NODE_HASHES only
};

/// Runs items 0..count-1 in order with `run(i)`. When env.streams is set (and no timer), an item whose node is a
/// weight-gradient pass followed by its data-gradient pass (plan::runs_beside; node_of(i) == nullptr: not a plain node)
/// runs on the side stream beside it, joined right after the data-gradient pass: the two share one program point of
/// the liveness analysis, so no other node sees the overlap.
void run_in_order(std::size_t count, const std::function<const plan::Node*(std::size_t)>& node_of,
                  const std::function<void(std::size_t)>& run, ExecEnv& env);

/// Debugging reads of stale workspace bytes (RN_DEBUG_POISON_WORKSPACE, docs/kernels-cuda.md): a comma-separated list
/// of kernel labels as the profile names them ("CONV_BWD_DATA", "bn+relu", ...; "all": every one). Before each
/// listed kernel, GPU runs fill env.workspace with 0xFF bytes (NaN), on its stream (captured like the kernel), so a
/// kernel that reads workspace bytes it did not write first changes the run. Nothing when unset or on the CPU.
void debug_poison_workspace(const char* label, ExecEnv& env);

/// With env.node_hashes (RN_DEBUG_NODE_HASHES): queues on env.stream the hashes of node `index` of graph `graph`'s
/// inputs (`after` false: call it before the node) or outputs (after it). Nothing otherwise.
void debug_hash_node(const std::string& graph, std::size_t index, const ResolvedNode& r, bool after, ExecEnv& env);

}  // namespace renaissance::runtime
