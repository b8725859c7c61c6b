// Each region-wide optimizer update against a straightforward per-tensor implementation of its published
// rule, written in the operation order documented in optimizer.h, so the comparison is bit for bit over
// several steps. This file is compiled with -ffp-contract=off, like the kernels.
#include <kernels/cpu/optimizer.h>

#include "kernel_test_util.h"

namespace renaissance::cpu::test {
namespace {

enum class Kind { Sgd, Momentum, Nesterov, Adam, AdamW, Lars };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Sgd: return "sgd";
    case Kind::Momentum: return "momentum";
    case Kind::Nesterov: return "nesterov";
    case Kind::Adam: return "adam";
    case Kind::AdamW: return "adamw";
    case Kind::Lars: return "lars";
  }
  return "?";
}

// A region of three tensors (one larger than a LARS norm block, one empty-ish, one odd-sized).
const std::vector<LarsSegment> kSegments = {{0, 9000}, {9000, 37}, {9037, 5003}};
constexpr std::int64_t kN = 14040;

struct State {
  Vec w, m, v;
};

// ---- references: one tensor at a time, formulas as published (optimizer.h) ----------------------------

void sgd_ref(float* w, const float* g, std::int64_t n, const OptimizerScalars& s, bool wd_on) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = wd_on ? g[i] + s.weight_decay * w[i] : g[i];
    w[i] = w[i] - s.lr * gi;
  }
}

void momentum_ref(float* w, const float* g, float* v, std::int64_t n, const OptimizerScalars& s, bool wd_on,
                  bool nesterov) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = wd_on ? g[i] + s.weight_decay * w[i] : g[i];
    v[i] = s.momentum * v[i] + gi;
    w[i] = nesterov ? w[i] - s.lr * (gi + s.momentum * v[i]) : w[i] - s.lr * v[i];
  }
}

void adam_ref(float* w, const float* g, float* m, float* v, std::int64_t n, const OptimizerScalars& s, bool l2,
              bool decoupled) {
  const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step)));
  const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step)));
  for (std::int64_t i = 0; i < n; ++i) {
    if (decoupled) w[i] = w[i] * (1.0f - s.lr * s.weight_decay);
    const float gi = l2 ? g[i] + s.weight_decay * w[i] : g[i];
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * (gi * gi);
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    w[i] = w[i] - s.lr * mhat / (std::sqrt(vhat) + s.eps);
  }
}

double blocked_sumsq(const float* a, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t b = 0; b < n; b += kLarsNormBlock) {
    double part = 0.0;
    for (std::int64_t i = b; i < std::min(n, b + kLarsNormBlock); ++i) part += static_cast<double>(a[i]) * a[i];
    total += part;
  }
  return total;
}

void lars_ref(float* w, const float* g, float* v, std::int64_t n, const OptimizerScalars& s, bool wd_on) {
  const float wd = wd_on ? s.weight_decay : 0.0f;
  const auto wn = static_cast<float>(std::sqrt(blocked_sumsq(w, n)));
  const auto gn = static_cast<float>(std::sqrt(blocked_sumsq(g, n)));
  const float trust = (wn > 0.0f && gn > 0.0f) ? s.lars_eta * wn / (gn + wd * wn) : 1.0f;
  const float scale = s.lr * trust;
  for (std::int64_t i = 0; i < n; ++i) {
    v[i] = s.momentum * v[i] + scale * (g[i] + wd * w[i]);
    w[i] = w[i] - v[i];
  }
}

void run_kernel(Kind k, State& st, const Vec& g, const OptimizerScalars* s, bool wd_on, const std::int32_t* skip) {
  switch (k) {
    case Kind::Sgd: return sgd_update(st.w.data(), g.data(), kN, s, wd_on, skip);
    case Kind::Momentum: return momentum_update(st.w.data(), g.data(), st.m.data(), kN, s, wd_on, skip);
    case Kind::Nesterov: return nesterov_update(st.w.data(), g.data(), st.m.data(), kN, s, wd_on, skip);
    case Kind::Adam: return adam_update(st.w.data(), g.data(), st.m.data(), st.v.data(), kN, s, wd_on, skip);
    case Kind::AdamW: return adamw_update(st.w.data(), g.data(), st.m.data(), st.v.data(), kN, s, wd_on, skip);
    case Kind::Lars:
      return lars_update(st.w.data(), g.data(), st.m.data(), kSegments.data(), kSegments.size(), s, wd_on, skip);
  }
}

void run_reference(Kind k, State& st, const Vec& g, const OptimizerScalars& s, bool wd_on) {
  for (const LarsSegment& seg : kSegments) {
    float* w = st.w.data() + seg.offset;
    float* m = st.m.data() + seg.offset;
    float* v = st.v.data() + seg.offset;
    const float* gs = g.data() + seg.offset;
    switch (k) {
      case Kind::Sgd: sgd_ref(w, gs, seg.count, s, wd_on); break;
      case Kind::Momentum: momentum_ref(w, gs, m, seg.count, s, wd_on, false); break;
      case Kind::Nesterov: momentum_ref(w, gs, m, seg.count, s, wd_on, true); break;
      case Kind::Adam: adam_ref(w, gs, m, v, seg.count, s, wd_on, false); break;
      case Kind::AdamW: adam_ref(w, gs, m, v, seg.count, s, false, wd_on); break;
      case Kind::Lars: lars_ref(w, gs, m, seg.count, s, wd_on); break;
    }
  }
}

OptimizerScalars scalars() {
  OptimizerScalars s;
  s.lr = 0.05f;
  s.momentum = 0.9f;
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.eps = 1e-8f;
  s.weight_decay = 5e-4f;
  s.lars_eta = 0.001f;
  return s;
}

class OptimizerKinds : public ::testing::TestWithParam<Kind> {};

TEST_P(OptimizerKinds, MatchesPerTensorReferenceBitForBit) {
  const Kind kind = GetParam();
  for (bool wd_on : {true, false}) {
    State a{random_vec(kN, 1), Vec(kN, 0.0f), Vec(kN, 0.0f)};
    State b = a;
    OptimizerScalars s = scalars();
    const std::int32_t no_skip = 0;
    for (int step = 1; step <= 5; ++step) {
      s.step = static_cast<float>(step);
      s.lr = 0.05f / static_cast<float>(step);  // the scalars change between steps, as a schedule does
      const Vec g = random_vec(kN, 100 + step, -0.1f, 0.1f);
      run_kernel(kind, a, g, &s, wd_on, step % 2 ? &no_skip : nullptr);
      run_reference(kind, b, g, s, wd_on);
      const std::string what = std::string(kind_name(kind)) + (wd_on ? " wd" : " no-wd") + " step " +
                               std::to_string(step);
      expect_bits_equal(a.w, b.w, what + " w");
      expect_bits_equal(a.m, b.m, what + " m");
      expect_bits_equal(a.v, b.v, what + " v");
    }
  }
}

TEST_P(OptimizerKinds, SkipFlagLeavesEverythingUntouched) {
  const Kind kind = GetParam();
  State st{random_vec(kN, 2), random_vec(kN, 3), random_vec(kN, 4, 0.0f, 1.0f)};
  const State before = st;
  const OptimizerScalars s = scalars();
  const std::int32_t skip = 1;
  run_kernel(kind, st, random_vec(kN, 5), &s, true, &skip);
  EXPECT_EQ(st.w, before.w);
  EXPECT_EQ(st.m, before.m);
  EXPECT_EQ(st.v, before.v);
  const std::int32_t go = 0;
  run_kernel(kind, st, random_vec(kN, 5), &s, true, &go);
  EXPECT_NE(st.w, before.w);
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerKinds,
                         ::testing::Values(Kind::Sgd, Kind::Momentum, Kind::Nesterov, Kind::Adam, Kind::AdamW,
                                           Kind::Lars),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

TEST(Lars, ZeroNormSegmentUsesTrustOne) {
  Vec w(10, 0.0f), g(10, 0.5f), v(10, 0.0f);
  OptimizerScalars s = scalars();
  s.momentum = 0.0f;
  const LarsSegment seg{0, 10};
  lars_update(w.data(), g.data(), v.data(), &seg, 1, &s, true, nullptr);
  for (float x : w) EXPECT_EQ(x, -(s.lr * 0.5f));
}

TEST(Adam, FirstStepMovesByLearningRate) {
  // With bias correction, step 1 moves every weight by ≈ lr·sign(g) (|g| ≫ eps).
  Vec w(4, 1.0f), g = {0.3f, -0.2f, 1e-3f, -5.0f}, m(4, 0.0f), v(4, 0.0f);
  OptimizerScalars s = scalars();
  s.step = 1.0f;
  adam_update(w.data(), g.data(), m.data(), v.data(), 4, &s, false, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(w[i], 1.0f - s.lr * (g[i] > 0 ? 1.0f : -1.0f), 1e-5) << i;
}

}  // namespace
}  // namespace renaissance::cpu::test
