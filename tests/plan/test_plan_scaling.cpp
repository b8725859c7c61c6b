// Issue 13: deep nets plan. A 11,000-layer repeat took 50 s and 99,990 layers never finished: the pool placement
// compared every pair of tensors (in a deep net every forward activation is still live at the turn of the step, so
// nearly all pairs conflict), and so did the overlap check. Above 2,048 pool owners the placement is a sweep over
// time; the check is a sweep for every plan. How long planning takes, and that it grows about linearly with the
// layer count, is measured in tests/bench/bench_plan.cpp (BM_CompileDeepRelu, BM_CompileDeepCbr; docs/benchmarks.md),
// not asserted here: this test checks what the swept placement produces.
#include "compile_util.h"

#include <gtest/gtest.h>

namespace {

using namespace plan_test;

/// `n` relu layers between a conv and the classifier, compiled for training (six variants, liveness reuse).
rp::CompiledPlan deep_relu_plan(std::int64_t n) {
  rb::BluePrint bp;
  bp.name = "deep";
  bp.in_h = 8;
  bp.in_w = 8;
  bp.in_c = 1;
  bp.root = rb::seq({rb::conv(4, 3, 1, 1), rb::repeat(n, rb::relu()), rb::gap(), rb::fc(10), rb::softmax_ce(10)});
  return rp::Compiler::compile(rp::ArchPlan::build(bp, rp::BuildOptions{}), train_config(Cfg{}));
}

}  // namespace

TEST(PlanScaling, TheSweptPlacementOfADeepNetIsValidAndNearTheLowerBound) {
  // 3,000 layers: well past the 2,048 pool owners where the placement switches to the sweep.
  const rp::CompiledPlan big = deep_relu_plan(3000);
  int swept = 0;
  for (const rp::MemoryPlan& m : big.memory) {
    // finalize() validated it already; validate() again independently: no two live tensors share bytes.
    EXPECT_NO_THROW(m.validate()) << m.variant();
    if (!m.reuses_memory()) continue;
    // Past the pairwise placement's limit (memory_plan.cpp's kPairwisePlacementMax): the sweep placed this pool.
    if (m.lifetimes().size() > 2048) ++swept;
    // Close to the lower bound, the most bytes live at any one point.
    EXPECT_LE(m.pool_range().bytes, m.pool_peak_live_bytes() * 3 / 2) << m.variant();
    EXPECT_GE(m.pool_range().bytes, m.pool_peak_live_bytes()) << m.variant();
  }
  EXPECT_GT(swept, 0);
}
