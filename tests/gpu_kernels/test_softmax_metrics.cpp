// CUDA softmax cross-entropy and batch metrics against kernels/cpu/softmax_ce and kernels/cpu/metrics, with the
// scalars in device memory as in a captured step; bad labels are clamped and counted instead of throwing.
#include "gpu_test_util.h"

#include <kernels/cpu/metrics.h>
#include <kernels/cpu/softmax_ce.h>
#include <kernels/cuda/metrics.h>
#include <kernels/cuda/softmax_ce.h>

#include <cmath>
#include <limits>

namespace renaissance::cuda::ktest {
namespace {

class SoftmaxTest : public GpuTest {};

struct LossCase {
  std::int64_t n, k;
  DType t;
};

std::vector<LossCase> loss_cases() {
  return {{37, 10, DType::F32}, {37, 10, DType::F16}, {5, 1000, DType::F32}, {5, 1000, DType::F16},
          {1, 1, DType::F32},   {70, 33, DType::F16}, {40, 3, DType::F32},
          {600, 10, DType::F16}};  // more samples than the metrics total's 256-sample chunks
}

std::int64_t stride_for(std::int64_t k, DType t) { return t == DType::F16 ? align_up(k, 8) : k; }

std::vector<std::int32_t> random_labels(std::int64_t n, std::int64_t k, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(k - 1));
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

TEST_F(SoftmaxTest, ForwardMatchesCpu) {
  std::uint32_t seed = 1;
  for (const LossCase& lc : loss_cases()) {
    for (float smoothing : {0.0f, 0.1f}) {
      const std::string name = std::to_string(lc.n) + "x" + std::to_string(lc.k) + "/" + dtype_name(lc.t) +
                               " eps " + std::to_string(smoothing);
      const Shape s{lc.n, 1, 1, lc.k};
      DevTensor logits(s, lc.t, stride_for(lc.k, lc.t)), probs(s, DType::F32, lc.k + 3);
      const Vec z = quantized(random_vec(logits.elems(), seed++, -5.0f, 5.0f), lc.t);
      const std::vector<std::int32_t> labels = random_labels(lc.n, lc.k, seed++);
      logits.upload(z);
      probs.poison();
      const DeviceBuffer lab = upload(labels), eps = upload(std::vector<float>{smoothing});
      DeviceBuffer result(16), errors(4);
      result.fill_bytes(0);
      errors.fill_bytes(0);
      const std::size_t ws_bytes = softmax_ce_workspace_bytes(lc.n);
      DeviceBuffer ws(ws_bytes);
      softmax_ce_forward(stream, logits.ref(), lab.as<std::int32_t>(), eps.as<float>(), probs.ref(),
                         result.as<float>(), ws.get(), ws_bytes, errors.as<std::int32_t>());
      sync();
      Vec pref(z.size());
      const float loss = cpu::softmax_ce_forward(z.data(), labels.data(), lc.n, lc.k, smoothing, pref.data());
      expect_near(probs.download(), pref, 1e-5, "probs " + name);
      probs.expect_zero_padding("probs " + name);
      expect_near({download<float>(result, 1)[0]}, {loss * static_cast<float>(lc.n)}, 1e-5, "loss·N " + name);
      EXPECT_EQ(download<std::int32_t>(errors, 1)[0], 0) << name;
    }
  }
}

TEST_F(SoftmaxTest, BackwardMatchesCpu) {
  std::uint32_t seed = 100;
  for (const LossCase& lc : loss_cases()) {
    for (bool acc : {false, true}) {
      const std::string name = std::to_string(lc.n) + "x" + std::to_string(lc.k) + "/" + dtype_name(lc.t) +
                               (acc ? " acc" : "");
      const Shape s{lc.n, 1, 1, lc.k};
      const float smoothing = 0.1f, loss_scale = 128.0f;
      const Vec z = random_vec(static_cast<std::size_t>(s.elems()), seed++, -5.0f, 5.0f);
      const std::vector<std::int32_t> labels = random_labels(lc.n, lc.k, seed++);
      Vec p(z.size());
      cpu::softmax_ce_forward(z.data(), labels.data(), lc.n, lc.k, smoothing, p.data());
      DevTensor probs(s, DType::F32, lc.k), dx(s, lc.t, stride_for(lc.k, lc.t));
      probs.upload(p);
      const Vec dx0 = quantized(random_vec(dx.elems(), seed++, -1.0f, 1.0f), lc.t);
      if (acc)
        dx.upload(dx0);
      else
        dx.poison();
      const DeviceBuffer lab = upload(labels), eps = upload(std::vector<float>{smoothing}),
                         ls = upload(std::vector<float>{loss_scale});
      softmax_ce_backward(stream, probs.ref(), lab.as<std::int32_t>(), eps.as<float>(), ls.as<float>(), dx.ref(), acc,
                          nullptr);
      sync();
      Vec ref = dx0;
      cpu::softmax_ce_backward(p.data(), labels.data(), lc.n, lc.k, smoothing, loss_scale, ref.data(), acc);
      expect_near(dx.download(), ref, tol_for(lc.t), "dlogits " + name);
      dx.expect_zero_padding("dlogits " + name);
    }
  }
}

TEST_F(SoftmaxTest, BadLabelsAreClampedAndCounted) {
  const std::int64_t n = 6, k = 10;
  const Shape s{n, 1, 1, k};
  const Vec z = random_vec(static_cast<std::size_t>(s.elems()), 7, -3.0f, 3.0f);
  const std::vector<std::int32_t> labels{3, -1, 9, 10, 42, 0};
  const std::vector<std::int32_t> clamped{3, 0, 9, 9, 9, 0};
  DevTensor logits(s, DType::F32), probs(s, DType::F32), dx(s, DType::F32);
  logits.upload(z);
  const DeviceBuffer lab = upload(labels), eps = upload(std::vector<float>{0.1f}), ls = upload(std::vector<float>{1.0f});
  DeviceBuffer result(16), errors(4);
  errors.fill_bytes(0);
  const std::size_t ws_bytes = softmax_ce_workspace_bytes(n);
  DeviceBuffer ws(ws_bytes);
  softmax_ce_forward(stream, logits.ref(), lab.as<std::int32_t>(), eps.as<float>(), probs.ref(), result.as<float>(),
                     ws.get(), ws_bytes, errors.as<std::int32_t>());
  sync();
  EXPECT_EQ(download<std::int32_t>(errors, 1)[0], 3);
  Vec p(z.size());
  const float loss = cpu::softmax_ce_forward(z.data(), clamped.data(), n, k, 0.1f, p.data());
  expect_near({download<float>(result, 1)[0]}, {loss * static_cast<float>(n)}, 1e-5, "clamped loss");

  softmax_ce_backward(stream, probs.ref(), lab.as<std::int32_t>(), eps.as<float>(), ls.as<float>(), dx.ref(), false,
                      errors.as<std::int32_t>());
  sync();
  EXPECT_EQ(download<std::int32_t>(errors, 1)[0], 6);  // counted again, once per sample
  Vec ref(z.size());
  cpu::softmax_ce_backward(p.data(), clamped.data(), n, k, 0.1f, 1.0f, ref.data(), false);
  expect_near(dx.download(), ref, 1e-5, "clamped dlogits");

  const std::size_t mws_bytes = metrics_workspace_bytes(n);
  DeviceBuffer mws(mws_bytes);
  batch_metrics(stream, logits.ref(), lab.as<std::int32_t>(), 0.0f, result.as<float>(), nullptr, mws.get(), mws_bytes,
                errors.as<std::int32_t>());
  sync();
  EXPECT_EQ(download<std::int32_t>(errors, 1)[0], 9);
  Vec mref(4, 0.0f);
  cpu::accumulate_metrics(z.data(), clamped.data(), n, k, 0.0f, mref.data(), nullptr);
  expect_near(download<float>(result, 4), mref, 1e-5, "clamped metrics");
}

TEST_F(SoftmaxTest, MetricsMatchCpu) {
  std::uint32_t seed = 300;
  for (const LossCase& lc : loss_cases()) {
    for (bool ties : {true, false}) {
      const std::string name =
          std::to_string(lc.n) + "x" + std::to_string(lc.k) + "/" + dtype_name(lc.t) + (ties ? " ties" : "");
      const Shape s{lc.n, 1, 1, lc.k};
      DevTensor logits(s, lc.t, stride_for(lc.k, lc.t));
      // Small integers: many equal logits, so the rank and first-argmax tie rules decide.
      Vec z = quantized(ties ? random_ints(logits.elems(), seed++, -2, 2)
                             : random_vec(logits.elems(), seed++, -4.0f, 4.0f),
                        lc.t);
      // NaNs in some rows (one in 7 samples, at the label or elsewhere): never correct, as on the CPU.
      for (std::int64_t i = 3; i < lc.n; i += 7) z[static_cast<std::size_t>(i * lc.k + (i % lc.k))] = std::nanf("");
      const std::vector<std::int32_t> labels = random_labels(lc.n, lc.k, seed++);
      logits.upload(z);
      const DeviceBuffer lab = upload(labels);
      DeviceBuffer result(16), pred(static_cast<std::size_t>(lc.n) * 4);
      result.fill_bytes(0xFF);
      pred.fill_bytes(0xFF);
      const std::size_t ws_bytes = metrics_workspace_bytes(lc.n);
      DeviceBuffer ws(ws_bytes);
      batch_metrics(stream, logits.ref(), lab.as<std::int32_t>(), 0.0f, result.as<float>(), pred.as<std::int32_t>(),
                    ws.get(), ws_bytes, nullptr);
      sync();
      Vec ref(4, 0.0f);
      std::vector<std::int32_t> pref(static_cast<std::size_t>(lc.n));
      cpu::accumulate_metrics(z.data(), labels.data(), lc.n, lc.k, 0.0f, ref.data(), pref.data());
      const Vec got = download<float>(result, 4);
      if (std::isnan(ref[0]))
        EXPECT_TRUE(std::isnan(got[0])) << "metric loss " << name << ": " << got[0];
      else
        expect_near({got[0]}, {ref[0]}, 1e-5, "metric loss " + name);
      EXPECT_EQ(got[1], ref[1]) << "top-1 " << name;
      EXPECT_EQ(got[2], ref[2]) << "top-5 " << name;
      EXPECT_EQ(got[3], ref[3]) << "count " << name;
      EXPECT_EQ(download<std::int32_t>(pred, pref.size()), pref) << "predicted " << name;
    }
  }
}

}  // namespace
}  // namespace renaissance::cuda::ktest
