// Max pooling (with and without saved argmax) and global average pooling: forward against the
// definition, gradients against central differences (inputs without near-ties).
#include <kernels/cpu/pooling.h>
#include <renaissance/core/error.h>

#include "kernel_test_util.h"

namespace renaissance::cpu::test {
namespace {

// Distinct values ≥ 0.01 apart in random order: no window has a tie a finite difference could flip.
Vec tie_free(std::size_t n, std::uint32_t seed) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = -3.0f + 0.01f * static_cast<float>(i);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

struct PoolCase {
  Shape xs;
  Pool2dParams p;
  const char* name;
};

const PoolCase kCases[] = {
    {{3, 7, 5, 3}, {2, 2, 2, 2, 0, 0}, "k2_s2"},
    {{3, 7, 5, 3}, {3, 3, 2, 2, 1, 1}, "k3_s2_p1_overlap"},
    {{2, 6, 6, 4}, {3, 3, 1, 1, 1, 1}, "k3_s1_p1"},
    {{2, 5, 7, 2}, {3, 2, 2, 1, 0, 1}, "k32_s21_p01"},
};

class MaxPoolCases : public ::testing::TestWithParam<PoolCase> {};

TEST_P(MaxPoolCases, ForwardArgmaxAndGradient) {
  const PoolCase& cs = GetParam();
  const Shape ys = maxpool2d_output_shape(cs.xs, cs.p);
  const Vec x = tie_free(static_cast<std::size_t>(cs.xs.elems()), 1);
  Vec y(static_cast<std::size_t>(ys.elems())), y2(y.size());
  std::vector<std::uint8_t> arg(y.size());
  maxpool2d_forward(x.data(), cs.xs, y.data(), ys, cs.p, arg.data());
  maxpool2d_forward(x.data(), cs.xs, y2.data(), ys, cs.p, nullptr);
  const DVec ref = maxpool_ref(to_double(x), cs.xs, ys, cs.p);
  expect_close(y, ref, 0.0, std::string(cs.name) + " forward");
  EXPECT_EQ(y, y2);
  for (std::size_t i = 0; i < y.size(); ++i) {  // the window position points at the maximum of its own channel
    const auto k = static_cast<std::int64_t>(i);
    const std::int64_t c = k % ys.c, ox = k / ys.c % ys.w, oy = k / (ys.c * ys.w) % ys.h, n = k / (ys.h * ys.w * ys.c);
    ASSERT_LT(arg[i], cs.p.kernel_h * cs.p.kernel_w) << i;
    const std::int64_t iy = oy * cs.p.stride_h - cs.p.pad_h + arg[i] / cs.p.kernel_w;
    const std::int64_t ix = ox * cs.p.stride_w - cs.p.pad_w + arg[i] % cs.p.kernel_w;
    ASSERT_TRUE(iy >= 0 && iy < cs.xs.h && ix >= 0 && ix < cs.xs.w) << i;
    ASSERT_EQ(x[((n * cs.xs.h + iy) * cs.xs.w + ix) * cs.xs.c + c], y[i]) << i;
  }

  const Vec r = random_vec(y.size(), 2);
  Vec dx(x.size()), dx2(x.size());
  maxpool2d_backward(r.data(), ys, x.data(), arg.data(), dx.data(), cs.xs, cs.p, false);
  maxpool2d_backward(r.data(), ys, x.data(), nullptr, dx2.data(), cs.xs, cs.p, false);
  EXPECT_EQ(dx, dx2);
  const DVec rd = to_double(r);
  const auto loss = [&](const DVec& v) { return dot(maxpool_ref(v, cs.xs, ys, cs.p), rd); };
  expect_grad(dx, numeric_grad(loss, to_double(x), 1e-4), 1e-6, std::string(cs.name) + " dx");
  Vec acc = x;
  maxpool2d_backward(r.data(), ys, nullptr, arg.data(), acc.data(), cs.xs, cs.p, true);
  // (x + g1) + g2 versus x + (g1 + g2) where windows overlap: equal up to rounding.
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(acc[i], x[i] + dx[i], 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MaxPoolCases, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MaxPool, TiesPickTheFirstInWindowOrder) {
  const Shape xs{1, 2, 2, 1};
  const Vec x = {1.0f, 1.0f, 1.0f, 0.0f};
  Vec y(1);
  std::uint8_t arg = 77;
  maxpool2d_forward(x.data(), xs, y.data(), {1, 1, 1, 1}, {2, 2, 2, 2, 0, 0}, &arg);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(arg, 0);
  // the second of two equal maxima in a later row of the window: position kh·kernel_w + kw = 1·2 + 1
  const Vec x2 = {0.0f, -1.0f, 2.0f, 3.0f};
  maxpool2d_forward(x2.data(), xs, y.data(), {1, 1, 1, 1}, {2, 2, 2, 2, 0, 0}, &arg);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(arg, 3);
}

TEST(MaxPool, RejectsOversizedPadding) {
  EXPECT_THROW(maxpool2d_output_shape({1, 4, 4, 1}, {2, 2, 2, 2, 2, 2}), Error);
  // a window of more than 255 positions does not fit the one-byte argmax
  EXPECT_THROW(maxpool2d_output_shape({1, 20, 20, 1}, {16, 16, 1, 1, 0, 0}), Error);
  EXPECT_NO_THROW(maxpool2d_output_shape({1, 20, 20, 1}, {15, 15, 1, 1, 0, 0}));
}

TEST(GlobalAvgPool, ForwardAndGradient) {
  const Shape xs{3, 7, 5, 6};
  const Vec x = random_vec(static_cast<std::size_t>(xs.elems()), 3);
  Vec y(xs.n * xs.c);
  global_avgpool_forward(x.data(), xs, y.data());
  const auto ref = [&](const DVec& v) {
    DVec out(static_cast<std::size_t>(xs.n * xs.c), 0.0);
    for (std::int64_t n = 0; n < xs.n; ++n)
      for (std::int64_t i = 0; i < xs.h * xs.w; ++i)
        for (std::int64_t c = 0; c < xs.c; ++c) out[n * xs.c + c] += v[(n * xs.h * xs.w + i) * xs.c + c] / 35.0;
    return out;
  };
  expect_close(y, ref(to_double(x)), 1e-6, "gap forward");
  const Vec r = random_vec(y.size(), 4);
  Vec dx(x.size());
  global_avgpool_backward(r.data(), dx.data(), xs, false);
  const DVec rd = to_double(r);
  expect_grad(dx, numeric_grad([&](const DVec& v) { return dot(ref(v), rd); }, to_double(x)), 1e-6, "gap dx");
  Vec acc = x;
  global_avgpool_backward(r.data(), acc.data(), xs, true);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], x[i] + dx[i]);
}

}  // namespace
}  // namespace renaissance::cpu::test
