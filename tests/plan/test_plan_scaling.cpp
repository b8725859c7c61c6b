// Issue 13: planning time grows about linearly with the layer count up to the layer cap. A 11,000-layer repeat took
// 50 s and 99,990 layers never finished: the pool placement compared every pair of tensors (in a deep net every
// forward activation is still live at the turn of the step, so nearly all pairs conflict), and so did the overlap
// check. Above 2,048 pool owners the placement is a sweep over time; the check is a sweep for every plan.
#include "compile_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

namespace {

using namespace plan_test;

/// `n` relu layers between a conv and the classifier, compiled for training (six variants, liveness reuse).
double seconds_to_plan(std::int64_t n, rp::CompiledPlan* out = nullptr) {
  rb::BluePrint bp;
  bp.name = "deep";
  bp.in_h = 8;
  bp.in_w = 8;
  bp.in_c = 1;
  bp.root = rb::seq({rb::conv(4, 3, 1, 1), rb::repeat(n, rb::relu()), rb::gap(), rb::fc(10), rb::softmax_ce(10)});
  const auto t0 = std::chrono::steady_clock::now();
  rp::CompiledPlan p = rp::Compiler::compile(rp::ArchPlan::build(bp, rp::BuildOptions{}), train_config(Cfg{}));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out) *out = std::move(p);
  return s;
}

}  // namespace

TEST(PlanScaling, DeepNetsPlanInTimeAboutLinearInTheLayerCount) {
  seconds_to_plan(500);  // warm-up (allocator, caches)
  // The fastest of a few runs of each size: a loaded machine (CI runs two tests at once) only adds time, so the
  // minimum is the least disturbed figure (one run of each gave 12.8x on 2026-12-05 beside two-node Slurm tests).
  const double small = std::min({seconds_to_plan(4000), seconds_to_plan(4000), seconds_to_plan(4000)});
  rp::CompiledPlan big;
  const double large = std::min(seconds_to_plan(20000, &big), seconds_to_plan(20000));
  // 5x the layers: a linear planner takes ~5x, the quadratic one 25x (and over 150 s for the larger net).
  EXPECT_LT(large, 30.0) << "20,000 layers";
  EXPECT_LT(large / std::max(small, 1e-3), 15.0) << "4,000 layers: " << small << " s, 20,000 layers: " << large << " s";
  // The swept placement is a valid plan (finalize validated it: no two live tensors share bytes) and stays close
  // to the lower bound, the most bytes live at any one point.
  for (const rp::MemoryPlan& m : big.memory) {
    EXPECT_NO_THROW(m.validate());
    if (!m.reuses_memory()) continue;
    EXPECT_LE(m.pool_range().bytes, m.pool_peak_live_bytes() * 3 / 2) << m.variant();
  }
}
