// ReLU, tanh, add2 and channel padding: forward against the definition, gradients against central
// differences (ReLU kinks skipped), accumulate flags.
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/half.h>

#include "kernel_test_util.h"

namespace renaissance::cpu::test {
namespace {

constexpr std::size_t kN = 3 * 7 * 5 * 3;

TEST(Relu, ForwardAndGradient) {
  const Vec x = random_vec(kN, 1), r = random_vec(kN, 2);
  Vec y(kN), dx(kN);
  relu_forward(x.data(), y.data(), kN);
  DVec ref(kN);
  for (std::size_t i = 0; i < kN; ++i) ref[i] = std::max(0.0, static_cast<double>(x[i]));
  expect_close(y, ref, 0.0, "relu forward");
  relu_backward(y.data(), r.data(), dx.data(), kN, false);
  const auto loss = [&](const DVec& v) {
    double s = 0.0;
    for (std::size_t i = 0; i < kN; ++i) s += std::max(0.0, v[i]) * r[i];
    return s;
  };
  expect_grad(dx, numeric_grad(loss, to_double(x)), 1e-6, "relu dx",
              [&](std::size_t i) { return std::abs(x[i]) < 1e-3f; });  // the kink at 0
  Vec acc = r;
  relu_backward(y.data(), r.data(), acc.data(), kN, true);
  for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(acc[i], r[i] + dx[i]);
  // In place (dx aliases dy), as the runtime does.
  Vec inplace = r;
  relu_backward(y.data(), inplace.data(), inplace.data(), kN, false);
  EXPECT_EQ(inplace, dx);
}

TEST(Relu, BackwardOfASumEqualsItsParts) {
  // relu_backward_sum (plan ADD_RELU_BWD) against its plain parts: ACCUMULATE (g += a, stored; binary16 in AMP plans),
  // then relu_backward. Bit for bit: the same operations in the same order, rounded where the parts store.
  const Vec x = random_vec(kN, 5), g = random_vec(kN, 6), a = random_vec(kN, 7, -1e-3f, 1e-3f);
  Vec y(kN);
  relu_forward(x.data(), y.data(), kN);
  for (bool f16 : {false, true}) {
    Vec sum(kN), parts(kN), fused(kN);
    for (std::size_t i = 0; i < kN; ++i) {
      sum[i] = g[i] + a[i];
      if (f16) sum[i] = half_to_float(float_to_half(sum[i]));
    }
    relu_backward(y.data(), sum.data(), parts.data(), kN, false);
    relu_backward_sum(y.data(), g.data(), a.data(), fused.data(), kN, f16);
    EXPECT_EQ(fused, parts) << (f16 ? "binary16" : "float");
    // and against the definition in double: dx = (g + a) where y > 0 (to the storage type's rounding)
    DVec ref(kN);
    for (std::size_t i = 0; i < kN; ++i) ref[i] = y[i] > 0 ? static_cast<double>(g[i]) + a[i] : 0.0;
    expect_close(fused, ref, f16 ? 1e-3 : 1e-6, "relu backward of a sum");
  }
  // The rounding is where the ACCUMULATE stores: a sum that rounds in binary16 differs from the unrounded one.
  const float g1 = 1.0f, a1 = 1e-4f, y1 = 1.0f;
  float d32 = 0, d16 = 0;
  relu_backward_sum(&y1, &g1, &a1, &d32, 1, false);
  relu_backward_sum(&y1, &g1, &a1, &d16, 1, true);
  EXPECT_EQ(d16, 1.0f);
  EXPECT_NE(d32, d16);
}

TEST(Tanh, ForwardAndGradient) {
  const Vec x = random_vec(kN, 3, -3.0f, 3.0f), r = random_vec(kN, 4);
  Vec y(kN), dx(kN);
  tanh_forward(x.data(), y.data(), kN);
  DVec ref(kN);
  for (std::size_t i = 0; i < kN; ++i) ref[i] = std::tanh(static_cast<double>(x[i]));
  expect_close(y, ref, 1e-6, "tanh forward");
  tanh_backward(y.data(), r.data(), dx.data(), kN, false);
  const auto loss = [&](const DVec& v) {
    double s = 0.0;
    for (std::size_t i = 0; i < kN; ++i) s += std::tanh(v[i]) * r[i];
    return s;
  };
  expect_grad(dx, numeric_grad(loss, to_double(x)), 1e-5, "tanh dx");
  Vec acc = r;
  tanh_backward(y.data(), r.data(), acc.data(), kN, true);
  for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(acc[i], r[i] + dx[i]);
}

// The activations of ops/activations.h, each against its definition in double precision (written here, not taken
// from the functor) and its gradient against central differences of that definition.
double activation_reference(ops::Activation a, double x) {
  switch (a) {
    case ops::Activation::Silu: return x / (1.0 + std::exp(-x));
  }
  ADD_FAILURE() << "no double reference for activation " << ops::activation_name(a);
  return 0.0;
}

class Activation : public ::testing::TestWithParam<ops::Activation> {};

TEST_P(Activation, ForwardAndGradientAgainstDoubleReference) {
  const ops::Activation a = GetParam();
  // Wide enough for both tails (x·σ(x) → 0 and → x), and ±30 where e^(−x) is huge or tiny.
  Vec x = random_vec(kN, 7, -8.0f, 8.0f);
  x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f;
  const Vec r = random_vec(kN, 8);
  Vec y(kN), dx(kN);
  activation_forward(a, x.data(), y.data(), kN);
  DVec ref(kN);
  for (std::size_t i = 0; i < kN; ++i) ref[i] = activation_reference(a, static_cast<double>(x[i]));
  expect_close(y, ref, 1e-6, std::string(ops::activation_name(a)) + " forward");
  activation_backward(a, x.data(), r.data(), dx.data(), kN, false);
  const auto loss = [&](const DVec& v) {
    double s = 0.0;
    for (std::size_t i = 0; i < kN; ++i) s += activation_reference(a, v[i]) * r[i];
    return s;
  };
  expect_grad(dx, numeric_grad(loss, to_double(x)), 1e-5, std::string(ops::activation_name(a)) + " dx");
  Vec acc = r;
  activation_backward(a, x.data(), r.data(), acc.data(), kN, true);
  for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(acc[i], r[i] + dx[i]);
  for (const float v : y) ASSERT_TRUE(std::isfinite(v));
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Activation);  // a table without activations
INSTANTIATE_TEST_SUITE_P(All, Activation, ::testing::ValuesIn(ops::kActivations),
                         [](const ::testing::TestParamInfo<ops::Activation>& i) {
                           return std::string(ops::activation_name(i.param));
                         });

TEST(Add2, Forward) {
  const Vec a = random_vec(kN, 5), b = random_vec(kN, 6);
  Vec y(kN);
  add2_forward(a.data(), b.data(), y.data(), kN);
  for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
}

TEST(ChannelPad, ForwardAndBackward) {
  const std::int64_t rows = 3 * 7 * 5, c = 3, c_out = 8;
  const Vec x = random_vec(rows * c, 7);
  Vec y(rows * c_out, 99.0f);
  channel_pad_forward(x.data(), rows, c, c_out, y.data());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c_out; ++j) ASSERT_EQ(y[r * c_out + j], j < c ? x[r * c + j] : 0.0f);
  // Backward is the adjoint: <pad(x), dy> = <x, unpad(dy)>.
  const Vec dy = random_vec(rows * c_out, 8);
  Vec dx(rows * c);
  channel_pad_backward(dy.data(), rows, c_out, c, dx.data(), false);
  const auto loss = [&](const DVec& v) {
    double s = 0.0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < c; ++j) s += v[r * c + j] * dy[r * c_out + j];
    return s;
  };
  expect_grad(dx, numeric_grad(loss, to_double(x)), 1e-6, "channel pad dx");
  Vec acc = x;
  channel_pad_backward(dy.data(), rows, c_out, c, acc.data(), true);
  for (std::int64_t i = 0; i < rows * c; ++i) ASSERT_EQ(acc[i], x[i] + dx[i]);
}

}  // namespace
}  // namespace renaissance::cpu::test
