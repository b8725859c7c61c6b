// Gradient check of the compiled backward graph (STYLE habit 5): for small plans of one layer kind each (plus what
// the plan needs around it: a GAP or FC to reach the classes, softmax-CE), the Trainer runs the real train graph on
// the CPU backend (descriptors, gradient chain, gradient slots, first-layer/deep split, in-place ReLU and residual
// adds, the gradient regions), and every parameter gradient it leaves in "<layer>.<tensor>.grad" is compared with
// central differences of the loss the same graph computes: (L(w + ε) − L(w − ε)) / 2ε, evaluated in double from the
// FP32 losses. lr = 0, so the probe steps do not move the weights (SGD with momentum: w −= 0·v).
//
// Threshold |analytic − numeric| ≤ 2e-3 · max(|analytic|, |numeric|, 1) (caffe's test_gradient_check_util.hpp).
// Smooth plans: ε = 1e-2; the FP32 forward's rounding (a few ulps of a loss near 1.4) puts ~1e-5 into the difference
// quotient and the truncation error ε²·L‴/6 about as much. Plans with kinks (ReLU, max-pool): ε = 1e-3, and a probe
// is skipped where the central differences of half-widths ε and ε/2 disagree by more than half the threshold, which a
// smooth loss cannot do (they differ by ~ε²·L‴/8) but an activation crossing zero, or a max-pool window changing its
// maximum, within ±ε does; at most a quarter of a tensor's probes may be skipped.
#include "golden_util.h"

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/io/importers.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/trainer.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using namespace renaissance;
namespace bp = renaissance::blueprint;
namespace fs = std::filesystem;

constexpr std::int64_t kHw = 6, kChannels = 4, kClasses = 4, kBatch = 4;
constexpr double kEps = 1e-2;           ///< smooth plans
constexpr double kEpsPiecewise = 1e-3;  ///< plans with kinks: fewer crossings
constexpr double kThreshold = 2e-3;
constexpr int kProbesPerTensor = 6;

struct GradPlan {
  const char* name;
  bp::Layer layers;  ///< without the final softmax_ce(kClasses)
  bool piecewise;    ///< ReLU / max-pool: kinks may be crossed
};

void PrintTo(const GradPlan& p, std::ostream* os) { *os << p.name; }  // gtest: the plan, not its bytes

std::vector<GradPlan> plans() {
  using namespace bp;
  const std::int64_t K = kClasses;
  return {
      {"conv", seq(conv(K, 3, 1, 1), gap()), false},
      {"conv_bias", seq(conv(K, 3, 1, 1, 1, true), gap()), false},
      {"conv_stride2", seq(conv(K, 3, 2, 1), gap()), false},
      {"conv_1x1_stride2", seq(conv(K, 1, 2, 0), gap()), false},
      {"depthwise", seq(conv(8, 1, 1, 0), dwconv(3, 1, 1), gap(), fc(K)), false},
      {"bn", seq(conv(K, 3, 1, 1), bn(), tanh(), gap()), false},
      {"relu", seq(conv(K, 3, 1, 1), relu(), gap()), true},
      {"tanh", seq(conv(K, 3, 1, 1), tanh(), gap()), false},
      {"silu", seq(conv(K, 3, 1, 1), silu(), gap()), false},
      {"maxpool", seq(conv(K, 3, 1, 1), maxpool(2, 2), gap()), true},
      {"gap_fc", seq(conv(8, 3, 1, 1), gap(), fc(K)), false},
      {"fc", seq(flatten(), fc(K)), false},
      {"fc_bn1d", seq(flatten(), fc(8), bn(), fc(K)), false},
      {"add2_identity", seq(conv(K, 3, 1, 1), add2(seq(conv(K, 3, 1, 1), bn()), seq()), gap()), false},
      // The model's first layer a residual add whose shortcut is the data buffer itself (kChannels == K).
      {"add2_identity_off_the_data", seq(add2(seq(conv(K, 3, 1, 1), bn()), seq()), gap()), false},
      {"add2_projection",
       seq(conv(K, 3, 1, 1), add2(seq(conv(8, 3, 2, 1), bn()), seq(conv(8, 1, 2, 0), bn())), gap(), fc(K)), false},
      {"basic_block", seq(conv(K, 3, 1, 1), block(0, 8, BlockKind::RESNET_3_3, 2), gap(), fc(K)), true},
      // Three nested residual adds with projection shortcuts (found by a differential hunt against PyTorch): five
      // gradient buffers live at once, refused while the walk had four.
      {"add2_nested_3",
       seq(add2(seq(add2(seq(add2(seq(conv(4, 1), bn(), tanh()), seq(conv(4, 1))), conv(4, 1)), seq(conv(4, 1))), bn()),
                seq(conv(4, 1))),
           gap(), fc(K)),
       false},
  };
}

/// The batch: kBatch synthetic samples (class patterns under noise), in a file of this test's own.
class BatchFile {
 public:
  BatchFile() {
    m_path = fs::temp_directory_path() / fmt::format("rn_gradcheck_{}.h5", static_cast<long>(::getpid()));
    io::make_synthetic(m_path.string(), kBatch, kBatch, kHw, kHw, kChannels, kClasses, 5);
  }
  ~BatchFile() {
    std::error_code ec;
    fs::remove(m_path, ec);
  }
  std::string path() const { return m_path.string(); }

 private:
  fs::path m_path;
};

/// The mean loss of the train step that ran last ("result.step": Σ loss, top-1, top-5, samples).
double step_loss(const runtime::Trainer& t) {
  const std::vector<float> r = t.tensor_values("result.step");
  return static_cast<double>(r[plan::kResultLoss]) / static_cast<double>(r[plan::kResultCount]);
}

/// One step of the compiled train graph on the (only) batch, which leaves its loss and gradients in the arena.
double train_step(runtime::Trainer& t) {
  t.benchmark(0, 1);
  return step_loss(t);
}

class GradientCheck : public ::testing::TestWithParam<GradPlan> {};

TEST_P(GradientCheck, CompiledBackwardMatchesCentralDifferences) {
  const GradPlan& p = GetParam();
  bp::BluePrint model{fmt::format("gradcheck_{}", p.name), kHw, kHw, kChannels,
                      bp::seq(p.layers, bp::softmax_ce(kClasses))};
  const BatchFile batch;
  runtime::TrainOptions o;
  o.data_path = batch.path();
  o.backend = runtime::Backend::CPU;
  o.batch = kBatch;
  o.epochs = 1;
  o.optimizer = plan::OptimizerKind::MOMENTUM;
  o.lr = 0;  // probe steps must not move the weights
  o.weight_decay = 0;
  o.label_smoothing = 0;
  o.schedule = runtime::ScheduleKind::CONSTANT;
  o.validate = false;
  o.seed = 11;
  runtime::Trainer t(model, o);

  // Non-trivial BN parameters and biases (they start at 1 and 0), so their gradients are not special cases.
  const plan::MemoryPlan& mp = t.plan().plan(plan::Variant::TRAIN_BASE);
  std::vector<const DTensor*> params;
  for (const DTensor& d : mp.tensors())
    if (region_family(d.region) == RegionFamily::W && d.region != Region::W_EQ_BIAS && d.region != Region::W_EQ_SCALE)
      params.push_back(&d);
  ASSERT_FALSE(params.empty());
  for (const DTensor* d : params) {
    if (d->region != Region::W_BN_WEIGHT && d->region != Region::W_BN_BIAS && d->region != Region::W_FC_BIAS &&
        d->name.substr(d->name.size() - 2) != ".b")
      continue;
    std::vector<float> v = t.tensor_values(d->name);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = (d->region == Region::W_BN_WEIGHT ? 1.0f : 0.0f) + 0.3f * std::sin(1.7f * static_cast<float>(i) + 0.5f);
    t.set_tensor_values(d->name, v);
  }

  const double l0 = train_step(t);
  ASSERT_TRUE(std::isfinite(l0));
  struct Analytic {
    const DTensor* d;
    std::vector<float> grad;
  };
  std::vector<Analytic> analytic;
  for (const DTensor* d : params) analytic.push_back({d, t.tensor_values(d->name + ".grad")});

  double worst = 0;
  std::string worst_at;
  int checked = 0, skipped_total = 0;
  for (const Analytic& a : analytic) {
    const std::string& name = a.d->name;
    std::vector<float> w = t.tensor_values(name);
    const std::size_t n = w.size();
    const std::size_t probes = std::min<std::size_t>(n, kProbesPerTensor);
    int skipped = 0;
    double g_max = 0;
    for (float g : a.grad) g_max = std::max(g_max, std::abs(static_cast<double>(g)));
    EXPECT_GT(g_max, 0.0) << name << ": every gradient is zero (the tensor is not wired into the backward graph?)";
    // The central difference at half-width h around w0 (the representable offsets: FP32 rounds w0 ± h).
    auto central = [&](std::size_t i, double h) {
      const float w0 = w[i], up = static_cast<float>(w0 + h), down = static_cast<float>(w0 - h);
      w[i] = up;
      t.set_tensor_values(name, w);
      const double lp = train_step(t);
      w[i] = down;
      t.set_tensor_values(name, w);
      const double lm = train_step(t);
      w[i] = w0;
      t.set_tensor_values(name, w);
      return (lp - lm) / (static_cast<double>(up) - static_cast<double>(down));
    };
    for (std::size_t k = 0; k < probes; ++k) {
      const std::size_t i = (k * n) / probes + (n / probes) / 2;  // spread over the tensor
      const double g = a.grad[i];
      const double numeric = central(i, p.piecewise ? kEpsPiecewise : kEps);
      const double scale = std::max({std::abs(g), std::abs(numeric), 1.0});
      if (p.piecewise && std::abs(numeric - central(i, kEpsPiecewise / 2)) > 0.5 * kThreshold * scale) {
        ++skipped;  // the two widths disagree: a kink within ±ε
        continue;
      }
      ++checked;
      const double err = std::abs(g - numeric) / scale;
      if (err > worst) {
        worst = err;
        worst_at = fmt::format("{}[{}]", name, i);
      }
      EXPECT_LE(err, kThreshold) << p.name << ": " << name << "[" << i << "]: compiled backward " << g
                                 << ", central difference " << numeric;
    }
    EXPECT_LE(skipped * 4, static_cast<int>(probes))
        << name << ": " << skipped << " of " << probes << " probes crossed a kink (ε too large for this plan?)";
    skipped_total += skipped;
  }
  // The loss at the unperturbed weights is the same after all probes (lr = 0 really kept the weights).
  EXPECT_EQ(train_step(t), l0);
  std::printf(
      "gradient check %s: %zu tensors, %d probes, %d skipped at kinks, worst |g - numeric|/max(|g|,1) %.2g "
      "(%s)\n",
      p.name, analytic.size(), checked, skipped_total, worst, worst_at.c_str());
}

/// Options of a CPU trainer on `path` for the tests here.
runtime::TrainOptions cpu_options(const std::string& path) {
  runtime::TrainOptions o;
  o.data_path = path;
  o.backend = runtime::Backend::CPU;
  o.batch = kBatch;
  o.epochs = 1;
  o.validate = false;
  o.seed = 11;
  return o;
}

TEST(ResidualAdd, AShortcutStraightOffTheDataBufferAddsTheInput) {
  // add2(main, identity) as a model's first layer: its shortcut is the data buffer (the compiler once left it
  // unconnected and the CPU backend dereferenced no tensor). The reference: the same network behind a 1x1 convolution
  // with identity weights (exact in FP32), whose shortcut is a feature like any block's; same FC weights, same logits.
  using namespace bp;
  const BatchFile batch;
  const Layer head = seq(gap(), fc(kClasses), softmax_ce(kClasses));
  const BluePrint direct{"residual_off_data", kHw, kHw, kChannels, seq(add2(seq(relu()), seq()), head)};
  const BluePrint behind{"residual_off_identity_conv", kHw, kHw, kChannels,
                         seq(conv(kChannels, 1, 1, 0), add2(seq(relu()), seq()), head)};
  runtime::Trainer a(direct, cpu_options(batch.path()));
  runtime::Trainer b(behind, cpu_options(batch.path()));
  auto named = [](const runtime::Trainer& t, Region r) {
    for (const DTensor& d : t.plan().plan(plan::Variant::TRAIN_BASE).tensors())
      if (d.region == r) return d.name;
    return std::string();
  };
  for (Region r : {Region::W_FC_WEIGHT, Region::W_FC_BIAS}) {
    std::vector<float> v = a.tensor_values(named(a, r));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * std::sin(0.9f * static_cast<float>(i) + 0.3f);
    a.set_tensor_values(named(a, r), v);
    b.set_tensor_values(named(b, r), v);
  }
  const std::string conv_w = named(b, Region::W_FIRST_CONV);
  ASSERT_FALSE(conv_w.empty());
  std::vector<float> eye(static_cast<std::size_t>(kChannels * kChannels), 0.0f);  // [out][1][1][in]
  for (std::int64_t c = 0; c < kChannels; ++c) eye[static_cast<std::size_t>(c * kChannels + c)] = 1.0f;
  b.set_tensor_values(conv_w, eye);
  const std::vector<float> la = a.logits(io::Split::val, 0, kBatch), lb = b.logits(io::Split::val, 0, kBatch);
  ASSERT_EQ(la.size(), lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "logit " << i;
  // and it trains: a step leaves a finite loss
  EXPECT_TRUE(std::isfinite(train_step(a)));
}

INSTANTIATE_TEST_SUITE_P(OneLayerPlans, GradientCheck, ::testing::ValuesIn(plans()),
                         [](const ::testing::TestParamInfo<GradPlan>& i) { return std::string(i.param.name); });

}  // namespace
