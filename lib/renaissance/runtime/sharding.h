// Data-parallel sharding of the sample order (DESIGN §9): which samples of every global batch a rank reads,
// and at which global positions (the augmentation key), so the global batch, the sample order and the
// augmentation do not depend on the number of ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace renaissance::runtime {

/// The samples of one epoch a rank trains: train split of n samples, global batch B, W ranks, b = B / W.
/// Every full global batch is cut into W contiguous slices of b; the last, partial global batch of R = n mod B
/// samples is split evenly too, R − R mod W of them, (R − R mod W) / W per rank, so every rank's gradient is the
/// mean over the same number of samples and the mean over ranks is the global batch's gradient. The R mod W
/// samples left over (at most W − 1 per epoch, always the last of the epoch order) are not trained. With drop_last
/// (`--drop-last`) the partial global batch is not trained at all: every batch is full.
struct ShardLayout {
  std::int64_t world = 1, rank = 0;
  std::int64_t global_batch = 0;   ///< B
  std::int64_t rank_batch = 0;     ///< b = B / W
  std::int64_t epoch_samples = 0;  ///< trained per epoch by all ranks together (n minus the left-over)
  std::int64_t rank_samples() const { return epoch_samples / world; }
  /// Optimizer steps per epoch.
  std::int64_t batches() const { return (rank_samples() + rank_batch - 1) / rank_batch; }
};

/// Errors: B not divisible by W (naming --batch), fewer samples than ranks, with drop_last fewer samples than B.
ShardLayout shard_layout(std::int64_t n, std::int64_t global_batch, int world, int rank, bool drop_last = false);

/// This rank's part of an epoch order (`order`: all n samples, as epoch_order gives them). `positions` receives
/// the position in `order` of each returned sample (the augmentation key of a one-rank run).
std::vector<std::int64_t> shard_order(const ShardLayout& s, const std::vector<std::int64_t>& order,
                                      std::vector<std::int64_t>* positions);

/// Validation: global batches of `batch` over `order` dealt round-robin (batch k to rank k mod W); metric sums
/// are all-reduced afterwards, so the partition does not change the result. The partial last batch, if any,
/// stays last in its rank's list.
std::vector<std::int64_t> round_robin_batches(const std::vector<std::int64_t>& order, std::int64_t batch, int world,
                                              int rank);

}  // namespace renaissance::runtime
