#include <renaissance/runtime/collectives.h>

namespace renaissance::runtime {

using plan::OpKind;

int comm_lane(const plan::Node& n) {
  if (n.type != plan::NodeType::RANGE || n.output_ranges.empty()) return kLaneCompute;
  for (const auto& r : n.output_ranges)
    if (r.first != Region::G_DEEP_CONV || r.last != Region::G_DEEP_CONV) return kLaneCompute;
  return kLaneSide;
}

double sync_bn_global_rows(const TensorView& x, int world) {
  return static_cast<double>(x.shape.n * x.shape.h * x.shape.w) * static_cast<double>(world);
}

namespace {
void walk(const ResolvedNode& r, int world, std::vector<SyncBnReduce>& out) {
  if (!r.sub.empty()) {
    for (const ResolvedNode& s : r.sub) walk(s, world, out);
    return;
  }
  if (!r.node || r.in.empty()) return;
  const TensorView& x = r.in[0];
  const double rg = sync_bn_global_rows(x, world);
  if (r.node->op == OpKind::BN_FWD_TRAIN) {
    out.push_back({r.layer, "sum x", x.shape.c, rg});
    out.push_back({r.layer, "sum (x-mean)^2", x.shape.c, rg});
  } else if (r.node->op == OpKind::BN_BWD) {
    out.push_back({r.layer, "sum dy, sum dy*xhat", 2 * x.strides[2], rg});
  }
}
}  // namespace

std::vector<SyncBnReduce> sync_bn_reductions(const std::vector<ResolvedNode>& nodes, int world) {
  std::vector<SyncBnReduce> out;
  if (world <= 1) return out;
  for (const ResolvedNode& r : nodes) walk(r, world, out);
  return out;
}

}  // namespace renaissance::runtime
