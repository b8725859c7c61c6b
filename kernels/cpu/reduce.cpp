#include <kernels/cpu/reduce.h>

#include <kernels/cpu/scratch.h>
#include <kernels/cpu/thread_pool.h>

#include <algorithm>
#include <vector>

namespace renaissance::cpu::detail {

void column_sums(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t lda, float* out,
                 bool accumulate) {
  if (cols <= 0) return;
  const std::int64_t blocks = (rows + kReduceRowBlock - 1) / kReduceRowBlock;
  std::vector<float> partial(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1) * cols), 0.0f);
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      float* acc = partial.data() + b * cols;
      const std::int64_t r1 = std::min(rows, (b + 1) * kReduceRowBlock);
      for (std::int64_t r = b * kReduceRowBlock; r < r1; ++r) {
        const float* row = a + r * lda;
        for (std::int64_t c = 0; c < cols; ++c) acc[c] += row[c];
      }
    }
  });
  for (std::int64_t c = 0; c < cols; ++c) {
    double s = accumulate ? out[c] : 0.0;
    for (std::int64_t b = 0; b < blocks; ++b) s += partial[b * cols + c];
    out[c] = static_cast<float>(s);
  }
}

}  // namespace renaissance::cpu::detail
