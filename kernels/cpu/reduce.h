// Deterministic reductions shared by the kernels (internal to kernels/cpu): rows are split into blocks
// whose size depends only on the shape, each block is summed in float by one thread, and the block sums
// are combined in block order in double, so the result never depends on the thread count.
#pragma once

#include <cstdint>

namespace renaissance::cpu::detail {

/// Rows per block of the column reductions.
constexpr std::int64_t kReduceRowBlock = 256;

/// out[c] (=|+=) Σ_r a[r·lda + c] for c < cols.
void column_sums(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t lda, float* out,
                 bool accumulate);

}  // namespace renaissance::cpu::detail
