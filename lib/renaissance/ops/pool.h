// Max-pool described once (DESIGN §12): the output-extent rule, the argmax limit and the named operands of its
// forward and backward ops, for the planner (plan/arch_plan.cpp, plan/layers/pool.cpp), both kernels
// (kernels/{cpu,cuda}/pooling) and their adapters (runtime/cpu_ops.cpp,
// runtime/cuda_kernel_table.cpp). Parameters: ops::PoolParams.
#pragma once

#include <cstdint>

namespace renaissance::ops {

/// Output extent of a window op (max-pool, convolution) along one axis: floor((in + 2·pad − k) / stride) + 1, as
/// PyTorch; 0 when the padded input is smaller than the window (C++ division truncates toward zero).
constexpr std::int64_t window_out(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad) {
  return in + 2 * pad - k < 0 ? 0 : (in + 2 * pad - k) / stride + 1;
}

/// Largest max-pool window whose positions fit the one-byte argmax (k·k <= 255; 255 means "none").
constexpr int kMaxPoolWindow = 255;

/// MAXPOOL_FWD: in {x}, out {y, argmax (one byte per output: the winner's position kh·k + kw in its window)}.
struct MaxPoolFwd {
  enum In : int { kX = 0 };
  enum Out : int { kY = 0, kArgmax = 1 };
};
/// MAXPOOL_BWD: in {dy, argmax}, out {dx}.
struct MaxPoolBwd {
  enum In : int { kDy = 0, kArgmax = 1 };
  enum Out : int { kDx = 0 };
};

}  // namespace renaissance::ops
