// The kernel table: (op, backend) -> the adapter that runs a resolved node, with its optional prepare step
// (DESIGN §12: the runtime reaches the kernels only through it).
#pragma once

#include <renaissance/runtime/exec_env.h>

#include <functional>
#include <map>
#include <vector>

namespace renaissance::runtime {

using OpFn = std::function<void(const ResolvedNode&, ExecEnv&)>;
/// Optional per-node setup before capture (never inside a captured region).
using PrepareFn = std::function<void(ResolvedNode&, ExecEnv&)>;
/// Optional per-backend rewrite of a capture's resolved node list before it is prepared (the CPU backend runs a plain
/// layer's weight- and data-gradient passes as one section).
using FuseGraphFn = std::function<void(std::vector<ResolvedNode>& nodes, std::vector<const OpFn*>& fns, ExecEnv& env)>;

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

/// The built-in tables (cpu_ops.cpp; cuda_kernel_table.cpp in CUDA builds).
void register_cpu_ops(KernelTable& t);
void register_cuda_ops(KernelTable& t);

}  // namespace renaissance::runtime
