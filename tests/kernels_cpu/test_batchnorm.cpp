// Batch norm: training/inference forward against a double reference (including running statistics with
// the unbiased variance), gradients (through the batch statistics) against central differences.
#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/range_ops.h>
#include <renaissance/core/error.h>

#include "kernel_test_util.h"

namespace renaissance::cpu::test {
namespace {

struct BnCase {
  Shape s;
  float offset;  // added to x: a large mean must not cost precision
  const char* name;
};

const BnCase kCases[] = {
    {{3, 7, 5, 3}, 0.0f, "2d_odd"},
    {{6, 1, 1, 5}, 0.0f, "1d"},
    {{4, 9, 9, 17}, 0.0f, "2d_rows324"},  // more than one 256-row reduction block
    {{3, 7, 5, 3}, 100.0f, "2d_mean100"},
};

class BatchNormCases : public ::testing::TestWithParam<BnCase> {};

TEST_P(BatchNormCases, TrainingForwardAndRunningStats) {
  const BnCase& cs = GetParam();
  const std::int64_t c = cs.s.c, rows = cs.s.n * cs.s.h * cs.s.w;
  Vec x = random_vec(static_cast<std::size_t>(cs.s.elems()), 1, -2.0f, 2.0f);
  for (auto& v : x) v += cs.offset;
  const Vec gamma = random_vec(c, 2, 0.5f, 1.5f), beta = random_vec(c, 3);
  Vec y(x.size()), mean(c), invstd(c), rmean = random_vec(c, 4), rvar = random_vec(c, 5, 0.5f, 2.0f);
  const Vec rmean0 = rmean, rvar0 = rvar;
  batchnorm_forward_train(x.data(), cs.s, gamma.data(), beta.data(), y.data(), mean.data(), invstd.data(),
                          rmean.data(), rvar.data(), 0.1f, 1e-5f);
  DVec rm, rv;
  const DVec ref = bn_train_ref(to_double(x), cs.s, to_double(gamma), to_double(beta), 1e-5, &rm, &rv);
  expect_close(y, ref, 1e-5, std::string(cs.name) + " y");
  DVec rinv(c), new_rm(c), new_rv(c);
  for (std::int64_t j = 0; j < c; ++j) {
    rinv[j] = 1.0 / std::sqrt(rv[j] + 1e-5);
    new_rm[j] = 0.9 * rmean0[j] + 0.1 * rm[j];
    new_rv[j] = 0.9 * rvar0[j] + 0.1 * rv[j] * static_cast<double>(rows) / static_cast<double>(rows - 1);
  }
  expect_close(mean, rm, 1e-6, std::string(cs.name) + " save_mean");
  expect_close(invstd, rinv, 1e-5, std::string(cs.name) + " save_invstd");
  expect_close(rmean, new_rm, 1e-6, std::string(cs.name) + " running_mean");
  expect_close(rvar, new_rv, 1e-5, std::string(cs.name) + " running_var (unbiased)");
}

TEST_P(BatchNormCases, InferenceForward) {
  const BnCase& cs = GetParam();
  const std::int64_t c = cs.s.c;
  const Vec x = random_vec(static_cast<std::size_t>(cs.s.elems()), 6), gamma = random_vec(c, 7),
            beta = random_vec(c, 8), rmean = random_vec(c, 9), rvar = random_vec(c, 10, 0.1f, 3.0f);
  Vec y(x.size());
  batchnorm_forward_inference(x.data(), cs.s, gamma.data(), beta.data(), rmean.data(), rvar.data(), y.data(), 1e-3f);
  DVec ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t j = i % c;
    ref[i] = (x[i] - static_cast<double>(rmean[j])) / std::sqrt(rvar[j] + 1e-3) * gamma[j] + beta[j];
  }
  expect_close(y, ref, 1e-5, cs.name);
}

TEST_P(BatchNormCases, GradientsMatchFiniteDifferences) {
  const BnCase& cs = GetParam();
  const std::int64_t c = cs.s.c;
  Vec x = random_vec(static_cast<std::size_t>(cs.s.elems()), 11, -2.0f, 2.0f);
  for (auto& v : x) v += cs.offset;
  const Vec gamma = random_vec(c, 12, 0.5f, 1.5f), beta = random_vec(c, 13);
  const Vec r = random_vec(x.size(), 14);  // L = Σ y·r
  Vec y(x.size()), mean(c), invstd(c);
  batchnorm_forward_train(x.data(), cs.s, gamma.data(), beta.data(), y.data(), mean.data(), invstd.data(), nullptr,
                          nullptr);
  Vec dx(x.size()), dgamma(c), dbeta(c);
  batchnorm_backward(x.data(), r.data(), cs.s, gamma.data(), mean.data(), invstd.data(), dx.data(), dgamma.data(),
                     dbeta.data(), false, false);
  const DVec xd = to_double(x), gd = to_double(gamma), bd = to_double(beta), rd = to_double(r);
  const auto lx = [&](const DVec& v) { return dot(bn_train_ref(v, cs.s, gd, bd, 1e-5), rd); };
  const auto lg = [&](const DVec& v) { return dot(bn_train_ref(xd, cs.s, v, bd, 1e-5), rd); };
  const auto lb = [&](const DVec& v) { return dot(bn_train_ref(xd, cs.s, gd, v, 1e-5), rd); };
  // A large mean makes the FP32 x − mean itself lose digits (|x| = 100: ~4e-6 absolute).
  const double tol = cs.offset > 0.0f ? 2e-3 : 1e-4;
  expect_grad(dx, numeric_grad(lx, xd, 1e-6), tol, std::string(cs.name) + " dx");
  expect_grad(dgamma, numeric_grad(lg, gd), tol, std::string(cs.name) + " dgamma");
  expect_grad(dbeta, numeric_grad(lb, bd), tol, std::string(cs.name) + " dbeta");

  // accumulate adds; null outputs are skipped.
  Vec ax = random_vec(x.size(), 15), ag = random_vec(c, 16), ab = random_vec(c, 17);
  const Vec ax0 = ax, ag0 = ag, ab0 = ab;
  batchnorm_backward(x.data(), r.data(), cs.s, gamma.data(), mean.data(), invstd.data(), ax.data(), ag.data(),
                     ab.data(), true, true);
  for (std::size_t i = 0; i < ax.size(); ++i) ASSERT_NEAR(ax[i], ax0[i] + dx[i], 1e-5) << i;
  for (std::int64_t j = 0; j < c; ++j) {
    ASSERT_NEAR(ag[j], ag0[j] + dgamma[j], 1e-5);
    ASSERT_NEAR(ab[j], ab0[j] + dbeta[j], 1e-5);
  }
  Vec only_dx(x.size());
  batchnorm_backward(x.data(), r.data(), cs.s, gamma.data(), mean.data(), invstd.data(), only_dx.data(), nullptr,
                     nullptr, false, false);
  EXPECT_EQ(only_dx, dx);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormCases, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- fused passes: bit for bit the plain parts ---------------------------------------------------------------

/// v rounded to binary16 and back, as an FP16 store and load do (through the range casts the runtime uses).
Vec through_f16(const Vec& v) {
  std::vector<std::uint16_t> h(v.size());
  Vec out(v.size());
  range_cast_f32_to_f16(v.data(), h.data(), static_cast<std::int64_t>(v.size()));
  range_cast_f16_to_f32(h.data(), out.data(), static_cast<std::int64_t>(v.size()));
  return out;
}

const Shape kFusedShapes[] = {{3, 7, 5, 3}, {4, 9, 9, 17}, {2, 12, 12, 32}};

TEST(BatchNormFused, StatisticsAreTheTrainingForwardsOwn) {
  for (const Shape& s : kFusedShapes) {
    const Vec x = random_vec(static_cast<std::size_t>(s.elems()), 201, -2.0f, 3.0f), g = random_vec(s.c, 202),
              b = random_vec(s.c, 203);
    Vec y(x.size()), m1(s.c), i1(s.c), rm1(s.c, 0.5f), rv1(s.c, 2.0f), m2(s.c), i2(s.c), rm2 = rm1, rv2 = rv1;
    batchnorm_forward_train(x.data(), s, g.data(), b.data(), y.data(), m1.data(), i1.data(), rm1.data(), rv1.data(),
                            0.3f, 1e-4f);
    batchnorm_train_statistics(x.data(), s, m2.data(), i2.data(), rm2.data(), rv2.data(), 0.3f, 1e-4f);
    expect_bits_equal(m2, m1, s.str() + " mean");
    expect_bits_equal(i2, i1, s.str() + " invstd");
    expect_bits_equal(rm2, rm1, s.str() + " running mean");
    expect_bits_equal(rv2, rv1, s.str() + " running var");
  }
}

// BN [→ ADD2(·, s) | → ADD2(·, BN(x2))] [→ RELU], training and inference, FP32 and rounded to FP16 as the AMP parts
// store: one fused pass equals the parts run one by one.
TEST(BatchNormFused, ApplyEqualsThePlainPartsBitForBit) {
  for (const Shape& s : kFusedShapes)
    for (bool train : {true, false})
      for (bool f16 : {false, true})
        for (BnShortcut kind : {BnShortcut::kNone, BnShortcut::kTensor, BnShortcut::kBatchNorm})
          for (bool relu : {false, true}) {
            const std::string tag = s.str() + (train ? " train" : " infer") + (f16 ? " f16" : " f32") + " kind " +
                                    std::to_string(static_cast<int>(kind)) + (relu ? " relu" : "");
            const std::int64_t c = s.c;
            auto input = [&](std::uint32_t seed) {
              const Vec v = random_vec(static_cast<std::size_t>(s.elems()), seed, -2.0f, 2.5f);
              return f16 ? through_f16(v) : v;  // FP16 tensors hold binary16 values
            };
            const Vec x1 = input(211), x2 = input(212);
            const Vec g1 = random_vec(c, 213, 0.5f, 1.5f), b1 = random_vec(c, 214), g2 = random_vec(c, 215, 0.5f, 1.5f),
                      b2 = random_vec(c, 216), rm = random_vec(c, 217), rv = random_vec(c, 218, 0.2f, 2.0f);
            auto store = [&](const Vec& v) { return f16 ? through_f16(v) : v; };
            // The parts.
            Vec m1(c), i1(c), m2(c), i2(c), y1(x1.size()), y2(x1.size());
            if (train) {
              batchnorm_forward_train(x1.data(), s, g1.data(), b1.data(), y1.data(), m1.data(), i1.data(), nullptr,
                                      nullptr);
              batchnorm_forward_train(x2.data(), s, g2.data(), b2.data(), y2.data(), m2.data(), i2.data(), nullptr,
                                      nullptr);
            } else {
              batchnorm_forward_inference(x1.data(), s, g1.data(), b1.data(), rm.data(), rv.data(), y1.data(), 1e-3f);
              batchnorm_forward_inference(x2.data(), s, g2.data(), b2.data(), rm.data(), rv.data(), y2.data(), 1e-3f);
            }
            Vec plain = store(y1);
            if (kind != BnShortcut::kNone) {
              const Vec sc = kind == BnShortcut::kTensor ? x2 : store(y2);
              Vec sum(plain.size());
              add2_forward(plain.data(), sc.data(), sum.data(), static_cast<std::int64_t>(sum.size()));
              plain = store(sum);
            }
            if (relu) {
              Vec r(plain.size());
              relu_forward(plain.data(), r.data(), static_cast<std::int64_t>(r.size()));
              plain = store(r);
            }
            // One fused pass.
            BnApply a, b;
            a.x = x1.data(), a.gamma = g1.data(), a.beta = b1.data(), a.eps = 1e-3f;
            b.x = x2.data(), b.gamma = g2.data(), b.beta = b2.data(), b.eps = 1e-3f;
            if (train) {
              a.mean = m1.data(), a.invstd = i1.data(), b.mean = m2.data(), b.invstd = i2.data();
            } else {
              a.mean = b.mean = rm.data(), a.running_var = b.running_var = rv.data();
            }
            Vec fused(x1.size());
            batchnorm_apply_fused(a, s, kind, x2.data(), &b, relu, f16, fused.data());
            expect_bits_equal(fused, plain, tag);
            // In place over the BN input, as the runtime's parts run.
            Vec in_place = x1;
            a.x = in_place.data();
            batchnorm_apply_fused(a, s, kind, x2.data(), &b, relu, f16, in_place.data());
            expect_bits_equal(in_place, plain, tag + " in place");
          }
}

// RELU_BWD → BN_BWD as one: the mask recomputed from x equals the one the ReLU output gives, also where the BN output
// is a tiny positive value that binary16 rounds to zero (FP16 storage: the ReLU saw 0).
TEST(BatchNormFused, ReluBackwardFoldedEqualsThePlainPartsBitForBit) {
  for (const Shape& s : kFusedShapes)
    for (bool f16 : {false, true})
      for (bool acc : {false, true}) {
        const std::string tag = s.str() + (f16 ? " f16" : " f32") + (acc ? " accumulate" : "");
        const std::int64_t c = s.c;
        auto store = [&](const Vec& v) { return f16 ? through_f16(v) : v; };
        const Vec x = store(random_vec(static_cast<std::size_t>(s.elems()), 221, -2.0f, 2.0f));
        const Vec dy = store(random_vec(x.size(), 222));
        // Channel 0: γ = 1e-9, β = 0, so its BN outputs are ±1e-9-sized: positive in FP32 where x > mean, all
        // zero once rounded to binary16.
        Vec gamma = random_vec(c, 223, 0.5f, 1.5f), beta = random_vec(c, 224);
        gamma[0] = 1e-9f;
        beta[0] = 0.0f;
        Vec mean(c), invstd(c), y(x.size());
        batchnorm_train_statistics(x.data(), s, mean.data(), invstd.data(), nullptr, nullptr);
        Vec m2(c), i2(c);
        batchnorm_forward_train(x.data(), s, gamma.data(), beta.data(), y.data(), m2.data(), i2.data(), nullptr, nullptr);
        Vec r(y.size());
        const Vec ys = store(y);
        relu_forward(ys.data(), r.data(), static_cast<std::int64_t>(r.size()));
        const Vec rs = store(r);
        // The parts: relu_backward from the ReLU output, then batchnorm_backward.
        Vec g(x.size());
        relu_backward(rs.data(), dy.data(), g.data(), static_cast<std::int64_t>(g.size()), false);
        const Vec gs = store(g);
        const Vec dx0 = random_vec(x.size(), 225), dg0 = random_vec(c, 226), db0 = random_vec(c, 227);
        Vec dx = dx0, dg = dg0, db = db0;
        batchnorm_backward(x.data(), gs.data(), s, gamma.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
                           db.data(), acc, acc);
        Vec fx = dx0, fg = dg0, fb = db0;
        batchnorm_relu_backward(x.data(), dy.data(), s, gamma.data(), beta.data(), mean.data(), invstd.data(), f16,
                                fx.data(), fg.data(), fb.data(), acc, acc);
        expect_bits_equal(fx, dx, tag + " dx");
        expect_bits_equal(fg, dg, tag + " dgamma");
        expect_bits_equal(fb, db, tag + " dbeta");
        std::int64_t positive = 0;
        for (std::int64_t i = 0; i < s.elems(); i += c) positive += rs[static_cast<std::size_t>(i)] > 0.0f;
        EXPECT_EQ(positive > 0, !f16) << tag << ": channel 0's ReLU output should be positive somewhere only in FP32";
      }
}

TEST(BatchNormChecks, OneValuePerChannelThrows) {
  Vec x(3), y(3), m(3), s(3), g(3, 1.0f), b(3, 0.0f);
  EXPECT_THROW(batchnorm_forward_train(x.data(), {1, 1, 1, 3}, g.data(), b.data(), y.data(), m.data(), s.data(),
                                       nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace renaissance::cpu::test
