// Activations, residual addition and channel padding: elementwise passes over NHWC tensors.
#pragma once

#include <renaissance/ops/activations.h>

#include <cstdint>

namespace renaissance::cpu {

// The kernels (one variant per instruction-set level, dispatched: isa.h).
#include <kernels/cpu/elementwise_api.inc>

}  // namespace renaissance::cpu
