// Activation recomputation (TrainConfig::recompute_bn_relu, `--recompute bn-relu`; DESIGN §5, issue 15): values the
// backward pass reads that are cheaper to form again than to keep. Today one kind: the output of a training BN
// followed by an in-place ReLU. Its backward readers (the next convolution's weight gradient, the ReLU's own
// backward) get a copy formed right before the first of them by BN_APPLY → RELU_FWD from the BN's input and the
// statistics its forward saved, which the BN's own backward reads anyway. So the forward's value dies with its last
// forward reader instead of living through the peak between the two passes, and the copy lives only while the
// backward needs it. The apply is the forward's own formula (both backends), so the step gives the same bits.
#pragma once

#include <renaissance/plan/computation_graph.h>
#include <renaissance/plan/memory_plan.h>

#include <cstddef>
#include <vector>

namespace renaissance::plan {

/// Rewrites the train graph's DEEP_FWD_BWD bucket, whose nodes [0, deep_backward_begin) are the forward pass and the
/// rest the backward, and the first layer's buckets (FIRST_LAYER_FWD_A/B forward, FIRST_LAYER_BWD_A/B backward).
/// For each BN_FWD_TRAIN → in-place RELU_FWD pair of a forward (plain, or parts of one fused node) whose output that
/// scope's backward reads, whose bytes nothing else writes, that no other backward reads, and whose BN has its
/// BN_BWD there: a feature "<output>.recomputed" in every plan of `plans`, BN_APPLY + RELU_FWD writing it before the
/// first backward reader (among that reader's siblings when it is part of a fused node; in a fused node of the BN's
/// layer of its own when the reader is a plain layer's), and every backward read of the output redirected to it. Run
/// before the fusion phase (which makes the pair one BN_RELU_RECOMPUTE pass). `limit` >= 0: only the first `limit`
/// values (the deep bucket's in forward order, then the first layer's, whose A/B twins count once). Returns how many
/// values it recomputes.
int plan_recompute_bn_relu(ComputationGraph& train, std::size_t deep_backward_begin, std::vector<MemoryPlan>& plans,
                           int limit = -1);

}  // namespace renaissance::plan
