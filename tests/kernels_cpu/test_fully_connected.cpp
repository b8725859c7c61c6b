// Fully connected: forward against the definition, dx / dW / db against central differences.
#include <kernels/cpu/fully_connected.h>

#include "kernel_test_util.h"

namespace renaissance::cpu::test {
namespace {

DVec fc_ref(const DVec& x, std::int64_t batch, std::int64_t in, const DVec& w, const DVec& b, std::int64_t out) {
  DVec y(static_cast<std::size_t>(batch * out));
  for (std::int64_t r = 0; r < batch; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (std::int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

TEST(FullyConnected, ForwardAndGradients) {
  for (const auto& [batch, in, out] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{3, 7, 5},
                                        {5, 33, 10},
                                        {130, 20, 17}}) {
    const Vec x = random_vec(batch * in, 1), w = random_vec(out * in, 2), b = random_vec(out, 3);
    const Vec r = random_vec(batch * out, 4);
    Vec y(batch * out);
    fc_forward(x.data(), batch, in, w.data(), b.data(), y.data(), out);
    const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
    expect_close(y, fc_ref(xd, batch, in, wd, bd, out), 1e-5, "fc forward");
    Vec dx(x.size()), dw(w.size()), db(b.size());
    fc_backward_data(r.data(), batch, out, w.data(), dx.data(), in, false);
    fc_backward_weights(x.data(), r.data(), batch, in, out, dw.data(), db.data(), false);
    if (batch * in < 1000) {
      expect_grad(dx, numeric_grad([&](const DVec& v) { return dot(fc_ref(v, batch, in, wd, bd, out), rd); }, xd), 1e-4,
                  "fc dx");
      expect_grad(dw, numeric_grad([&](const DVec& v) { return dot(fc_ref(xd, batch, in, v, bd, out), rd); }, wd), 1e-4,
                  "fc dw");
      expect_grad(db, numeric_grad([&](const DVec& v) { return dot(fc_ref(xd, batch, in, wd, v, out), rd); }, bd), 1e-4,
                  "fc db");
    }
    Vec ax = x, aw = w, ab = b;
    fc_backward_data(r.data(), batch, out, w.data(), ax.data(), in, true);
    fc_backward_weights(x.data(), r.data(), batch, in, out, aw.data(), ab.data(), true);
    for (std::size_t i = 0; i < ax.size(); ++i) ASSERT_NEAR(ax[i], x[i] + dx[i], 1e-5);
    for (std::size_t i = 0; i < aw.size(); ++i) ASSERT_NEAR(aw[i], w[i] + dw[i], 1e-5);
    for (std::size_t i = 0; i < ab.size(); ++i) ASSERT_NEAR(ab[i], b[i] + db[i], 1e-5);
  }
}

}  // namespace
}  // namespace renaissance::cpu::test
