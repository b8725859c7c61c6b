// Region-wide operations and the software IEEE half conversion.
#include <kernels/cpu/half.h>
#include <kernels/cpu/range_ops.h>

#include "kernel_test_util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace renaissance::cpu::test {
namespace {

TEST(Half, EveryHalfRoundTrips) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    ASSERT_EQ(float_to_half(f), h) << std::hex << "half 0x" << h << " -> " << f;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);                 // largest finite
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);                 // below the rounding midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                 // midpoint rounds to even: inf
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);    // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);    // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);    // half of it: ties to even (0)
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -26)), 0x0001);    // 0.75 ulp rounds up
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);    // 1.5 ulp: ties to even (2)
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);       // tie, even stays
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(3.0f, -11)), 0x3c02);       // tie, odd rounds up
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24) + std::ldexp(1.0f, -25)), 0x0400);  // subnormal carries
  EXPECT_EQ(float_to_half(0.1f), 0x2e66);
  const std::uint16_t nan = float_to_half(std::nanf(""));
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x7c00), INFINITY);
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("f16c"))) std::uint16_t hardware_half(float f) {
  return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(Half, MatchesF16cOnRandomFloats) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C";
  std::mt19937 rng(5);
  for (int i = 0; i < 4'000'000; ++i) {
    // Random bit patterns cover every exponent; bias half of them to the half range.
    std::uint32_t bits = rng();
    if (i & 1) bits = (bits & 0x807fffffu) | ((100u + rng() % 50u) << 23);
    const float f = bits_float(bits);
    if (std::isnan(f)) continue;  // F16C quiets NaNs; ours keeps the payload (both NaN, checked above)
    ASSERT_EQ(float_to_half(f), hardware_half(f)) << std::hex << "float bits 0x" << bits;
  }
}
#endif

TEST(RangeOps, ClearCopyScaleEma) {
  const std::int64_t n = 100003;  // odd: the last piece is short
  Vec a = random_vec(n, 1), b(n, 7.0f);
  range_copy(b.data(), a.data(), n * sizeof(float));
  EXPECT_EQ(a, b);
  range_clear(b.data(), n * sizeof(float));
  EXPECT_EQ(b, Vec(n, 0.0f));

  Vec g = a;
  range_scale(g.data(), n, 0.125f);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(g[i], a[i] * 0.125f);

  Vec e = random_vec(n, 2);
  const Vec e0 = e;
  range_ema_update(e.data(), a.data(), n, 0.999f);
  const float keep = 0.999f, take = 1.0f - 0.999f;
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(e[i], keep * e0[i] + take * a[i]) << i;
}

TEST(RangeOps, CastsRoundTripThroughHalf) {
  const std::int64_t n = 70001;
  const Vec a = random_vec(n, 3, -1000.0f, 1000.0f);
  std::vector<std::uint16_t> h(n);
  Vec back(n);
  range_cast_f32_to_f16(a.data(), h.data(), n);
  range_cast_f16_to_f32(h.data(), back.data(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i], float_to_half(a[i]));
    ASSERT_LE(std::abs(back[i] - a[i]), std::abs(a[i]) * std::ldexp(1.0f, -11)) << i;  // half ulp
  }
}

TEST(RangeOps, FiniteCheckSetsButNeverClearsTheFlag) {
  const std::int64_t n = 200000;
  Vec v = random_vec(n, 4);
  std::int32_t flag = 0;
  EXPECT_FALSE(range_check_finite(v.data(), n, &flag));
  EXPECT_EQ(flag, 0);
  for (float bad : {INFINITY, -INFINITY, std::nanf("")}) {
    Vec w = v;
    w[n - 1] = bad;
    flag = 0;
    EXPECT_TRUE(range_check_finite(w.data(), n, &flag));
    EXPECT_EQ(flag, 1);
    EXPECT_FALSE(range_check_finite(v.data(), n, &flag));
    EXPECT_EQ(flag, 1) << "a clean range must not clear an earlier overflow";
  }
  std::vector<std::uint16_t> h(1000, 0x3c00);
  flag = 0;
  EXPECT_FALSE(range_check_finite_f16(h.data(), 1000, &flag));
  h[500] = 0x7c00;
  EXPECT_TRUE(range_check_finite_f16(h.data(), 1000, &flag));
  EXPECT_EQ(flag, 1);
}

}  // namespace
}  // namespace renaissance::cpu::test
