// Softmax cross-entropy with label smoothing, and metric accumulation.
#include <kernels/cpu/metrics.h>
#include <kernels/cpu/softmax_ce.h>
#include <renaissance/core/error.h>

#include "kernel_test_util.h"

#include <cmath>
#include <limits>

namespace renaissance::cpu::test {
namespace {

std::vector<std::int32_t> random_labels(std::int64_t n, std::int64_t classes, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> u(0, static_cast<std::int32_t>(classes - 1));
  std::vector<std::int32_t> l(static_cast<std::size_t>(n));
  for (auto& v : l) v = u(rng);
  return l;
}

TEST(SoftmaxCe, LossProbabilitiesAndGradient) {
  const std::int64_t batch = 7, classes = 10;
  for (float eps : {0.0f, 0.1f}) {
    const Vec z = random_vec(batch * classes, 1, -4.0f, 4.0f);
    const auto labels = random_labels(batch, classes, 2);
    Vec p(z.size()), dz(z.size());
    const float loss = softmax_ce_forward(z.data(), labels.data(), batch, classes, eps, p.data());
    const DVec zd = to_double(z);
    EXPECT_NEAR(loss, ce_ref(zd, labels, classes, eps), 1e-6 * std::max(1.0, static_cast<double>(loss)));
    DVec pref(z.size());
    for (std::int64_t i = 0; i < batch; ++i) {
      double s = 0.0;
      for (std::int64_t k = 0; k < classes; ++k) s += std::exp(zd[i * classes + k]);
      for (std::int64_t k = 0; k < classes; ++k) pref[i * classes + k] = std::exp(zd[i * classes + k]) / s;
    }
    expect_close(p, pref, 1e-6, "probabilities");
    softmax_ce_backward(p.data(), labels.data(), batch, classes, eps, 1.0f, dz.data(), false);
    expect_grad(dz, numeric_grad([&](const DVec& v) { return ce_ref(v, labels, classes, eps); }, zd), 1e-5,
                "dlogits eps=" + std::to_string(eps));
    // loss_scale multiplies the gradient (AMP); accumulate adds.
    Vec scaled(z.size()), acc = dz;
    softmax_ce_backward(p.data(), labels.data(), batch, classes, eps, 1024.0f, scaled.data(), false);
    for (std::size_t i = 0; i < dz.size(); ++i) ASSERT_NEAR(scaled[i], 1024.0f * dz[i], 1e-3) << i;
    softmax_ce_backward(p.data(), labels.data(), batch, classes, eps, 1.0f, acc.data(), true);
    for (std::size_t i = 0; i < dz.size(); ++i) ASSERT_EQ(acc[i], dz[i] + dz[i]);
  }
}

TEST(SoftmaxCe, ExtremeLogitsStayFinite) {
  const Vec z = {1000.0f, -1000.0f, 0.0f, -80.0f, 80.0f, 0.0f};
  const std::vector<std::int32_t> labels = {1, 0};
  Vec p(z.size());
  const float loss = softmax_ce_forward(z.data(), labels.data(), 2, 3, 0.1f, p.data());
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, ce_ref(to_double(z), labels, 3, 0.1), 1e-3);
}

TEST(SoftmaxCe, LabelOutOfRangeNamesSampleAndLabel) {
  const Vec z(4 * 10, 0.0f);
  Vec p(z.size());
  const std::vector<std::int32_t> labels = {1, 2, 10, 3};
  try {
    softmax_ce_forward(z.data(), labels.data(), 4, 10, 0.0f, p.data());
    FAIL() << "no error for label 10 of 10 classes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("label 10"), std::string::npos) << e.what();
  }
  const std::vector<std::int32_t> negative = {0, -1, 0, 0};
  EXPECT_THROW(softmax_ce_backward(p.data(), negative.data(), 4, 10, 0.0f, 1.0f, p.data(), false), Error);
  float result[4] = {};
  EXPECT_THROW(accumulate_metrics(z.data(), negative.data(), 4, 10, 0.0f, result, nullptr), Error);
}

TEST(Metrics, TopKCountsLossAndPredictions) {
  // Three samples, 6 classes; label ranks 0, 5 and 2.
  const Vec z = {5, 1, 2, 3, 4, 0,   // label 0: rank 0 (top-1 and top-5)
                 0, 1, 2, 3, 4, 5,   // label 0: rank 5 (neither)
                 1, 3, 3, 2, 0, 0};  // label 2: z ties with class 1 (lower index wins): rank 1
  const std::vector<std::int32_t> labels = {0, 0, 2};
  float result[4] = {1.0f, 0.0f, 0.0f, 10.0f};  // accumulates onto what is there
  std::vector<std::int32_t> pred(3, -1);
  accumulate_metrics(z.data(), labels.data(), 3, 6, 0.0f, result, pred.data());
  EXPECT_NEAR(result[0], 1.0 + 3.0 * ce_ref(to_double(z), labels, 6, 0.0), 1e-5);
  EXPECT_EQ(result[1], 1.0f);
  EXPECT_EQ(result[2], 2.0f);
  EXPECT_EQ(result[3], 13.0f);
  EXPECT_EQ(pred, (std::vector<std::int32_t>{0, 5, 1}));
}

// NaN logits count as wrong: weights with a NaN made every comparison false, so every sample had rank 0 and an
// evaluation of NaN logits reported top-1 1.0.
TEST(Metrics, NanLogitsAreNeverCorrect) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Vec z = {nan, nan, nan, nan, nan, nan,  // all NaN, label 0: wrong
                 nan, 1, 2, 3, 4, 5,            // label 5 is the largest number, but a NaN outranks it: top-5 only
                 1, 0, nan, 0, 0, 0,            // the label's own logit is NaN: wrong
                 3, 0, 0, 0, 0, 0};             // no NaN: right
  const std::vector<std::int32_t> labels = {0, 5, 2, 0};
  float result[4] = {};
  accumulate_metrics(z.data(), labels.data(), 4, 6, 0.0f, result, nullptr);
  EXPECT_TRUE(std::isnan(result[0]));
  EXPECT_EQ(result[1], 1.0f);
  EXPECT_EQ(result[2], 2.0f);
  EXPECT_EQ(result[3], 4.0f);
  // With 5 classes or fewer every rank is in the top 5: a NaN label logit still is not.
  const Vec few = {nan, 1, 2, 0, 1, 2};
  const std::vector<std::int32_t> first = {0, 2};
  float r3[4] = {};
  accumulate_metrics(few.data(), first.data(), 2, 3, 0.0f, r3, nullptr);
  EXPECT_EQ(r3[1], 1.0f);
  EXPECT_EQ(r3[2], 1.0f);
}

}  // namespace
}  // namespace renaissance::cpu::test
