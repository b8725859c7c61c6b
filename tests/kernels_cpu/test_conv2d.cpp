// conv2d forward against a double reference, gradients against central differences of that reference,
// accumulate flags, XNNPACK and oneDNN against the same references, and large shapes that cross every blocking
// boundary and batch-piece split.
#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/gemm.h>
#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include "kernel_test_util.h"

#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace renaissance::cpu::test {
namespace {

struct ConvCase {
  Shape xs;
  std::int64_t cout;
  Conv2dParams p;
  bool bias;
  const char* name;
};

// Odd sizes on purpose; Conv2dParams = {kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, groups}.
const ConvCase kCases[] = {
    {{3, 7, 5, 3}, 4, {3, 3, 1, 1, 1, 1, 1}, true, "3x3_s1_p1"},
    {{3, 7, 5, 3}, 4, {3, 3, 2, 2, 1, 1, 1}, true, "3x3_s2_p1"},
    {{3, 7, 5, 4}, 6, {3, 3, 2, 2, 1, 1, 2}, true, "3x3_groups2_s2"},
    {{3, 7, 5, 4}, 4, {3, 3, 1, 1, 1, 1, 4}, false, "depthwise_s1"},
    {{3, 7, 5, 4}, 8, {3, 3, 2, 2, 1, 1, 4}, true, "depthwise_mult2_s2"},
    {{3, 7, 5, 5}, 7, {1, 1, 1, 1, 0, 0, 1}, true, "1x1_s1"},
    {{3, 7, 5, 5}, 7, {1, 1, 2, 2, 0, 0, 1}, false, "1x1_s2"},
    {{2, 6, 7, 3}, 5, {3, 2, 2, 1, 1, 0, 1}, true, "3x2_s21_p10"},
    {{2, 5, 5, 6}, 6, {1, 1, 1, 1, 0, 0, 3}, true, "1x1_groups3"},
    {{2, 7, 5, 2}, 3, {5, 5, 1, 1, 2, 2, 1}, true, "5x5_p2"},
    {{2, 8, 8, 1}, 4, {3, 3, 1, 1, 0, 0, 1}, true, "1channel_nopad"},
};

struct ConvData {
  Shape xs, ys;
  Vec x, w, b;
  std::int64_t wn;
};

ConvData make_data(const ConvCase& cs, std::uint32_t seed) {
  ConvData d;
  d.xs = cs.xs;
  d.ys = conv2d_output_shape(cs.xs, cs.cout, cs.p);
  d.wn = conv2d_weight_elems(cs.xs.c, cs.cout, cs.p);
  d.x = random_vec(static_cast<std::size_t>(d.xs.elems()), seed);
  d.w = random_vec(static_cast<std::size_t>(d.wn), seed + 1);
  d.b = random_vec(static_cast<std::size_t>(cs.cout), seed + 2);
  return d;
}

// x with 16 spare bytes after its end, as the arena's slots have.
Vec padded(const Vec& v) {
  Vec p(v.size() + 4, 0.0f);
  std::copy(v.begin(), v.end(), p.begin());
  return p;
}

Vec run_forward(const ConvCase& cs, const ConvData& d, Conv2dAlgo algo) {
  const Vec xp = padded(d.x);
  Vec y(static_cast<std::size_t>(d.ys.elems()));
  conv2d_forward(xp.data(), d.xs, d.w.data(), cs.bias ? d.b.data() : nullptr, y.data(), d.ys, cs.p, algo);
  return y;
}

class Conv2dCases : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dCases, ForwardMatchesReference) {
  const ConvCase& cs = GetParam();
  const ConvData d = make_data(cs, 21);
  const DVec db = to_double(d.b);
  const DVec ref = conv_ref(to_double(d.x), d.xs, to_double(d.w), cs.bias ? &db : nullptr, d.ys, cs.p);
  expect_close(run_forward(cs, d, Conv2dAlgo::Gemm), ref, 1e-5, std::string(cs.name) + " gemm");
  expect_close(run_forward(cs, d, Conv2dAlgo::Auto), ref, 1e-5, std::string(cs.name) + " auto");
  if (xnnpack_available())
    expect_close(run_forward(cs, d, Conv2dAlgo::Xnnpack), ref, 1e-5, std::string(cs.name) + " xnnpack");
  if (onednn_available())
    expect_close(run_forward(cs, d, Conv2dAlgo::Onednn), ref, 1e-5, std::string(cs.name) + " onednn");
}

TEST_P(Conv2dCases, GradientsMatchFiniteDifferences) {
  const ConvCase& cs = GetParam();
  const ConvData d = make_data(cs, 31);
  const Vec r = random_vec(static_cast<std::size_t>(d.ys.elems()), 41);  // L = Σ y·r, so dy = r
  const DVec rd = to_double(r), xd = to_double(d.x), wd = to_double(d.w), bd = to_double(d.b);
  const DVec* bp = cs.bias ? &bd : nullptr;

  Vec dx(d.x.size()), dw(d.w.size()), db(d.b.size());
  conv2d_backward_data(r.data(), d.ys, d.w.data(), dx.data(), d.xs, cs.p, false, Conv2dAlgo::Gemm);
  conv2d_backward_filter(d.x.data(), d.xs, r.data(), d.ys, dw.data(), cs.bias ? db.data() : nullptr, cs.p, false,
                         Conv2dAlgo::Gemm);

  const auto loss_x = [&](const DVec& v) { return dot(conv_ref(v, d.xs, wd, bp, d.ys, cs.p), rd); };
  const auto loss_w = [&](const DVec& v) { return dot(conv_ref(xd, d.xs, v, bp, d.ys, cs.p), rd); };
  const auto loss_b = [&](const DVec& v) { return dot(conv_ref(xd, d.xs, wd, &v, d.ys, cs.p), rd); };
  const DVec num_dx = numeric_grad(loss_x, xd);
  expect_grad(dx, num_dx, 1e-4, std::string(cs.name) + " dx");
  if (xnnpack_available()) {
    const Vec rp = padded(r);
    Vec dx_xnn(d.x.size());
    conv2d_backward_data(rp.data(), d.ys, d.w.data(), dx_xnn.data(), d.xs, cs.p, false, Conv2dAlgo::Xnnpack);
    expect_grad(dx_xnn, num_dx, 1e-4, std::string(cs.name) + " dx xnnpack");
  }
  const DVec num_dw = numeric_grad(loss_w, wd);
  expect_grad(dw, num_dw, 1e-4, std::string(cs.name) + " dw");
  if (cs.bias) expect_grad(db, numeric_grad(loss_b, bd), 1e-4, std::string(cs.name) + " db");
  if (onednn_available()) {
    Vec dx_dnn(d.x.size()), dw_dnn(d.w.size()), db_dnn(d.b.size());
    conv2d_backward_data(r.data(), d.ys, d.w.data(), dx_dnn.data(), d.xs, cs.p, false, Conv2dAlgo::Onednn);
    conv2d_backward_filter(d.x.data(), d.xs, r.data(), d.ys, dw_dnn.data(), cs.bias ? db_dnn.data() : nullptr, cs.p,
                           false, Conv2dAlgo::Onednn);
    expect_grad(dx_dnn, num_dx, 1e-4, std::string(cs.name) + " dx onednn");
    expect_grad(dw_dnn, num_dw, 1e-4, std::string(cs.name) + " dw onednn");
    if (cs.bias) expect_grad(db_dnn, numeric_grad(loss_b, bd), 1e-4, std::string(cs.name) + " db onednn");
  }
}

TEST_P(Conv2dCases, AccumulateAddsIntoOutputs) {
  const ConvCase& cs = GetParam();
  const ConvData d = make_data(cs, 51);
  const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 52);
  Vec dx(d.x.size()), dw(d.w.size()), db(d.b.size());
  conv2d_backward_data(dy.data(), d.ys, d.w.data(), dx.data(), d.xs, cs.p, false, Conv2dAlgo::Gemm);
  conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, dw.data(), db.data(), cs.p, false, Conv2dAlgo::Gemm);
  const Vec px = random_vec(dx.size(), 53), pw = random_vec(dw.size(), 54), pb = random_vec(db.size(), 55);
  Vec ax = px, aw = pw, ab = pb;
  conv2d_backward_data(dy.data(), d.ys, d.w.data(), ax.data(), d.xs, cs.p, true, Conv2dAlgo::Gemm);
  conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, aw.data(), ab.data(), cs.p, true, Conv2dAlgo::Gemm);
  auto sum = [](const Vec& a, const Vec& b) {
    DVec s(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) s[i] = static_cast<double>(a[i]) + b[i];
    return s;
  };
  expect_close(ax, sum(px, dx), 1e-6, std::string(cs.name) + " dx accumulate");
  if (xnnpack_available()) {
    const Vec dyp = padded(dy);
    Vec axx = px;
    conv2d_backward_data(dyp.data(), d.ys, d.w.data(), axx.data(), d.xs, cs.p, true, Conv2dAlgo::Xnnpack);
    expect_close(axx, sum(px, dx), 1e-5, std::string(cs.name) + " dx accumulate xnnpack");
  }
  expect_close(aw, sum(pw, dw), 1e-6, std::string(cs.name) + " dw accumulate");
  expect_close(ab, sum(pb, db), 1e-6, std::string(cs.name) + " db accumulate");
  if (onednn_available()) {
    // Accumulating equals overwriting plus the prior contents, bit for bit (one rounding: prior + pass).
    Vec ox(dx.size()), ow(dw.size()), ob(db.size());
    conv2d_backward_data(dy.data(), d.ys, d.w.data(), ox.data(), d.xs, cs.p, false, Conv2dAlgo::Onednn);
    conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, ow.data(), ob.data(), cs.p, false, Conv2dAlgo::Onednn);
    Vec axo = px, awo = pw, abo = pb;
    conv2d_backward_data(dy.data(), d.ys, d.w.data(), axo.data(), d.xs, cs.p, true, Conv2dAlgo::Onednn);
    conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, awo.data(), abo.data(), cs.p, true, Conv2dAlgo::Onednn);
    auto plus = [](const Vec& a, const Vec& b) {
      Vec s(a.size());
      for (std::size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
      return s;
    };
    expect_bits_equal(axo, plus(px, ox), std::string(cs.name) + " dx accumulate onednn");
    expect_bits_equal(awo, plus(pw, ow), std::string(cs.name) + " dw accumulate onednn");
    expect_bits_equal(abo, plus(pb, ob), std::string(cs.name) + " db accumulate onednn");
    expect_close(axo, sum(px, dx), 1e-5, std::string(cs.name) + " dx accumulate onednn vs gemm");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Conv2dCases, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Shapes large enough to cross the GEMM's K blocks, the im2col row chunks and the weight-gradient
// reduction steps; checked against the double adjoints (finite differences would take too long).
TEST(Conv2dLarge, ForwardAndBackwardMatchReference) {
  const ConvCase cases[] = {
      {{2, 24, 24, 64}, 40, {3, 3, 1, 1, 1, 1, 1}, true, "3x3_k576"},
      {{3, 17, 15, 48}, 70, {3, 3, 2, 2, 1, 1, 1}, true, "3x3_s2_n70"},
      {{2, 30, 30, 20}, 24, {1, 1, 1, 1, 0, 0, 1}, true, "1x1_rows1800"},
      {{2, 20, 20, 96}, 96, {3, 3, 1, 1, 1, 1, 96}, true, "depthwise_c96"},
  };
  for (const ConvCase& cs : cases) {
    const ConvData d = make_data(cs, 61);
    const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 62);
    const DVec bd = to_double(d.b);
    const DVec ref = conv_ref(to_double(d.x), d.xs, to_double(d.w), &bd, d.ys, cs.p);
    expect_close(run_forward(cs, d, Conv2dAlgo::Gemm), ref, 1e-5, std::string(cs.name) + " forward");
    // XNNPACK sums its 576-term dot products in another order (observed 1.04e-5).
    if (xnnpack_available())
      expect_close(run_forward(cs, d, Conv2dAlgo::Xnnpack), ref, 3e-5, std::string(cs.name) + " xnnpack");
    DVec rdx, rdw, rdb;
    conv_backward_ref(to_double(d.x), d.xs, to_double(d.w), to_double(dy), d.ys, cs.p, rdx, rdw, rdb);
    Vec dx(d.x.size()), dw(d.w.size()), db(d.b.size());
    conv2d_backward_data(dy.data(), d.ys, d.w.data(), dx.data(), d.xs, cs.p, false, Conv2dAlgo::Gemm);
    conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, dw.data(), db.data(), cs.p, false);
    // dw and db sum thousands of terms of size ~1 in FP32.
    expect_close(dx, rdx, 1e-5, std::string(cs.name) + " dx");
    if (xnnpack_available()) {
      const Vec dyp = padded(dy);
      Vec dxx(d.x.size());
      conv2d_backward_data(dyp.data(), d.ys, d.w.data(), dxx.data(), d.xs, cs.p, false, Conv2dAlgo::Xnnpack);
      expect_close(dxx, rdx, 3e-5, std::string(cs.name) + " dx xnnpack");
    }
    expect_close(dw, rdw, 2e-5, std::string(cs.name) + " dw");
    expect_close(db, rdb, 2e-5, std::string(cs.name) + " db");
    if (onednn_available()) {
      expect_close(run_forward(cs, d, Conv2dAlgo::Onednn), ref, 3e-5, std::string(cs.name) + " onednn");
      Vec dxo(d.x.size()), dwo(d.w.size()), dbo(d.b.size());
      conv2d_backward_data(dy.data(), d.ys, d.w.data(), dxo.data(), d.xs, cs.p, false, Conv2dAlgo::Onednn);
      conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, dwo.data(), dbo.data(), cs.p, false,
                             Conv2dAlgo::Onednn);
      expect_close(dxo, rdx, 3e-5, std::string(cs.name) + " dx onednn");
      expect_close(dwo, rdw, 2e-5, std::string(cs.name) + " dw onednn");
      expect_close(dbo, rdb, 2e-5, std::string(cs.name) + " db onednn");
    }
  }
}

// oneDNN runs on batch pieces fixed by the shape, the last one shorter: N = 37 gives 4 pieces of 10 (the last 7)
// at 6×5, 2 of 19 (the last 18) at 4×4, 3 of 13 (the last 11) at 5×5, and 4 or 5 for the weight gradients. 16
// channels on both sides take oneDNN's blocked kernels (the same bytes as NHWC). A plan made once keeps working when
// the weights change between calls (a training step), and reports what it runs.
TEST(Conv2dOnednn, BatchPiecesAndReusedPlansMatchReference) {
  if (!onednn_available()) GTEST_SKIP() << "built without oneDNN";
  const WinogradSetting direct(false);
  for (const ConvCase& cs : {ConvCase{{37, 6, 5, 8}, 16, {3, 3, 1, 1, 1, 1, 1}, true, "3x3_n37"},
                             ConvCase{{37, 7, 7, 16}, 24, {3, 3, 2, 2, 1, 1, 1}, false, "3x3_s2_n37"},
                             ConvCase{{37, 5, 5, 8}, 8, {3, 3, 1, 1, 1, 1, 8}, true, "depthwise_n37"},
                             // 16 channels in and out: forward and dx through oneDNN's blocked (nChw16c) kernels
                             ConvCase{{37, 9, 7, 16}, 16, {3, 3, 1, 1, 1, 1, 1}, true, "16to16_n37"}}) {
    ConvData d = make_data(cs, 101);
    const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 102);
    const Conv2dPlan fwd(d.xs, d.ys, cs.p, Conv2dPass::Forward, cs.bias, Conv2dAlgo::Onednn);
    const Conv2dPlan bwd(d.xs, d.ys, cs.p, Conv2dPass::BackwardData, false, Conv2dAlgo::Onednn);
    const Conv2dPlan wgt(d.xs, d.ys, cs.p, Conv2dPass::BackwardFilter, false, Conv2dAlgo::Onednn);
    EXPECT_EQ(fwd.algo(), Conv2dAlgo::Onednn);
    EXPECT_EQ(fwd.describe().rfind("onednn ", 0), 0u) << fwd.describe();
    for (int step = 0; step < 2; ++step) {
      const DVec bd = to_double(d.b);
      Vec y(static_cast<std::size_t>(d.ys.elems())), dx(d.x.size()), dw(d.w.size()), db(d.b.size());
      fwd.forward(d.x.data(), d.w.data(), cs.bias ? d.b.data() : nullptr, y.data());
      bwd.backward_data(dy.data(), d.w.data(), dx.data(), false);
      wgt.backward_filter(d.x.data(), dy.data(), dw.data(), db.data(), false);
      const std::string tag = std::string(cs.name) + " step " + std::to_string(step);
      expect_close(y, conv_ref(to_double(d.x), d.xs, to_double(d.w), cs.bias ? &bd : nullptr, d.ys, cs.p), 1e-5,
                   tag + " forward");
      DVec rdx, rdw, rdb;
      conv_backward_ref(to_double(d.x), d.xs, to_double(d.w), to_double(dy), d.ys, cs.p, rdx, rdw, rdb);
      expect_close(dx, rdx, 1e-5, tag + " dx");
      expect_close(dw, rdw, 2e-5, tag + " dw");
      expect_close(db, rdb, 2e-5, tag + " db");
      for (auto& v : d.w) v *= -0.75f;  // the same buffers, new weights
    }
  }
}

// Winograd (--cpu-winograd on; oneDNN's jit_wino_4x3 on AVX-512): every pass of the shapes it takes against the double
// reference, within its larger rounding error (|err| / (1 + |ref|) measured up to 1.2e-5 forward and dx, 1.1e-4 dW
// at batch 128, where the direct kernels stay within the other tests' 1e-5 and 2e-5 at batch 37); accumulating dx; 16 channels (the same bytes as NHWC) and others (reordered per piece); a short last
// piece. The forward's and dx's bits do not depend on the piece size, which follows the thread count (1 vs 8 threads:
// 4 vs 8 pieces of 128 samples); the weight gradient's pieces follow the batch alone. The direct kernels are unchanged
// with it off.
TEST(Conv2dOnednn, WinogradMatchesTheReferenceWhateverTheThreadCount) {
  if (!onednn_available()) GTEST_SKIP() << "built without oneDNN";
  const WinogradSetting restore_setting(conv2d_winograd());
  struct RestoreThreads {
    int threads = num_threads();
    ~RestoreThreads() { set_num_threads(threads); }
  } restore_threads;
  const Conv2dParams k3{3, 3, 1, 1, 1, 1, 1};
  set_conv2d_winograd(false);
  EXPECT_EQ(Conv2dPlan({8, 14, 14, 32}, {8, 14, 14, 32}, k3, Conv2dPass::Forward).describe().find("wino"),
            std::string::npos);
  set_conv2d_winograd(true);
  if (Conv2dPlan({8, 14, 14, 32}, {8, 14, 14, 32}, k3, Conv2dPass::Forward).describe().find("wino") ==
      std::string::npos)
    GTEST_SKIP() << "oneDNN has no Winograd kernel on this CPU (it needs AVX-512)";
  struct Case {
    ConvCase cs;
    bool wino_fwd;  // forward and dx (maps of at least 7x7); the weight gradient takes it on every map
  };
  for (const Case& c : {Case{{{37, 28, 28, 16}, 16, k3, false, "28x28x16_n37"}, true},
                        Case{{{128, 14, 14, 32}, 32, k3, false, "14x14x32_n128"}, true},
                        Case{{{33, 7, 7, 64}, 64, k3, true, "7x7x64_n33_bias"}, true},
                        Case{{{40, 4, 4, 128}, 128, k3, false, "4x4x128_n40"}, false}}) {
    const ConvCase& cs = c.cs;
    const ConvData d = make_data(cs, 131);
    const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 132);
    const Vec dx0 = random_vec(d.x.size(), 133);
    const DVec bd = to_double(d.b);
    const DVec ry = conv_ref(to_double(d.x), d.xs, to_double(d.w), cs.bias ? &bd : nullptr, d.ys, cs.p);
    DVec rdx, rdw, rdb;
    conv_backward_ref(to_double(d.x), d.xs, to_double(d.w), to_double(dy), d.ys, cs.p, rdx, rdw, rdb);
    DVec rdx_acc = rdx;
    for (std::size_t i = 0; i < rdx_acc.size(); ++i) rdx_acc[i] += dx0[i];
    std::map<std::string, Vec> first;
    for (int threads : {1, 8}) {
      set_num_threads(threads);
      const Conv2dPlan fwd(d.xs, d.ys, cs.p, Conv2dPass::Forward, cs.bias, Conv2dAlgo::Onednn);
      const Conv2dPlan bwd(d.xs, d.ys, cs.p, Conv2dPass::BackwardData, false, Conv2dAlgo::Onednn);
      const Conv2dPlan wgt(d.xs, d.ys, cs.p, Conv2dPass::BackwardFilter, false, Conv2dAlgo::Onednn);
      const std::string tag = std::string(cs.name) + ", " + std::to_string(threads) + " threads";
      EXPECT_EQ(fwd.onednn_layout()->winograd, c.wino_fwd) << tag << ": " << fwd.describe();
      EXPECT_EQ(bwd.onednn_layout()->winograd, c.wino_fwd) << tag << ": " << bwd.describe();
      EXPECT_TRUE(wgt.onednn_layout()->winograd) << tag << ": " << wgt.describe();
      EXPECT_EQ(wgt.onednn_layout()->activations, cs.xs.c == 16 ? "nChw16c" : "nhwc>nChw16c") << tag;
      Vec y(static_cast<std::size_t>(d.ys.elems())), dx(d.x.size()), dxa = dx0, dw(d.w.size()), db(d.b.size());
      fwd.forward(d.x.data(), d.w.data(), cs.bias ? d.b.data() : nullptr, y.data());
      bwd.backward_data(dy.data(), d.w.data(), dx.data(), false);
      bwd.backward_data(dy.data(), d.w.data(), dxa.data(), true);
      wgt.backward_filter(d.x.data(), dy.data(), dw.data(), db.data(), false);
      expect_close(y, ry, 5e-5, tag + " forward");
      expect_close(dx, rdx, 5e-5, tag + " dx");
      expect_close(dxa, rdx_acc, 5e-5, tag + " dx accumulated");
      expect_close(dw, rdw, 3e-4, tag + " dw");  // 128 x 14 x 14 products a weight: 1.1e-4 measured
      expect_close(db, rdb, 5e-5, tag + " db");  // not Winograd: the direct sum of 25,088 values
      const std::map<std::string, Vec> got{{"y", y}, {"dx", dx}, {"dx+", dxa}, {"dw", dw}, {"db", db}};
      if (first.empty()) {
        first = got;
        continue;
      }
      for (const auto& [name, v] : got) expect_bits_equal(v, first.at(name), tag + " " + name + " (vs 1 thread)");
    }
  }
}

// The weight and data gradients of a layer in one parallel section equal the two passes run one after the other.
TEST(Conv2dOnednn, FilterAndDataTogetherEqualThePassesAlone) {
  for (const ConvCase& cs : {ConvCase{{37, 6, 5, 8}, 16, {3, 3, 1, 1, 1, 1, 1}, true, "3x3_n37"},
                             ConvCase{{37, 9, 7, 16}, 16, {3, 3, 1, 1, 1, 1, 1}, true, "16to16_n37"},
                             ConvCase{{5, 8, 8, 12}, 20, {1, 1, 2, 2, 0, 0, 1}, false, "1x1_s2"}})
    for (bool acc : {false, true}) {
      const ConvData d = make_data(cs, 111);
      const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 112);
      const Conv2dPlan wgt(d.xs, d.ys, cs.p, Conv2dPass::BackwardFilter);
      const Conv2dPlan bwd(d.xs, d.ys, cs.p, Conv2dPass::BackwardData);
      const Vec dx0 = random_vec(d.x.size(), 113), dw0 = random_vec(d.w.size(), 114), db0 = random_vec(d.b.size(), 115);
      Vec dx1 = dx0, dw1 = dw0, db1 = db0, dx2 = dx0, dw2 = dw0, db2 = db0;
      wgt.backward_filter(d.x.data(), dy.data(), dw1.data(), db1.data(), acc);
      bwd.backward_data(dy.data(), d.w.data(), dx1.data(), acc);
      wgt.backward_filter_and_data(d.x.data(), dy.data(), dw2.data(), db2.data(), acc, bwd, d.w.data(), dx2.data(),
                                   acc);
      const std::string tag = std::string(cs.name) + (acc ? " accumulate" : "");
      expect_bits_equal(dx2, dx1, tag + " dx");
      expect_bits_equal(dw2, dw1, tag + " dw");
      expect_bits_equal(db2, db1, tag + " db");
    }
}

// The layers of the CPU models (fmnist_cnn, models/resnet18_fmnist_narrow.yaml; batch 128), planned as the runtime
// plans them (Auto): every pass the runtime runs is oneDNN with an optimised kernel, its activations are the NHWC
// tensors as they are (no activation reorder), and its weights take exactly one reorder per call, whatever the number
// of batch pieces (32 at 28x28), between the arena's OHWI and a format that holds the weights and nothing else (a
// permutation: no padding). Fails if a reorder per piece, an activation reorder or a padded format creeps in.
/// `n` channels rounded up to the blocks a oneDNN format name gives the dimension `dim` ('i' or 'o'):
/// OIhw8i8o -> 8, OIhw4i16o4i -> 16 for 'i', Ohwi -> 1.
std::int64_t padded_to_blocks(std::int64_t n, const std::string& format, char dim) {
  std::int64_t block = 1, num = 0;
  for (char ch : format) {
    if (ch >= '0' && ch <= '9') {
      num = num * 10 + (ch - '0');
    } else {
      if (num > 0 && ch == dim) block *= num;
      num = 0;
    }
  }
  return (n + block - 1) / block * block;
}

TEST(Conv2dOnednn, CpuModelLayersReorderOnlyTheWeightsOncePerCall) {
  const WinogradSetting direct(false);
  if (!onednn_available()) GTEST_SKIP() << "built without oneDNN";
  struct Layer {
    Shape xs;
    std::int64_t cout;
    Conv2dParams p;
    const char* name;
  };
  const Layer layers[] = {
      {{128, 28, 28, 1}, 32, {3, 3, 1, 1, 1, 1, 1}, "fmnist_cnn 28x28x1->32"},
      {{128, 14, 14, 32}, 64, {3, 3, 1, 1, 1, 1, 1}, "fmnist_cnn 14x14x32->64"},
      {{128, 7, 7, 64}, 64, {3, 3, 1, 1, 1, 1, 1}, "fmnist_cnn 7x7x64->64"},
      {{128, 28, 28, 1}, 16, {3, 3, 1, 1, 1, 1, 1}, "narrow stem 28x28x1->16"},
      {{128, 28, 28, 16}, 16, {3, 3, 1, 1, 1, 1, 1}, "narrow 28x28x16->16"},
      {{128, 28, 28, 16}, 32, {3, 3, 2, 2, 1, 1, 1}, "narrow 28x28x16->32 s2"},
      {{128, 28, 28, 16}, 32, {1, 1, 2, 2, 0, 0, 1}, "narrow 28x28x16->32 1x1 s2"},
      {{128, 14, 14, 32}, 32, {3, 3, 1, 1, 1, 1, 1}, "narrow 14x14x32->32"},
      {{128, 14, 14, 32}, 64, {3, 3, 2, 2, 1, 1, 1}, "narrow 14x14x32->64 s2"},
      {{128, 14, 14, 32}, 64, {1, 1, 2, 2, 0, 0, 1}, "narrow 14x14x32->64 1x1 s2"},
      {{128, 7, 7, 64}, 64, {3, 3, 1, 1, 1, 1, 1}, "narrow 7x7x64->64"},
      {{128, 7, 7, 64}, 128, {3, 3, 2, 2, 1, 1, 1}, "narrow 7x7x64->128 s2"},
      {{128, 7, 7, 64}, 128, {1, 1, 2, 2, 0, 0, 1}, "narrow 7x7x64->128 1x1 s2"},
      {{128, 4, 4, 128}, 128, {3, 3, 1, 1, 1, 1, 1}, "narrow 4x4x128->128"},
  };
  for (const Layer& l : layers) {
    const Shape ys = conv2d_output_shape(l.xs, l.cout, l.p);
    const Vec x = random_vec(static_cast<std::size_t>(l.xs.elems()), 121);
    const Vec w = random_vec(static_cast<std::size_t>(conv2d_weight_elems(l.xs.c, l.cout, l.p)), 122);
    const Vec dy = random_vec(static_cast<std::size_t>(ys.elems()), 123);
    Vec y(static_cast<std::size_t>(ys.elems())), dx(x.size()), dw(w.size()), db(static_cast<std::size_t>(l.cout));
    for (Conv2dPass pass : {Conv2dPass::Forward, Conv2dPass::BackwardData, Conv2dPass::BackwardFilter}) {
      if (pass == Conv2dPass::BackwardData && l.xs.c == 1) continue;  // the input's gradient is never planned
      const std::string tag = std::string(l.name) + (pass == Conv2dPass::Forward        ? " forward"
                                                     : pass == Conv2dPass::BackwardData ? " dx"
                                                                                        : " dW");
      const Conv2dPlan plan(l.xs, ys, l.p, pass);
      ASSERT_EQ(plan.algo(), Conv2dAlgo::Onednn) << tag << ": " << plan.describe();
      const OnednnLayout* lay = plan.onednn_layout();
      ASSERT_NE(lay, nullptr) << tag;
      EXPECT_EQ(plan.describe().find("ref"), std::string::npos) << tag << ": " << plan.describe();
      // 16 channels in and out: nChw16c where oneDNN has blocked kernels for it (AVX-512); elsewhere (AVX2) the
      // plan falls back to NHWC.
      const bool blocked16 =
          l.xs.c == 16 && l.cout == 16 && pass != Conv2dPass::BackwardFilter && __builtin_cpu_supports("avx512f");
      EXPECT_EQ(lay->activations, blocked16 ? "nChw16c" : "nhwc") << tag;
      EXPECT_EQ(lay->arena_weights, "ohwi") << tag;
      EXPECT_TRUE(lay->weight_reorder) << tag;
      EXPECT_NE(lay->weights, "ohwi") << tag;
      // A blocked weight format pads the channels to its blocks (OIhw8i8o of one input channel holds 8).
      EXPECT_EQ(lay->weight_floats, l.p.kernel_h * l.p.kernel_w * padded_to_blocks(l.xs.c, lay->weights, 'i') *
                                        padded_to_blocks(l.cout, lay->weights, 'o'))
          << tag << " " << lay->weights;
      EXPECT_EQ(plan.onednn_weight_reorders(), 0) << tag << ": planning ran a reorder";
      for (int call = 1; call <= 2; ++call) {
        if (pass == Conv2dPass::Forward) plan.forward(x.data(), w.data(), nullptr, y.data());
        if (pass == Conv2dPass::BackwardData) plan.backward_data(dy.data(), w.data(), dx.data(), call == 2);
        if (pass == Conv2dPass::BackwardFilter)
          plan.backward_filter(x.data(), dy.data(), dw.data(), db.data(), call == 2);
        EXPECT_EQ(plan.onednn_weight_reorders(), call) << tag << " after call " << call;
      }
    }
  }
  // The other algorithms report no oneDNN layout.
  const Conv2dPlan gemm({2, 5, 5, 3}, {2, 5, 5, 4}, {3, 3, 1, 1, 1, 1, 1}, Conv2dPass::Forward, false,
                        Conv2dAlgo::Gemm);
  EXPECT_EQ(gemm.onednn_layout(), nullptr);
  EXPECT_EQ(gemm.onednn_weight_reorders(), 0);
}

TEST(Conv2dOnednn, WrongPassOrMissingLibraryIsAnError) {
  const Conv2dParams p{3, 3, 1, 1, 1, 1, 1};
  const Shape xs{2, 5, 5, 3}, ys{2, 5, 5, 4};
  const Conv2dPlan fwd(xs, ys, p, Conv2dPass::Forward, false, Conv2dAlgo::Gemm);
  Vec x(xs.elems()), w(4 * 9 * 3), y(ys.elems());
  EXPECT_THROW(fwd.backward_data(y.data(), w.data(), x.data(), false), Error);
  if (!onednn_available()) {
    EXPECT_THROW(Conv2dPlan(xs, ys, p, Conv2dPass::Forward, false, Conv2dAlgo::Onednn), Error);
  }
}

TEST(Conv2dXnnpack, CachedOperatorSeesNewWeights) {
  if (!xnnpack_available()) GTEST_SKIP() << "built without XNNPACK";
  const ConvCase cs{{2, 9, 9, 8}, 16, {3, 3, 1, 1, 1, 1, 1}, true, "cache"};
  ConvData d = make_data(cs, 71);
  const Vec first = run_forward(cs, d, Conv2dAlgo::Xnnpack);
  EXPECT_EQ(run_forward(cs, d, Conv2dAlgo::Xnnpack), first);  // same weights: reused operator
  for (auto& v : d.w) v *= -0.5f;                             // same pointer, new values (a training step)
  const DVec bd = to_double(d.b);
  expect_close(run_forward(cs, d, Conv2dAlgo::Xnnpack), conv_ref(to_double(d.x), d.xs, to_double(d.w), &bd, d.ys, cs.p),
               1e-5, "after weight update");
  // Two layers of one shape (other weight buffers) alternate without mixing up their operators.
  ConvData other = make_data(cs, 72);
  for (int round = 0; round < 3; ++round)
    for (const ConvData* layer : {&d, &other}) {
      const DVec lb = to_double(layer->b);
      expect_close(run_forward(cs, *layer, Conv2dAlgo::Xnnpack),
                   conv_ref(to_double(layer->x), layer->xs, to_double(layer->w), &lb, layer->ys, cs.p), 1e-5,
                   "alternating layers");
    }
}

#ifdef __linux__
// A buffer that ends exactly at an inaccessible page: reading past its end faults.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(const Vec& v) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = v.size() * sizeof(float);
    m_len = (bytes + page - 1) / page * page + page;
    m_base = static_cast<char*>(mmap(nullptr, m_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    mprotect(m_base + m_len - page, page, PROT_NONE);
    m_data = reinterpret_cast<float*>(m_base + m_len - page - bytes);
    std::copy(v.begin(), v.end(), m_data);
  }
  ~GuardedBuffer() { munmap(m_base, m_len); }
  const float* data() const { return m_data; }

 private:
  char* m_base;
  std::size_t m_len;
  float* m_data;
};

TEST(Conv2dXnnpack, NoSpareBytesNeededAfterTheInput) {
  if (!xnnpack_available()) GTEST_SKIP() << "built without XNNPACK";
  for (const ConvCase& cs : {ConvCase{{3, 7, 5, 3}, 4, {3, 3, 1, 1, 1, 1, 1}, true, "3x3"},
                             ConvCase{{2, 6, 6, 5}, 7, {3, 3, 2, 2, 1, 1, 1}, false, "3x3_s2"},
                             ConvCase{{2, 5, 5, 6}, 6, {3, 3, 1, 1, 1, 1, 6}, true, "depthwise"}}) {
    const ConvData d = make_data(cs, 91);
    const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 92);
    const GuardedBuffer gx(d.x), gdy(dy);
    Vec y(static_cast<std::size_t>(d.ys.elems())), dx(d.x.size()), dx_ref(d.x.size());
    conv2d_forward(gx.data(), d.xs, d.w.data(), cs.bias ? d.b.data() : nullptr, y.data(), d.ys, cs.p,
                   Conv2dAlgo::Xnnpack);
    const DVec bd = to_double(d.b);
    expect_close(y, conv_ref(to_double(d.x), d.xs, to_double(d.w), cs.bias ? &bd : nullptr, d.ys, cs.p), 1e-5,
                 std::string(cs.name) + " guarded forward");
    conv2d_backward_data(gdy.data(), d.ys, d.w.data(), dx.data(), d.xs, cs.p, false, Conv2dAlgo::Xnnpack);
    conv2d_backward_data(dy.data(), d.ys, d.w.data(), dx_ref.data(), d.xs, cs.p, false, Conv2dAlgo::Gemm);
    expect_close(dx, to_double(dx_ref), 1e-5, std::string(cs.name) + " guarded dx");
  }
}
#endif

TEST(Conv2dBackends, OpenBlasGemmPathMatchesReference) {
  if (!openblas_available()) GTEST_SKIP() << "built without OpenBLAS";
  const GemmBackend before = gemm_backend();
  set_gemm_backend(GemmBackend::OpenBlas);
  const ConvCase cs{{3, 11, 9, 24}, 20, {3, 3, 2, 2, 1, 1, 1}, true, "openblas"};
  const ConvData d = make_data(cs, 81);
  const Vec dy = random_vec(static_cast<std::size_t>(d.ys.elems()), 82);
  const DVec bd = to_double(d.b);
  const Vec y = run_forward(cs, d, Conv2dAlgo::Gemm);
  DVec rdx, rdw, rdb;
  conv_backward_ref(to_double(d.x), d.xs, to_double(d.w), to_double(dy), d.ys, cs.p, rdx, rdw, rdb);
  Vec dx(d.x.size()), dw(d.w.size()), db(d.b.size());
  conv2d_backward_data(dy.data(), d.ys, d.w.data(), dx.data(), d.xs, cs.p, false, Conv2dAlgo::Gemm);
  conv2d_backward_filter(d.x.data(), d.xs, dy.data(), d.ys, dw.data(), db.data(), cs.p, false);
  set_gemm_backend(before);
  expect_close(y, conv_ref(to_double(d.x), d.xs, to_double(d.w), &bd, d.ys, cs.p), 1e-5, "openblas forward");
  expect_close(dx, rdx, 1e-5, "openblas dx");
  expect_close(dw, rdw, 2e-5, "openblas dw");
}

TEST(Conv2dChecks, RejectsMismatchedShapes) {
  const Conv2dParams p{3, 3, 1, 1, 1, 1, 1};
  Vec x(2 * 5 * 5 * 3), w(4 * 9 * 3), y(2 * 5 * 5 * 4);
  EXPECT_THROW(conv2d_forward(x.data(), {2, 5, 5, 3}, w.data(), nullptr, y.data(), {2, 4, 5, 4}, p), Error);
  EXPECT_THROW(conv2d_output_shape({2, 5, 5, 3}, 4, Conv2dParams{3, 3, 1, 1, 1, 1, 2}), Error);
  EXPECT_THROW(conv2d_output_shape({2, 2, 2, 3}, 4, Conv2dParams{5, 5, 1, 1, 0, 0, 1}), Error);
}

}  // namespace
}  // namespace renaissance::cpu::test
