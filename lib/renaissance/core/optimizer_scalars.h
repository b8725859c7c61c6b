// The arena layouts the optimizer kernels of both backends read: one definition, so the CPU and CUDA kernels and
// the planner's hyper-parameter slots (plan::HyperSlot) cannot drift apart.
#pragma once

#include <cstdint>

namespace renaissance {

/// The optimizer's scalars as they sit in the arena: the first 8 slots of `scalars.hyper` (plan::kHyperLr ..
/// kHyperLarsEta). Read through a pointer at call time, so they change per step without re-planning or
/// re-capturing. `step` counts from 1.
struct OptimizerScalars {
  float lr = 0.0f;
  float momentum = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float step = 1.0f;
  float lars_eta = 0.001f;
};
static_assert(sizeof(OptimizerScalars) == 8 * sizeof(float), "OptimizerScalars is an arena layout");

/// A tensor inside a region, in floats from the region start: LARS computes one trust ratio per segment.
struct LarsSegment {
  std::int64_t offset = 0, count = 0;
};
static_assert(sizeof(LarsSegment) == 16, "LarsSegment is uploaded as {int64 offset, int64 count} pairs");

}  // namespace renaissance
