// Batch norm: training/inference forward against a double reference (including running statistics with
// the unbiased variance), gradients (through the batch statistics) against central differences.
#include <kernels/cpu/batchnorm.h>
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

TEST(BatchNormChecks, OneValuePerChannelThrows) {
  Vec x(3), y(3), m(3), s(3), g(3, 1.0f), b(3, 0.0f);
  EXPECT_THROW(batchnorm_forward_train(x.data(), {1, 1, 1, 3}, g.data(), b.data(), y.data(), m.data(), s.data(),
                                       nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace renaissance::cpu::test
