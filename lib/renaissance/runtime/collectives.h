// The collectives of a data-parallel step that the plan does not spell out as RANGE nodes (DESIGN §9): which device
// communicator each all-reduce uses on GPU ranks, and what synchronised BatchNorm (--sync-bn) reduces per BN layer.
// Host logic shared by the CUDA ops (runtime/cuda_kernel_table.cpp, cuda_fused.cpp) and the CPU tests: every rank must issue the same
// collectives in the same order on each communicator, or the job deadlocks.
#pragma once

#include <renaissance/plan/computation_graph.h>
#include <renaissance/runtime/executor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::runtime {

/// The device communicators of a GPU rank (core/communicator.h).
using renaissance::CommLane;
using renaissance::kLaneCompute;
using renaissance::kLanes;
using renaissance::kLaneSide;

/// The lane of a RANGE all-reduce node: kLaneSide for bucket 1 (its ranges cover G_DEEP_CONV only), else kLaneCompute.
int comm_lane(const plan::Node& n);

/// One all-reduce of --sync-bn: `floats` floats summed over the ranks; the statistics divide by `global_rows`.
struct SyncBnReduce {
  std::string layer;  ///< the ArchPlan layer of the BN node
  std::string what;   ///< "sum x", "sum (x-mean)^2", "sum dy, sum dy*xhat"
  std::int64_t floats = 0;
  double global_rows = 0;
};

/// R_g of a BN input: this rank's rows (N·H·W) times the ranks (equal shards: every rank has the same).
double sync_bn_global_rows(const TensorView& x, int world);

/// In launch order, the --sync-bn all-reduces of `nodes` (FUSED_* sub-nodes included) on `world` ranks: per
/// BN_FWD_TRAIN Σx (C floats) then Σ(x − mean)² (C); per BN_BWD {Σdy, Σdy·x̂} (2·c_stride floats, with a data gradient
/// or not). All on kLaneCompute. Empty with one rank.
std::vector<SyncBnReduce> sync_bn_reductions(const std::vector<ResolvedNode>& nodes, int world);

}  // namespace renaissance::runtime
