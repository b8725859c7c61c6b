// The compiler's fusion phase (DESIGN §11, issue 15): which plain parts of each FUSED_* node run as one fused pass
// (ops/fused.h), decided once, by tensor id, and stored in the node (Node::fusions) with the pass's named operands.
// The liveness analysis, `renaissance plan --nodes` and both backends read the decision; nothing re-discovers it.
#pragma once

#include <renaissance/plan/computation_graph.h>
#include <renaissance/plan/memory_plan.h>

namespace renaissance::plan {

/// Fills Node::fusions of every FUSED_* node of `g` (cleared first). `fuse` false (`--fused-kernels off`) leaves
/// every node to its plain parts. `mp` tells which tensors share bytes (gradient views of one buffer).
/// `sum_into_bn` (TrainConfig::fuse_residual_bn_backward): ADD_RELU_BN_BWD where it applies, else ADD_RELU_BWD alone.
/// `shortcut_bn_into_sum` (TrainConfig::fuse_shortcut_bn_backward): a projection shortcut's BN backward joins the
/// ADD_RELU_BN_BWD pass that forms its gradient (ADD_RELU_BN_BN_BWD).
void plan_fusions(ComputationGraph& g, const MemoryPlan& mp, bool fuse, bool sum_into_bn = true,
                  bool shortcut_bn_into_sum = true);

/// TrainConfig::relu_masks (after plan_fusions on the train graph): every training residual block end whose output y
/// is FP16 (BN_ADD_RELU, BN_BN_ADD_RELU) and whose ReLU's backward is an ADD_RELU_BN_BWD or ADD_RELU_BN_BN_BWD pass
/// of the same bucket,
/// with nothing writing y's bytes in between, also writes relu'(y) as a 1-bit mask (an S_MASK tensor "<y>.mask" of
/// U8 {N, H, W, ⌈C/8⌉}: bit j of byte (n, h, w, b) is channel 8b + j, set where the stored y > 0), named "mask" among
/// the forward pass's outputs and the backward pass's inputs, which then reads it instead of y (y stays an operand:
/// it is kept for the next block's weight gradient anyway, and a backend may read it instead). The mask tensors are
/// added to every variant's memory plan (`plans`, before finalize). Returns the number of masks.
int plan_relu_masks(ComputationGraph& train, std::vector<MemoryPlan>& plans);

/// For one bucket: per tensor owner (MemoryPlan::owner_of), the last bucket position whose node (or a part of it)
/// reads or writes its bytes, -1 for none. Built once per bucket, it bounds decide_fusions' search for later readers
/// (scanning to the bucket's end for every value made planning quadratic: 10,000 layers took 85 s).
std::vector<std::int64_t> last_touches(const std::vector<Node>& bucket, const MemoryPlan& mp);

/// The passes of one fused node's parts `sub` (in `bucket`, at position `index`; the rest of the bucket is checked for
/// later readers of a value a pass never forms). `touches`: last_touches(bucket, mp), or null to build it here.
std::vector<FusedPass> decide_fusions(const std::vector<Node>& sub, const MemoryPlan& mp,
                                      const std::vector<Node>& bucket, std::size_t index, bool sum_into_bn = true,
                                      bool shortcut_bn_into_sum = true,
                                      const std::vector<std::int64_t>* touches = nullptr);

/// The sub-node a pass runs at, or -1: for each sub-node index, the pass (index into `fusions`) that runs there;
/// -2 where a pass replaces it but runs elsewhere.
std::vector<int> fused_step_of(const Node& n);

}  // namespace renaissance::plan
