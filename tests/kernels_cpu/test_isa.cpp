// The instruction-set variants of the element-wise kernels (kernels/cpu/isa.h): every level this CPU runs gives the
// generic build's bits, on odd shapes (channel counts that are not a multiple of any vector width, a row count that
// ends inside a reduction block), in place and accumulating, FP32 and the binary16-rounding AMP paths.
#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/isa.h>

#include "kernel_test_util.h"

#include <functional>
#include <vector>

namespace renaissance::cpu::test {
namespace {

/// The outputs of every kernel of batchnorm.h and elementwise.h for one shape, under the current level.
std::vector<Vec> run_all(const Shape& s, bool round_f16) {
  const std::size_t n = static_cast<std::size_t>(s.elems()), c = static_cast<std::size_t>(s.c);
  const Vec x = random_vec(n, 1, -2.0f, 2.0f), x2 = random_vec(n, 2, -2.0f, 2.0f), dy = random_vec(n, 3),
            g = random_vec(c, 4, 0.5f, 1.5f), b = random_vec(c, 5, -0.5f, 0.5f), rv = random_vec(c, 6, 0.5f, 2.0f);
  std::vector<Vec> out;
  auto keep = [&](const Vec& v) { out.push_back(v); };

  Vec y(n), mean(c), inv(c), rmean(c, 0.1f), rvar(c, 0.9f);
  batchnorm_forward_train(x.data(), s, g.data(), b.data(), y.data(), mean.data(), inv.data(), rmean.data(),
                          rvar.data());
  keep(y), keep(mean), keep(inv), keep(rmean), keep(rvar);
  Vec yi(n);
  batchnorm_forward_inference(x.data(), s, g.data(), b.data(), rmean.data(), rv.data(), yi.data());
  keep(yi);
  Vec m2(c), i2(c);
  batchnorm_train_statistics(x2.data(), s, m2.data(), i2.data(), nullptr, nullptr);
  keep(m2), keep(i2);
  for (const bool acc : {false, true}) {
    Vec dx = random_vec(n, 7), dg = random_vec(c, 8), db = random_vec(c, 9);
    batchnorm_backward(x.data(), dy.data(), s, g.data(), mean.data(), inv.data(), dx.data(), dg.data(), db.data(), acc,
                       acc);
    keep(dx), keep(dg), keep(db);
    Vec rx = random_vec(n, 10), rg = random_vec(c, 11), rb = random_vec(c, 12);
    batchnorm_relu_backward(x.data(), dy.data(), s, g.data(), b.data(), mean.data(), inv.data(), round_f16, rx.data(),
                            rg.data(), rb.data(), acc, acc);
    keep(rx), keep(rg), keep(rb);
  }
  BnApply a, a2;
  a.x = x.data(), a.gamma = g.data(), a.beta = b.data(), a.mean = mean.data(), a.invstd = inv.data();
  a2.x = x2.data(), a2.gamma = g.data(), a2.beta = b.data(), a2.mean = m2.data(), a2.invstd = i2.data();
  for (const BnShortcut kind : {BnShortcut::kNone, BnShortcut::kTensor, BnShortcut::kBatchNorm})
    for (const bool relu : {false, true}) {
      Vec f(n);
      batchnorm_apply_fused(a, s, kind, x2.data(), &a2, relu, round_f16, f.data());
      keep(f);
    }

  Vec r(n), rb(n), rs(n), t(n), tb(n), sum(n);
  relu_forward(x.data(), r.data(), static_cast<std::int64_t>(n));
  keep(r);
  for (const bool acc : {false, true}) {
    Vec d = random_vec(n, 13);
    relu_backward(r.data(), dy.data(), d.data(), static_cast<std::int64_t>(n), acc);
    keep(d);
    Vec dt = random_vec(n, 14);
    tanh_backward(x2.data(), dy.data(), dt.data(), static_cast<std::int64_t>(n), acc);
    keep(dt);
    for (const ops::Activation act : ops::kActivations) {
      Vec da = random_vec(n, 15);
      activation_backward(act, x.data(), dy.data(), da.data(), static_cast<std::int64_t>(n), acc);
      keep(da);
    }
  }
  Vec inplace = dy;  // in place, as the runtime runs ReLU backward
  relu_backward(r.data(), inplace.data(), inplace.data(), static_cast<std::int64_t>(n), false);
  keep(inplace);
  relu_backward_sum(r.data(), dy.data(), x2.data(), rs.data(), static_cast<std::int64_t>(n), round_f16);
  keep(rs);
  tanh_forward(x.data(), t.data(), static_cast<std::int64_t>(n));
  keep(t);
  for (const ops::Activation act : ops::kActivations) {
    Vec fa(n);
    activation_forward(act, x.data(), fa.data(), static_cast<std::int64_t>(n));
    keep(fa);
  }
  add2_forward(x.data(), x2.data(), sum.data(), static_cast<std::int64_t>(n));
  keep(sum);
  const std::int64_t rows = s.n * s.h * s.w, cp = s.c + 5;
  Vec padded(static_cast<std::size_t>(rows * cp));
  channel_pad_forward(x.data(), rows, s.c, cp, padded.data());
  keep(padded);
  for (const bool acc : {false, true}) {
    Vec back = random_vec(n, 16);
    channel_pad_backward(padded.data(), rows, cp, s.c, back.data(), acc);
    keep(back);
  }
  return out;
}

class IsaLevel {
 public:
  IsaLevel() : m_was(vector_isa()) {}
  ~IsaLevel() { set_vector_isa(m_was); }
  IsaLevel(const IsaLevel&) = delete;
  IsaLevel& operator=(const IsaLevel&) = delete;

 private:
  VectorIsa m_was;
};

TEST(KernelIsa, EveryLevelGivesTheSameBits) {
  const IsaLevel restore;
  int compared = 0;
  for (const Shape& s :
       {Shape{3, 7, 5, 16}, Shape{2, 9, 11, 3}, Shape{5, 6, 7, 37}, Shape{4, 28, 28, 16}, Shape{2, 4, 4, 128}})
    for (const bool round_f16 : {false, true}) {
      ASSERT_TRUE(set_vector_isa(VectorIsa::Generic));
      const auto want = run_all(s, round_f16);
      for (const VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512}) {
        if (!set_vector_isa(isa)) continue;
        const auto got = run_all(s, round_f16);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t k = 0; k < got.size(); ++k)
          ASSERT_EQ(0, std::memcmp(got[k].data(), want[k].data(), got[k].size() * sizeof(float)))
              << vector_isa_name(isa) << " differs from generic in output " << k << " of shape " << s.str()
              << (round_f16 ? " (binary16 rounding)" : "");
        ++compared;
      }
    }
  if (compared == 0) GTEST_SKIP() << "this build or CPU has no AVX2/AVX-512 variant: nothing to compare";
  std::printf("compared %d level/shape pairs against generic\n", compared);
}

TEST(KernelIsa, LevelsTheCpuLacksAreRefused) {
  const IsaLevel restore;
  EXPECT_TRUE(vector_isa_available(VectorIsa::Generic));
  for (const VectorIsa isa : {VectorIsa::Generic, VectorIsa::Avx2, VectorIsa::Avx512}) {
    const VectorIsa before = vector_isa();
    const bool ok = set_vector_isa(isa);
    EXPECT_EQ(ok, vector_isa_available(isa)) << vector_isa_name(isa);
    EXPECT_EQ(vector_isa(), ok ? isa : before) << vector_isa_name(isa);
  }
}

}  // namespace
}  // namespace renaissance::cpu::test
