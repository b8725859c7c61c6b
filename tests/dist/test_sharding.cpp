// Sharding of the epoch order (runtime/sharding.h) and the one-rank replica check: the pieces of data-parallel
// training that need no second process.
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/runtime/replicas.h>
#include <renaissance/runtime/sharding.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

using namespace renaissance;
using namespace renaissance::runtime;

namespace {
std::vector<std::int64_t> shuffled(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  std::reverse(v.begin(), v.end());
  std::rotate(v.begin(), v.begin() + n / 3, v.end());
  return v;
}
}  // namespace

TEST(Sharding, OneRankIsTheWholeOrder) {
  const auto order = shuffled(200);
  const ShardLayout s = shard_layout(200, 32, 1, 0);
  EXPECT_EQ(s.epoch_samples, 200);
  EXPECT_EQ(s.batches(), 7);
  std::vector<std::int64_t> pos;
  EXPECT_EQ(shard_order(s, order, &pos), order);
  for (std::size_t i = 0; i < pos.size(); ++i) EXPECT_EQ(pos[i], static_cast<std::int64_t>(i));
}

TEST(Sharding, RanksTakeContiguousSlicesOfEveryGlobalBatch) {
  // 200 samples, global batch 32, 2 ranks: 6 full batches (16 + 16) and a partial one of 8 (4 + 4).
  const auto order = shuffled(200);
  std::vector<std::int64_t> seen;
  for (int r = 0; r < 2; ++r) {
    const ShardLayout s = shard_layout(200, 32, 2, r);
    EXPECT_EQ(s.rank_batch, 16);
    EXPECT_EQ(s.rank_samples(), 100);
    EXPECT_EQ(s.batches(), 7);
    std::vector<std::int64_t> pos;
    const auto mine = shard_order(s, order, &pos);
    ASSERT_EQ(mine.size(), 100u);
    for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(mine[i], order[static_cast<std::size_t>(pos[i])]);
    EXPECT_EQ(pos[0], r * 16);        // first global batch
    EXPECT_EQ(pos[16], 32 + r * 16);  // second
    EXPECT_EQ(pos[96], 192 + r * 4);  // the partial last batch, split evenly
    seen.insert(seen.end(), pos.begin(), pos.end());
  }
  std::sort(seen.begin(), seen.end());
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], static_cast<std::int64_t>(i));
}

TEST(Sharding, UnevenRemainderDropsAtMostWorldMinusOne) {
  // 203 samples, global batch 32, 4 ranks: the partial batch of 11 keeps 8 (2 per rank), 3 are not trained.
  const ShardLayout s = shard_layout(203, 32, 4, 3);
  EXPECT_EQ(s.epoch_samples, 200);
  EXPECT_EQ(s.rank_samples(), 50);
  std::vector<std::int64_t> pos;
  const auto mine = shard_order(s, shuffled(203), &pos);
  EXPECT_EQ(mine.size(), 50u);
  EXPECT_EQ(pos.back(), 199);
}

TEST(Sharding, DropLastTrainsOnlyFullGlobalBatches) {
  // 203 samples, global batch 32: 6 full batches; the 11 at the end of the order are left out, on 1 rank or 4.
  for (const int world : {1, 4}) {
    const ShardLayout s = shard_layout(203, 32, world, world - 1, /*drop_last=*/true);
    EXPECT_EQ(s.epoch_samples, 192) << world;
    EXPECT_EQ(s.batches(), 6) << world;
    std::vector<std::int64_t> pos;
    const auto mine = shard_order(s, shuffled(203), &pos);
    EXPECT_EQ(static_cast<std::int64_t>(mine.size()), 192 / world) << world;
    EXPECT_EQ(pos.back(), 191) << world;  // the last rank's slice of the last full batch
  }
  EXPECT_EQ(shard_layout(192, 32, 2, 0, true).epoch_samples, 192);  // nothing to drop
  try {
    shard_layout(20, 32, 1, 0, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--drop-last: the train split has 20 samples, fewer than one --batch of 32"),
              std::string::npos)
        << e.what();
  }
}

TEST(Sharding, BatchNotDivisibleByRanksNamesTheOption) {
  try {
    shard_layout(200, 30, 4, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--batch 30"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 ranks"), std::string::npos) << e.what();
  }
}

TEST(Sharding, ValidationRoundRobinCoversEverySampleOnce) {
  std::vector<std::int64_t> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::int64_t> all;
  for (int r = 0; r < 3; ++r) {
    const auto mine = round_robin_batches(order, 8, 3, r);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(round_robin_batches(order, 8, 3, 0).front(), 0);
  EXPECT_EQ(round_robin_batches(order, 8, 3, 1).front(), 8);
  EXPECT_EQ(round_robin_batches(order, 8, 3, 0).back(), 49);  // batch 6 (48..49, partial) is rank 0's last
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, order);
}

TEST(Replicas, RunOptionsNameWhatDiffers) {
  TrainOptions a, b;
  b.lr = 0.2;
  const std::string ta = describe_run_options(a), tb = describe_run_options(b);
  EXPECT_NE(ta, tb);
  EXPECT_NE(ta.find("lr=0.1\n"), std::string::npos) << ta;
  EXPECT_NE(tb.find("lr=0.2\n"), std::string::npos) << tb;
}

TEST(Replicas, CheckpointOptionsAreComparedTheirDirectoryNot) {
  // They decide the collectives of every step (the stop agreement, the checkpoint's metric gather, the best-of check):
  // ranks that differ there would hang or mismatch at the first step. Rank 0 alone writes: the path may differ.
  TrainOptions a, b, c, d;
  b.checkpoint_dir = "/scratch/node1/ck";
  c.checkpoint_dir = "/scratch/node2/ck";
  d.checkpoint_dir = c.checkpoint_dir;
  d.checkpoint_every = 5;
  EXPECT_NE(describe_run_options(a), describe_run_options(b));
  EXPECT_EQ(describe_run_options(b), describe_run_options(c));
  EXPECT_NE(describe_run_options(c), describe_run_options(d));
  EXPECT_NE(describe_run_options(d).find("checkpoint every=5\n"), std::string::npos);
  TrainOptions e = c, f = c;
  e.checkpoint_keep_best = true;
  f.checkpoint_each_epoch = true;
  EXPECT_NE(describe_run_options(c), describe_run_options(e));
  EXPECT_NE(describe_run_options(c), describe_run_options(f));
}

TEST(Replicas, OneRankHasNothingToCheck) {
  Communicator one;  // the default communicator: one rank
  EXPECT_NO_THROW(check_replica_inputs(one, "x=1\n"));
}

TEST(Replicas, PlanInputsNameWhatAPlanIsCompiledFrom) {
  namespace bpn = renaissance::blueprint;
  bpn::BluePrint m = bpn::zoo_model("fmnist_cnn");
  plan::BuildOptions bo;
  plan::TrainConfig c;
  c.batch = 16;
  const std::string base = describe_plan_inputs(m, bo, c);
  EXPECT_NE(base.find("model=fmnist_cnn\n"), std::string::npos) << base;
  EXPECT_NE(base.find("per-rank batch=16\n"), std::string::npos) << base;
  EXPECT_EQ(base, describe_plan_inputs(m, bo, c));
  // Any change of the layer tree (one conv's padding) changes the model's hash, a batch its line.
  bpn::BluePrint m2 = m;
  std::function<bool(bpn::Layer&)> bump = [&](bpn::Layer& l) {
    if (l.kind == bpn::NodeKind::Conv || l.kind == bpn::NodeKind::Cbr) {
      l.out_c += 8;
      return true;
    }
    for (bpn::Layer& ch : l.children)
      if (bump(ch)) return true;
    return false;
  };
  ASSERT_TRUE(bump(m2.root));
  const std::string other = describe_plan_inputs(m2, bo, c);
  EXPECT_NE(base, other);
  EXPECT_EQ(base.substr(0, base.find("model layers hash")), other.substr(0, other.find("model layers hash")));
  plan::TrainConfig c2 = c;
  c2.batch = 32;
  EXPECT_NE(describe_plan_inputs(m, bo, c2).find("per-rank batch=32\n"), std::string::npos);
  bo.amp = true;
  EXPECT_NE(describe_plan_inputs(m, bo, c).find("amp=true\n"), std::string::npos);
}

TEST(Replicas, OneRankCompilesItsPlanOnce) {
  plan::TrainConfig c;
  c.batch = 8;
  c.dataset_size = 64;
  c.val_size = 16;
  const std::int64_t before = plan::Compiler::compilations();
  PlanOrigin o;
  const auto p = distribute_plan(nullptr, renaissance::blueprint::zoo_model("fmnist_cnn"), plan::BuildOptions{}, c,
                                 "x=1\n", &o);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(plan::Compiler::compilations(), before + 1);
  EXPECT_TRUE(o.compiled_here);
  EXPECT_EQ(o.bytes, 0);
  EXPECT_EQ(p->config, c);
  EXPECT_EQ(p->hash, plan::content_hash(*p));
}
