#include <renaissance/plan/residual_init.h>

#include <algorithm>

namespace renaissance::plan {

namespace {

void flatten(const std::vector<Node>& nodes, std::vector<const Node*>& out) {
  for (const Node& n : nodes) {
    if (!n.sub.empty())
      flatten(n.sub, out);
    else if (n.type == NodeType::COMPUTE)
      out.push_back(&n);
  }
}

}  // namespace

std::vector<std::string> residual_branch_bn_scales(const CompiledPlan& plan) {
  const MemoryPlan& mp = plan.plan(Variant::TRAIN_BASE);
  std::vector<std::string> names;
  for (int g = 0; g < kGraphIds; ++g) {
    std::vector<const Node*> parts;
    flatten(plan.train.bucket(static_cast<GraphId>(g)), parts);
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const Node &bn = *parts[i], &add = *parts[i + 1];
      if (bn.op != OpKind::BN_FWD_TRAIN || add.op != OpKind::ADD2_FWD || bn.outputs.empty() || add.inputs.empty())
        continue;
      // The sum's first operand is the main branch's output, its second the shortcut's (LayerIds::x, x2): a BN
      // that ends the shortcut (a projection, or the only layers when the main branch is empty) keeps γ = 1.
      if (add.inputs[0] == kNoTensor || mp.owner_of(add.inputs[0]) != mp.owner_of(bn.outputs[0])) continue;
      const std::string& gamma = mp.tensor(bn.inputs[1]).name;
      if (std::find(names.begin(), names.end(), gamma) == names.end()) names.push_back(gamma);
    }
  }
  return names;
}

}  // namespace renaissance::plan
