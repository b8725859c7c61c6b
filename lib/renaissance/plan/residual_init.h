// Which weights `--zero-init-residual` starts at zero (Goyal et al., "Accurate, Large Minibatch SGD", §5.1;
// torchvision's resnet(zero_init_residual=True)): the scale γ of the last BN of every residual branch, the BN whose
// output the residual sum adds to the shortcut. Each residual block then starts as the identity (its branch adds
// zero), which steadies the first steps of training at a high learning rate. A projection shortcut's own BN keeps
// γ = 1.
#pragma once

#include <renaissance/plan/compiler.h>

#include <string>
#include <vector>

namespace renaissance::plan {

/// The names of those γ tensors in the training graph, in graph order: every BN_FWD_TRAIN whose next plain part
/// (fused layers count as their parts) is an ADD2_FWD whose main-branch operand is its output. Empty for a model
/// without residual sums.
std::vector<std::string> residual_branch_bn_scales(const CompiledPlan& plan);

}  // namespace renaissance::plan
