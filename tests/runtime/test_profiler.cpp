// `renaissance bench --profile` underneath: the StepProfiler's sums, and Trainer::profile on the CPU backend
// (every node of the step timed once per step, FUSED_* nodes through their parts, no change to the training result).
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/profiler.h>
#include <renaissance/runtime/trainer.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;
using plan::GraphId;

std::string synthetic(std::int64_t n, std::int64_t hw, std::int64_t c) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_profiler_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / fmt::format("syn_{}_{}_{}.h5", n, hw, c)).string();
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n, 16, hw, hw, c, 10, 123);
  return p;
}

/// A small residual model: with AMP and fuse its blocks become FUSED_* nodes (the CPU runs their parts).
bp::BluePrint tiny_residual() {
  bp::BluePrint m;
  m.name = "tiny_res";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

struct Case {
  const char* name;
  bool amp;
};

runtime::TrainOptions options(const Case& c, const std::string& data) {
  runtime::TrainOptions o;
  o.data_path = data;
  o.batch = 16;
  o.lr = 0.01;
  o.seed = 7;
  o.amp = c.amp;
  o.validate = false;
  return o;
}

bp::BluePrint model_of(const Case& c) { return c.amp ? tiny_residual() : bp::zoo_model("fmnist_cnn"); }
std::string data_of(const Case& c) { return c.amp ? synthetic(32, 16, 3) : synthetic(32, 28, 1); }

/// The subgraphs of one training step on input slot `s`, in Trainer::Impl::step's order.
std::vector<GraphId> step_graphs(int s) {
  return {GraphId::ZERO_GRAD,
          s == 0 ? GraphId::FIRST_LAYER_FWD_A : GraphId::FIRST_LAYER_FWD_B,
          GraphId::DEEP_FWD_BWD,
          GraphId::DEEP_COMM,
          s == 0 ? GraphId::FIRST_LAYER_BWD_A : GraphId::FIRST_LAYER_BWD_B,
          GraphId::CAST_G16_TO_G,
          GraphId::FIRST_COMM,
          GraphId::NAN_CHECK_AND_GRAD_SCALING,
          GraphId::STATS_COMM,
          GraphId::UPDATE_STATS,
          GraphId::OPTIMIZER,
          GraphId::LARS_NORM_OPT,
          GraphId::LARS_BIAS_OPT,
          GraphId::LARS_WEIGHT_OPT,
          GraphId::CAST_W_TO_A,
          GraphId::EMA_UPDATE,
          GraphId::ACCUM_METRICS_TRAIN};
}

bool is_fused(const plan::Node& n) {
  return n.type == plan::NodeType::COMPUTE &&
         (n.op == plan::OpKind::FUSED_FWD || n.op == plan::OpKind::FUSED_BWD || n.op == plan::OpKind::FUSED_INFER);
}
std::string label_of(const plan::Node& n) {
  return n.type == plan::NodeType::RANGE ? plan::range_op_name(n.range_op) : plan::op_kind_name(n.op);
}
/// Brackets a bucket produces: one per node, FUSED_* nodes one per part.
void count_brackets(const std::vector<plan::Node>& bucket, std::map<std::string, double>& calls, double weight) {
  for (const plan::Node& n : bucket) {
    if (is_fused(n))
      for (const plan::Node& s : n.sub) calls[label_of(s)] += weight;
    else
      calls[label_of(n)] += weight;
  }
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class TrainerProfile : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerProfile, EveryNodeOfTheStepIsTimedOncePerStep) {
  const Case& c = GetParam();
  // Every part on its own, so the brackets follow the plan's nodes one to one (with fused passes, one bracket covers
  // several parts: Trainer.CpuFusedPassesEqualThePlainParts checks their labels).
  runtime::TrainOptions o = options(c, data_of(c));
  o.fuse_kernels = false;
  runtime::Trainer t(model_of(c), o);
  constexpr std::int64_t kSteps = 2;
  const runtime::ProfileResult r = t.profile(1, kSteps);
  EXPECT_EQ(r.steps, kSteps);
  EXPECT_EQ(r.batch, 16);
  EXPECT_EQ(t.steps(), 1 + kSteps);

  // Expected brackets per step, counted from the compiled plan over the profiled steps (slots A, B, A, ...).
  const plan::ComputationGraph& g = t.plan().train;
  std::map<std::string, double> expected;
  std::map<std::string, bool> top_level;  // every top-level op kind of the step's graphs
  std::size_t fused_nodes = 0;
  for (std::int64_t i = 0; i < kSteps; ++i)
    for (GraphId id : step_graphs(static_cast<int>(i % 2))) {
      count_brackets(g.bucket(id), expected, 1.0 / static_cast<double>(kSteps));
      for (const plan::Node& n : g.bucket(id)) {
        fused_nodes += is_fused(n) ? 1 : 0;
        top_level[label_of(n)] = is_fused(n);
      }
    }
  if (c.amp) {
    EXPECT_GT(fused_nodes, 0u) << "the AMP case must cover FUSED_* nodes";
  }
  ASSERT_FALSE(expected.empty());

  std::map<std::string, const runtime::ProfileRow*> rows;
  for (const auto& x : r.kernels) {
    EXPECT_TRUE(rows.emplace(x.label, &x).second) << "kernel label twice: " << x.label;
  }
  for (const auto& [label, fused] : top_level) {
    if (fused) {
      EXPECT_EQ(rows.count(label), 0u) << label << " is timed through its parts, not as a whole";
    } else {
      EXPECT_EQ(rows.count(label), 1u) << "no row for " << label;
    }
  }
  for (const auto& [label, calls] : expected) {
    auto it = rows.find(label);
    ASSERT_NE(it, rows.end()) << "no row for " << label;
    EXPECT_DOUBLE_EQ(it->second->calls_per_step, calls) << label;
  }
  EXPECT_EQ(rows.size(), expected.size());
  for (const char* must : {"CONV_FWD", "CONV_BWD_FILTER", "BN_FWD_TRAIN", "BN_BWD", "SOFTMAX_CE_FWD", "FC_FWD"})
    EXPECT_EQ(rows.count(must), 1u) << must;

  // The deep forward/backward subgraph: its own row, with its nodes' brackets.
  std::map<std::string, double> deep;
  count_brackets(g.bucket(GraphId::DEEP_FWD_BWD), deep, 1.0);
  double deep_calls = 0;
  for (const auto& kv : deep) deep_calls += kv.second;
  bool found = false;
  for (const auto& x : r.graphs)
    if (x.label == "train_base/DEEP_FWD_BWD") {
      found = true;
      EXPECT_DOUBLE_EQ(x.calls_per_step, deep_calls);
    }
  EXPECT_TRUE(found);

  // Sums: kernels, subgraphs and (subgraph, kernel) rows each add up to the total; the total fits in the wall time.
  for (const auto* table : {&r.kernels, &r.graphs, &r.graph_kernels}) {
    double ms = 0, pct = 0;
    for (const auto& x : *table) {
      EXPECT_GE(x.ms_per_step, 0.0);
      ms += x.ms_per_step;
      pct += x.percent;
    }
    EXPECT_NEAR(ms, r.total_ms_per_step, 1e-9 * std::max(1.0, r.total_ms_per_step));
    EXPECT_NEAR(pct, 100.0, 1e-6);
    for (std::size_t i = 1; i < table->size(); ++i) EXPECT_GE((*table)[i - 1].ms_per_step, (*table)[i].ms_per_step);
  }
  EXPECT_GT(r.total_ms_per_step, 0.0);
  EXPECT_LE(r.total_ms_per_step, r.wall_ms_per_step * 1.0001);
}

TEST_P(TrainerProfile, ProfilingChangesNoResult) {
  // profile(w, n) trains the same steps as benchmark(w, n): the same weights bit for bit, and both trainers go on
  // the same way afterwards (the timer is off again).
  const Case& c = GetParam();
  const std::string data = data_of(c);
  runtime::Trainer profiled(model_of(c), options(c, data));
  runtime::Trainer plain(model_of(c), options(c, data));
  const std::vector<float> initial = plain.state_values();
  profiled.profile(1, 2);
  plain.benchmark(1, 2);
  EXPECT_EQ(profiled.steps(), plain.steps());
  EXPECT_TRUE(bit_equal(profiled.state_values(), plain.state_values()));
  EXPECT_FALSE(bit_equal(initial, plain.state_values()));  // the steps did train
  profiled.benchmark(0, 1);
  plain.benchmark(0, 1);
  EXPECT_TRUE(bit_equal(profiled.state_values(), plain.state_values()));
}

INSTANTIATE_TEST_SUITE_P(Cpu, TrainerProfile, ::testing::Values(Case{"fp32", false}, Case{"amp_fused", true}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(TrainerProfileOptions, NeedsAStep) {
  const Case c{"fp32", false};
  runtime::Trainer t(model_of(c), options(c, data_of(c)));
  EXPECT_THROW(t.profile(0, 0), Error);
  EXPECT_THROW(t.profile(-1, 1), Error);
}

TEST(StepProfiler, SumsPerSubgraphAndLabel) {
  runtime::StepProfiler p(runtime::Backend::CPU);
  runtime::ExecEnv env;
  auto bracket = [&](const char* what, int ms) {
    p.begin(env, what);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    p.end(env);
  };
  for (int step = 0; step < 2; ++step) {
    p.graph("g1");
    bracket("A", 4);
    bracket("B", 1);
    p.graph("g2");
    bracket("A", 4);
    p.finish_step();
  }
  const runtime::ProfileResult r = p.result(2);
  ASSERT_EQ(r.kernels.size(), 2u);
  EXPECT_EQ(r.kernels[0].label, "A");
  EXPECT_DOUBLE_EQ(r.kernels[0].calls_per_step, 2.0);
  EXPECT_GE(r.kernels[0].ms_per_step, 8.0);
  EXPECT_EQ(r.kernels[1].label, "B");
  EXPECT_DOUBLE_EQ(r.kernels[1].calls_per_step, 1.0);
  ASSERT_EQ(r.graphs.size(), 2u);
  ASSERT_EQ(r.graph_kernels.size(), 3u);
  for (const auto& x : r.graph_kernels) EXPECT_FALSE(x.graph.empty());
  EXPECT_NEAR(r.kernels[0].ms_per_step + r.kernels[1].ms_per_step, r.total_ms_per_step, 1e-9);
  EXPECT_NEAR(r.kernels[0].percent + r.kernels[1].percent, 100.0, 1e-9);
}

TEST(StepProfiler, UnbalancedBracketsAreErrors) {
  runtime::StepProfiler p(runtime::Backend::CPU);
  runtime::ExecEnv env;
  EXPECT_THROW(p.end(env), Error);
  p.begin(env, "A");
  EXPECT_THROW(p.finish_step(), Error);
  EXPECT_THROW(p.result(0), Error);
}

}  // namespace
