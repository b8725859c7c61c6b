// Executing a ComputationGraph: a kernel table keyed by (op, backend), nodes resolved once per
// (variant, GraphId) into a CapturedGraph, and the GraphAtlas that deduplicates shape-identical captures.
#pragma once

#include <renaissance/plan/computation_graph.h>
#include <renaissance/runtime/device_context.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::runtime {

/// Collective operations a RANGE op may need. One rank: the default does nothing.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int world_size() const { return 1; }
  virtual int rank() const { return 0; }
  virtual void allreduce_sum(float* data, std::int64_t count) { (void)data, (void)count; }
};

/// A node with every tensor and range resolved for one variant.
struct ResolvedNode {
  const plan::Node* node = nullptr;
  std::vector<TensorView> in, out;
  std::vector<RangeView> in_ranges, out_ranges;
  std::vector<ResolvedNode> sub;
};

/// What ops may touch besides the arena.
struct ExecEnv {
  const std::byte* host_input[2] = {nullptr, nullptr};  ///< staging buffers TRANSFER_A/B copy from
  Communicator* comm = nullptr;
};

using OpFn = std::function<void(const ResolvedNode&, ExecEnv&)>;

class KernelTable {
 public:
  /// The built-in table of a backend (CPU today).
  static const KernelTable& for_backend(Backend b);
  void add_compute(plan::OpKind op, OpFn fn);  ///< registering twice is an error
  void add_range(plan::RangeOp op, OpFn fn);
  const OpFn& compute(plan::OpKind op) const;  ///< missing: error naming the op and backend
  const OpFn& range(plan::RangeOp op) const;
  Backend backend = Backend::CPU;

 private:
  std::map<plan::OpKind, OpFn> m_compute;
  std::map<plan::RangeOp, OpFn> m_range;
};

/// A captured subgraph. CPU: the resolved node list replayed in order. (CUDA: a cudaGraphExec.)
class CapturedGraph {
 public:
  CapturedGraph(std::vector<ResolvedNode> nodes, std::vector<const OpFn*> fns, std::string label);
  void replay(ExecEnv& env) const;
  std::size_t size() const { return m_nodes.size(); }
  const std::string& label() const { return m_label; }
  const std::vector<ResolvedNode>& nodes() const { return m_nodes; }

 private:
  std::vector<ResolvedNode> m_nodes;
  std::vector<const OpFn*> m_fns;
  std::string m_label;
};

/// Resolves one node (and its sub-nodes) for a variant.
ResolvedNode resolve(const plan::Node& n, const DeviceContext& ctx, plan::Variant v);

/// (variant, GraphId) → capture, built lazily once; variants whose resolved tensors are identical share it.
class GraphAtlas {
 public:
  GraphAtlas(const DeviceContext& ctx, const KernelTable& table);
  /// The train graph for train variants, the inference graph for the GraphIds that live there.
  const CapturedGraph& get(plan::Variant v, plan::GraphId g);
  std::size_t captures() const { return m_unique.size(); }
  std::size_t lookups_deduplicated() const { return m_dedup_hits; }

 private:
  const DeviceContext& m_ctx;
  const KernelTable& m_table;
  std::map<std::pair<int, int>, const CapturedGraph*> m_by_key;
  std::map<std::string, std::unique_ptr<CapturedGraph>> m_unique;  // signature → capture
  std::size_t m_dedup_hits = 0;
};

/// Where a GraphId lives: the train graph or the inference graph.
bool in_inference_graph(plan::GraphId g);

}  // namespace renaissance::runtime
