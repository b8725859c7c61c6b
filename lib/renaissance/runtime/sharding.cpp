#include <renaissance/core/error.h>
#include <renaissance/runtime/sharding.h>

#include <algorithm>

namespace renaissance::runtime {

ShardLayout shard_layout(std::int64_t n, std::int64_t global_batch, int world, int rank, bool drop_last) {
  RN_CHECK(world >= 1 && rank >= 0 && rank < world, "internal: rank {} of {}", rank, world);
  RN_CHECK(global_batch >= 1, "--batch must be >= 1, got {}", global_batch);
  RN_CHECK(global_batch % world == 0,
           "--batch {} (the global batch) is not divisible by the {} ranks (hint: use a multiple of {})", global_batch,
           world, world);
  ShardLayout s;
  s.world = world;
  s.rank = rank;
  s.global_batch = global_batch;
  s.rank_batch = global_batch / world;
  const std::int64_t rem = n % global_batch;
  if (drop_last)
    RN_CHECK(n >= global_batch,
             "--drop-last: the train split has {} samples, fewer than one --batch of {}: no batch would be trained", n,
             global_batch);
  s.epoch_samples = n - (drop_last ? rem : rem % world);
  RN_CHECK(s.epoch_samples >= world, "the train split has {} samples, fewer than the {} ranks", n, world);
  return s;
}

std::vector<std::int64_t> shard_order(const ShardLayout& s, const std::vector<std::int64_t>& order,
                                      std::vector<std::int64_t>* positions) {
  RN_CHECK(static_cast<std::int64_t>(order.size()) >= s.epoch_samples, "internal: epoch order shorter than the shard");
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(s.rank_samples()));
  if (positions) {
    positions->clear();
    positions->reserve(out.capacity());
  }
  for (std::int64_t first = 0; first < s.epoch_samples; first += s.global_batch) {
    const std::int64_t count = std::min(s.global_batch, s.epoch_samples - first);  // a multiple of world
    const std::int64_t per_rank = count / s.world;
    const std::int64_t begin = first + s.rank * per_rank;
    for (std::int64_t p = begin; p < begin + per_rank; ++p) {
      out.push_back(order[static_cast<std::size_t>(p)]);
      if (positions) positions->push_back(p);
    }
  }
  return out;
}

std::vector<std::int64_t> round_robin_batches(const std::vector<std::int64_t>& order, std::int64_t batch, int world,
                                              int rank) {
  RN_CHECK(batch >= 1, "internal: validation batch {}", batch);
  const auto n = static_cast<std::int64_t>(order.size());
  std::vector<std::int64_t> out;
  for (std::int64_t k = rank; k * batch < n; k += world)
    for (std::int64_t p = k * batch; p < std::min(n, (k + 1) * batch); ++p)
      out.push_back(order[static_cast<std::size_t>(p)]);
  return out;
}

}  // namespace renaissance::runtime
