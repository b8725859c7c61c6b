// A captured subgraph (CapturedGraph: the resolved node list, replayed in order on the CPU or as one CUDA graph) and
// the GraphAtlas that captures each (variant, GraphId) once, deduplicating shape-identical captures.
#pragma once

#include <renaissance/runtime/kernel_table.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::runtime {

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

/// Where a GraphId lives: the train graph or the inference graph.
bool in_inference_graph(plan::GraphId g);

}  // namespace renaissance::runtime
