// The host logic of the collectives that GPU ranks issue outside the plan's RANGE nodes (runtime/collectives.h):
// which NCCL communicator ("lane") each all-reduce of the plan uses, and what --sync-bn reduces per BN layer and
// step. Checked on CPU-resolved plans: the lists do not depend on the backend, and every rank must issue the same.
#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/arena_keeper.h>
#include <renaissance/runtime/collectives.h>
#include <renaissance/runtime/device_context.h>
#include <renaissance/runtime/executor.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace renaissance;
using namespace renaissance::runtime;
using plan::GraphId;
using plan::Variant;

namespace {

plan::CompiledPlan compile(const blueprint::BluePrint& bp, std::int64_t batch, std::int64_t samples) {
  plan::TrainConfig c;
  c.batch = batch;
  c.dataset_size = samples;
  c.val_size = 16;
  return plan::Compiler::compile(plan::ArchPlan::build(bp, plan::BuildOptions{}), c);
}

std::vector<ResolvedNode> resolved(const plan::CompiledPlan& p, const DeviceContext& ctx, Variant v, GraphId g) {
  std::vector<ResolvedNode> out;
  for (const plan::Node& n : p.train.bucket(g)) out.push_back(resolve(n, ctx, v));
  return out;
}

/// The BN layers of the plan, in plan order, with their channels.
std::vector<std::pair<std::string, std::int64_t>> bn_layers(const plan::CompiledPlan& p) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const plan::ArchLayer& l : p.arch.layers)
    if (l.kind == plan::LayerKind::Bn2d || l.kind == plan::LayerKind::Bn1d) out.emplace_back(l.name, l.out_shape.c);
  return out;
}

}  // namespace

TEST(Collectives, BucketOneHasTheSideLaneEverythingElseTheComputeLane) {
  const plan::CompiledPlan p = compile(blueprint::zoo_model("fmnist_cnn"), 16, 64);
  int side = 0, compute = 0;
  for (GraphId g : {GraphId::DEEP_COMM, GraphId::FIRST_COMM, GraphId::STATS_COMM, GraphId::TRAIN_RESULT_COMM}) {
    for (const plan::Node& n : p.train.bucket(g)) {
      ASSERT_EQ(n.type, plan::NodeType::RANGE);
      const int lane = comm_lane(n);
      if (g == GraphId::DEEP_COMM) {
        EXPECT_EQ(lane, kLaneSide) << "DEEP_COMM (bucket 1) must use the side stream's communicator";
        ++side;
      } else {
        EXPECT_EQ(lane, kLaneCompute) << plan::graph_id_name(g);
        ++compute;
      }
    }
  }
  EXPECT_GE(side, 1);
  EXPECT_GE(compute, 3);
  plan::Node compute_node;  // a COMPUTE node (e.g. a sync-BN layer's) is the compute stream's
  EXPECT_EQ(comm_lane(compute_node), kLaneCompute);
}

TEST(Collectives, SyncBnReducesTheSumsOfEveryBnLayerOverTheGlobalBatch) {
  const blueprint::BluePrint bp =
      blueprint::load_blueprint_file(std::string(RENAISSANCE_SOURCE_DIR) + "/tests/dist/fixtures/dp_bn_cnn.yaml");
  const int world = 4;
  // 200 samples, global batch 32 on 4 ranks: per-rank batch 8; the last global batch of 8 gives 2 per rank.
  const plan::CompiledPlan p = compile(bp, 8, 50);
  ArenaKeeper arena(Backend::CPU, p.arena_bytes());
  DeviceContext ctx(arena, p);
  const auto bns = bn_layers(p);
  ASSERT_EQ(bns.size(), 2u);
  for (Variant v : {Variant::TRAIN_BASE, Variant::TRAIN_LAST}) {
    const std::int64_t rank_batch = p.specs[static_cast<std::size_t>(v)].batch_size;
    const auto nodes = resolved(p, ctx, v, GraphId::DEEP_FWD_BWD);
    const std::vector<SyncBnReduce> red = sync_bn_reductions(nodes, world);
    // Forward: Σx and Σ(x − mean)² of each BN layer in plan order (C floats each); backward in reverse order:
    // {Σdy, Σdy·x̂} (2C floats), also for a BN whose input gradient is not needed.
    ASSERT_EQ(red.size(), 3 * bns.size()) << plan::variant_name(v);
    for (std::size_t i = 0; i < bns.size(); ++i) {
      EXPECT_EQ(red[2 * i].what, "sum x");
      EXPECT_EQ(red[2 * i + 1].what, "sum (x-mean)^2");
      EXPECT_EQ(red[2 * i].floats, bns[i].second) << bns[i].first;
      EXPECT_EQ(red[2 * i + 1].floats, bns[i].second);
    }
    for (std::size_t i = 0; i < bns.size(); ++i) {
      const SyncBnReduce& b = red[2 * bns.size() + i];
      EXPECT_EQ(b.what, "sum dy, sum dy*xhat");
      EXPECT_EQ(b.floats, 2 * bns[bns.size() - 1 - i].second);  // CPU strides: compact channels
    }
    // R_g: this rank's N·H·W times the ranks, i.e. the rows of the global batch (28x28 after the first conv,
    // 14x14 after the strided one).
    EXPECT_DOUBLE_EQ(red[0].global_rows, static_cast<double>(rank_batch * 28 * 28 * world));
    EXPECT_DOUBLE_EQ(red[2].global_rows, static_cast<double>(rank_batch * 14 * 14 * world));
    EXPECT_DOUBLE_EQ(red[1].global_rows, red[0].global_rows);
    // One rank reduces nothing.
    EXPECT_TRUE(sync_bn_reductions(nodes, 1).empty());
  }
}

TEST(Collectives, FusedLayersReduceThroughTheirParts) {
  // An AMP plan fuses conv+bn+relu into CBR nodes whose BN is a sub-node: its reductions are still listed.
  plan::BuildOptions bo;
  bo.amp = true;
  bo.fuse = true;
  plan::TrainConfig c;
  c.batch = 4;
  c.dataset_size = 16;
  c.val_size = 4;
  c.amp = true;
  const plan::CompiledPlan p =
      plan::Compiler::compile(plan::ArchPlan::build(blueprint::zoo_model("fmnist_cnn"), bo), c);
  ArenaKeeper arena(Backend::CPU, p.arena_bytes());
  DeviceContext ctx(arena, p);
  const auto nodes = resolved(p, ctx, Variant::TRAIN_BASE, GraphId::DEEP_FWD_BWD);
  bool fused = false;
  for (const ResolvedNode& r : nodes) fused = fused || !r.sub.empty();
  EXPECT_TRUE(fused) << "expected FUSED_* nodes in an AMP plan";
  std::int64_t fwd = 0, bwd = 0;
  for (const SyncBnReduce& s : sync_bn_reductions(nodes, 2)) (s.what == "sum dy, sum dy*xhat" ? bwd : fwd)++;
  EXPECT_GT(fwd, 0);
  EXPECT_EQ(fwd, 2 * bwd);  // two forward sums per BN layer, one backward sum
}
