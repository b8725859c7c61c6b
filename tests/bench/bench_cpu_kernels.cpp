// CPU kernel benchmarks (Google Benchmark): GEMM and convolutions in GFLOP/s for Fashion-MNIST-net-sized
// layers, batch norm and the optimizer range update in GB/s of compulsory traffic.
//   build-kern/tests/bench/bench_cpu_kernels --benchmark_min_time=0.5
// Results and the machine they came from: docs/kernels-cpu.md. RENAISSANCE_CPU_THREADS sets the threads.
#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/fully_connected.h>
#include <kernels/cpu/gemm.h>
#include <kernels/cpu/optimizer.h>
#include <kernels/cpu/pooling.h>
#include <kernels/cpu/range_ops.h>
#include <kernels/cpu/softmax_ce.h>
#include <kernels/cpu/thread_pool.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

namespace {

using namespace renaissance;
using namespace renaissance::cpu;

std::vector<float> random_vec(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

void rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- GEMM -----------------------------------------------------------------------------------------------

void BM_Sgemm(benchmark::State& state) {
  const bool ta = state.range(0) & 1, tb = state.range(0) & 2;
  const std::int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  set_gemm_backend(state.range(4) ? GemmBackend::OpenBlas : GemmBackend::Own);
  const auto a = random_vec(m * k, 1), b = random_vec(k * n, 2);
  std::vector<float> c(m * n);
  for (auto _ : state)
    sgemm(ta, tb, m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0f, c.data(), n);
  rate(state, "GFLOP/s", 2e-9 * m * n * k);
  state.SetLabel(std::string(gemm_backend_name(gemm_backend())) +
                 (state.range(4) ? "" : std::string("-") + gemm_isa()));
  set_gemm_backend(GemmBackend::Own);
}

void gemm_args(benchmark::internal::Benchmark* b) {
  // {transposes (1: A, 2: B), m, n, k, openblas}: a square product and the GEMMs of the conv layers below.
  const std::vector<std::vector<std::int64_t>> shapes = {
      {0, 512, 512, 512},      {2, 100352, 32, 288},  // 28×28×32→32 forward (im2col · Wᵀ)
      {1, 288, 32, 100352},                           // its weight gradient (colᵀ · dY)
      {0, 100352, 288, 32},                           // its data gradient (dY · W)
      {2, 25088, 128, 576},    {1, 576, 128, 25088}, {0, 25088, 576, 128}};  // 14×14×64→128
  for (const auto& s : shapes)
    for (std::int64_t ob = 0; ob <= (openblas_available() ? 1 : 0); ++ob) b->Args({s[0], s[1], s[2], s[3], ob});
}
BENCHMARK(BM_Sgemm)->Apply(gemm_args)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- convolutions -----------------------------------------------------------------------------------------

struct Layer {
  const char* name;
  Shape xs;
  std::int64_t cout;
  Conv2dParams p;
};

const Layer kLayers[] = {
    // the fmnist_cnn zoo net (batch 128): 1->32 at 28x28, 32->64 at 14x14, 64->64 at 7x7
    {"28x28x1->32", {128, 28, 28, 1}, 32, {3, 3, 1, 1, 1, 1, 1}},
    {"14x14x32->64", {128, 14, 14, 32}, 64, {3, 3, 1, 1, 1, 1, 1}},
    {"7x7x64->64", {128, 7, 7, 64}, 64, {3, 3, 1, 1, 1, 1, 1}},
    // the quarter-width ResNet-18 (models/resnet18_fmnist_narrow.yaml)
    {"28x28x16->16", {128, 28, 28, 16}, 16, {3, 3, 1, 1, 1, 1, 1}},
    {"28x28x16->32_s2", {128, 28, 28, 16}, 32, {3, 3, 2, 2, 1, 1, 1}},
    {"28x28x16->32_1x1s2", {128, 28, 28, 16}, 32, {1, 1, 2, 2, 0, 0, 1}},
    {"14x14x32->32", {128, 14, 14, 32}, 32, {3, 3, 1, 1, 1, 1, 1}},
    {"7x7x64->128_s2", {128, 7, 7, 64}, 128, {3, 3, 2, 2, 1, 1, 1}},
    {"4x4x128->128", {128, 4, 4, 128}, 128, {3, 3, 1, 1, 1, 1, 1}},
    // the 5-conv net of the first CPU measurements, a 1x1 and a depthwise layer
    {"28x28x32->32", {128, 28, 28, 32}, 32, {3, 3, 1, 1, 1, 1, 1}},
    {"14x14x64->128", {128, 14, 14, 64}, 128, {3, 3, 1, 1, 1, 1, 1}},
    {"7x7x128->128", {128, 7, 7, 128}, 128, {3, 3, 1, 1, 1, 1, 1}},
    {"14x14x64->128_1x1", {128, 14, 14, 64}, 128, {1, 1, 1, 1, 0, 0, 1}},
    {"14x14x64_dw3x3", {128, 14, 14, 64}, 64, {3, 3, 1, 1, 1, 1, 64}},
};

struct ConvBuffers {
  Shape ys;
  std::vector<float> x, w, b, y, dy, dx, dw, db;
  double flops;
  explicit ConvBuffers(const Layer& l) {
    ys = conv2d_output_shape(l.xs, l.cout, l.p);
    x = random_vec(l.xs.elems() + 4, 1);
    w = random_vec(conv2d_weight_elems(l.xs.c, l.cout, l.p), 2);
    b = random_vec(l.cout, 3);
    y.resize(ys.elems());
    dy = random_vec(ys.elems() + 4, 4);
    dx.resize(l.xs.elems());
    dw.resize(w.size());
    db.resize(b.size());
    flops = 2.0 * static_cast<double>(ys.elems()) * l.p.kernel_h * l.p.kernel_w * (l.xs.c / l.p.groups);
  }
};

bool skip_unavailable(benchmark::State& state, Conv2dAlgo algo) {
  if (algo == Conv2dAlgo::Xnnpack && !xnnpack_available()) {
    state.SkipWithError("built without XNNPACK");
    return true;
  }
  if (algo == Conv2dAlgo::Onednn && !onednn_available()) {
    state.SkipWithError("built without oneDNN");
    return true;
  }
  return false;
}

// range(1): 0 = GEMM path, 1 = XNNPACK re-created every call (weights change every training step),
// 2 = XNNPACK with unchanged weights (its operator cache hits: inference/validation), 3 = oneDNN through a
// Conv2dPlan made once (as the runtime prepares it), weights changing every call (their reorder included).
void BM_ConvForward(benchmark::State& state) {
  const Layer& l = kLayers[state.range(0)];
  ConvBuffers buf(l);
  const Conv2dAlgo algos[] = {Conv2dAlgo::Gemm, Conv2dAlgo::Xnnpack, Conv2dAlgo::Xnnpack, Conv2dAlgo::Onednn};
  const Conv2dAlgo algo = algos[state.range(1)];
  if (skip_unavailable(state, algo)) return;
  const Conv2dPlan plan(l.xs, buf.ys, l.p, Conv2dPass::Forward, true, algo);
  for (auto _ : state) {
    if (state.range(1) != 2) buf.w[0] = -buf.w[0];  // a training step's new weights
    plan.forward(buf.x.data(), buf.w.data(), buf.b.data(), buf.y.data());
  }
  rate(state, "GFLOP/s", 1e-9 * buf.flops);
  const char* algo_name[] = {" gemm", " xnnpack-new-w", " xnnpack-same-w", " onednn"};
  state.SetLabel(std::string(l.name) + algo_name[state.range(1)]);
}

// range(1): 0 = GEMM + col2im, 1 = XNNPACK deconvolution re-created every call, 2 = oneDNN (plan made once).
void BM_ConvBackwardData(benchmark::State& state) {
  const Layer& l = kLayers[state.range(0)];
  ConvBuffers buf(l);
  const Conv2dAlgo algos[] = {Conv2dAlgo::Gemm, Conv2dAlgo::Xnnpack, Conv2dAlgo::Onednn};
  const Conv2dAlgo algo = algos[state.range(1)];
  if (skip_unavailable(state, algo)) return;
  if (l.xs.c == 1) {
    state.SkipWithError("a first layer computes no dx");
    return;
  }
  const Conv2dPlan plan(l.xs, buf.ys, l.p, Conv2dPass::BackwardData, false, algo);
  for (auto _ : state) {
    buf.w[0] = -buf.w[0];
    plan.backward_data(buf.dy.data(), buf.w.data(), buf.dx.data(), false);
  }
  rate(state, "GFLOP/s", 1e-9 * buf.flops);
  const char* algo_name[] = {" gemm", " xnnpack-deconv", " onednn"};
  state.SetLabel(std::string(l.name) + algo_name[state.range(1)]);
}

// range(1): 0 = im2col + GEMM into fixed lanes, 1 = oneDNN (plan made once, partials of fixed batch pieces).
void BM_ConvBackwardFilter(benchmark::State& state) {
  const Layer& l = kLayers[state.range(0)];
  ConvBuffers buf(l);
  const Conv2dAlgo algo = state.range(1) == 0 ? Conv2dAlgo::Gemm : Conv2dAlgo::Onednn;
  if (skip_unavailable(state, algo)) return;
  const Conv2dPlan plan(l.xs, buf.ys, l.p, Conv2dPass::BackwardFilter, false, algo);
  for (auto _ : state) plan.backward_filter(buf.x.data(), buf.dy.data(), buf.dw.data(), nullptr, false);
  rate(state, "GFLOP/s", 1e-9 * buf.flops);
  state.SetLabel(std::string(l.name) + (state.range(1) == 0 ? " gemm" : " onednn"));
}

void layer_args(benchmark::internal::Benchmark* b, std::int64_t algos) {
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(std::size(kLayers)); ++i)
    for (std::int64_t algo = 0; algo < algos; ++algo) b->Args({i, algo});
}
BENCHMARK(BM_ConvForward)->Apply([](auto* b) { layer_args(b, 4); })->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvBackwardData)->Apply([](auto* b) { layer_args(b, 3); })->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvBackwardFilter)->Apply([](auto* b) { layer_args(b, 2); })->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- batch norm ---------------------------------------------------------------------------------------------

const Shape kBnShapes[] = {{128, 28, 28, 32}, {128, 14, 14, 64}, {128, 7, 7, 128}};

// Compulsory traffic: forward reads x and writes y; backward reads x and dy and writes dx.
void BM_BatchNormForward(benchmark::State& state) {
  const Shape s = kBnShapes[state.range(0)];
  const auto x = random_vec(s.elems(), 1), g = random_vec(s.c, 2), b = random_vec(s.c, 3);
  std::vector<float> y(x.size()), mean(s.c), inv(s.c), rm(s.c, 0.0f), rv(s.c, 1.0f);
  for (auto _ : state)
    batchnorm_forward_train(x.data(), s, g.data(), b.data(), y.data(), mean.data(), inv.data(), rm.data(), rv.data());
  rate(state, "GB/s", 2e-9 * 4 * s.elems());
  state.SetLabel(s.str());
}

void BM_BatchNormBackward(benchmark::State& state) {
  const Shape s = kBnShapes[state.range(0)];
  const auto x = random_vec(s.elems(), 1), dy = random_vec(s.elems(), 4), g = random_vec(s.c, 2);
  std::vector<float> y(x.size()), mean(s.c), inv(s.c), dx(x.size()), dg(s.c), db(s.c), b(s.c, 0.0f);
  batchnorm_forward_train(x.data(), s, g.data(), b.data(), y.data(), mean.data(), inv.data(), nullptr, nullptr);
  for (auto _ : state)
    batchnorm_backward(x.data(), dy.data(), s, g.data(), mean.data(), inv.data(), dx.data(), dg.data(), db.data(),
                       false, false);
  rate(state, "GB/s", 3e-9 * 4 * s.elems());
  state.SetLabel(s.str());
}
BENCHMARK(BM_BatchNormForward)->DenseRange(0, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BatchNormBackward)->DenseRange(0, 2)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- region-wide updates ----------------------------------------------------------------------------------

constexpr std::int64_t kParams = 11'700'000;  // ResNet-18's parameter count

// AdamW reads w, g, m, v and writes w, m, v: 7 floats per parameter.
void BM_AdamW(benchmark::State& state) {
  auto w = random_vec(kParams, 1), g = random_vec(kParams, 2);
  std::vector<float> m(kParams, 0.0f), v(kParams, 0.0f);
  OptimizerScalars s;
  s.lr = 1e-3f, s.weight_decay = 0.05f;
  for (auto _ : state) {
    adamw_update(w.data(), g.data(), m.data(), v.data(), kParams, &s, true, nullptr);
    s.step += 1.0f;
  }
  rate(state, "GB/s", 7e-9 * 4 * kParams);
}

// Nesterov reads w, g, v and writes w, v: 5 floats per parameter.
void BM_Nesterov(benchmark::State& state) {
  auto w = random_vec(kParams, 1), g = random_vec(kParams, 2);
  std::vector<float> v(kParams, 0.0f);
  OptimizerScalars s;
  s.lr = 0.1f, s.momentum = 0.9f, s.weight_decay = 5e-4f;
  for (auto _ : state) nesterov_update(w.data(), g.data(), v.data(), kParams, &s, true, nullptr);
  rate(state, "GB/s", 5e-9 * 4 * kParams);
}

// FP32 → FP16 cast: reads 4 and writes 2 bytes per element.
void BM_CastF32ToF16(benchmark::State& state) {
  const auto w = random_vec(kParams, 1);
  std::vector<std::uint16_t> h(kParams);
  for (auto _ : state) range_cast_f32_to_f16(w.data(), h.data(), kParams);
  rate(state, "GB/s", 6e-9 * kParams);
}
BENCHMARK(BM_AdamW)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Nesterov)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CastF32ToF16)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- a whole training step ---------------------------------------------------------------------------------

// The 5-conv CBR net of platform-facts (PyTorch CPU reached 92.0% on Fashion-MNIST with it at ~1,300
// img/s on this machine): conv-BN-ReLU 32, max-pool, 64, max-pool, 128, 128, GAP, FC 10, softmax CE,
// SGD Nesterov; batch 128, FP32. Every kernel call of a step, in order, as the runtime will issue them
// (first layer: no dx). Reports img/s; RENAISSANCE_STEP_PROFILE=1 prints the time per kernel kind.
const char* const kConvFwd[] = {"conv1 fwd", "conv2 fwd", "conv3 fwd", "conv4 fwd"};
const char* const kConvDx[] = {"", "conv2 dx", "conv3 dx", "conv4 dx"};
const char* const kConvDw[] = {"conv1 dw", "conv2 dw", "conv3 dw", "conv4 dw"};

struct CbrLayer {
  Shape xs, ys;
  Conv2dParams p{3, 3, 1, 1, 1, 1, 1};
  std::vector<float> w, gamma, beta, mean, invstd, rmean, rvar, dw, dgamma, dbeta, c, bn, r, dr;
};

class FashionNet {
 public:
  explicit FashionNet(std::int64_t batch) : m_batch(batch) {
    const std::int64_t chans[] = {1, 32, 64, 128, 128};
    std::int64_t hw = 28;
    for (int i = 0; i < 4; ++i) {
      CbrLayer l;
      l.xs = {batch, hw, hw, chans[i]};
      l.ys = conv2d_output_shape(l.xs, chans[i + 1], l.p);
      l.w = random_vec(conv2d_weight_elems(chans[i], chans[i + 1], l.p), 10 + i);
      for (auto& v : l.w) v *= 0.2f;
      l.gamma.assign(chans[i + 1], 1.0f), l.beta.assign(chans[i + 1], 0.0f);
      l.mean.resize(chans[i + 1]), l.invstd.resize(chans[i + 1]);
      l.rmean.assign(chans[i + 1], 0.0f), l.rvar.assign(chans[i + 1], 1.0f);
      l.dw.resize(l.w.size()), l.dgamma.resize(chans[i + 1]), l.dbeta.resize(chans[i + 1]);
      for (auto* v : {&l.c, &l.bn, &l.r, &l.dr}) v->resize(l.ys.elems() + 4);
      m_layers.push_back(std::move(l));
      if (i < 2) hw /= 2;  // max-pool after the first two blocks
    }
    m_x = random_vec(m_layers[0].xs.elems() + 4, 1);
    for (int i = 0; i < 2; ++i) {
      m_pool_out[i].resize(m_layers[i + 1].xs.elems() + 4);
      m_pool_arg[i].resize(m_layers[i + 1].xs.elems());
      m_dpool[i].resize(m_layers[i + 1].xs.elems() + 4);
    }
    m_gap.resize(batch * 128), m_dgap.resize(batch * 128);
    m_fc_w = random_vec(10 * 128, 2), m_fc_b.assign(10, 0.0f), m_dfc_w.resize(10 * 128), m_dfc_b.resize(10);
    m_logits.resize(batch * 10), m_probs.resize(batch * 10), m_dlogits.resize(batch * 10);
    m_labels.resize(batch);
    for (std::int64_t i = 0; i < batch; ++i) m_labels[i] = static_cast<std::int32_t>(i % 10);
    m_vel.resize(parameter_count());
    m_scalars.lr = 0.01f, m_scalars.momentum = 0.9f, m_scalars.weight_decay = 5e-4f;
  }

  std::size_t parameter_count() const {
    std::size_t n = m_fc_w.size() + m_fc_b.size();
    for (const auto& l : m_layers) n += l.w.size() + 2 * l.gamma.size();
    return n;
  }

  void step() {
    // forward
    const float* in = m_x.data();
    for (std::size_t i = 0; i < m_layers.size(); ++i) {
      CbrLayer& l = m_layers[i];
      timed(kConvFwd[i], [&] { conv2d_forward(in, l.xs, l.w.data(), nullptr, l.c.data(), l.ys, l.p); });
      timed("bn fwd", [&] {
        batchnorm_forward_train(l.c.data(), l.ys, l.gamma.data(), l.beta.data(), l.bn.data(), l.mean.data(),
                                l.invstd.data(), l.rmean.data(), l.rvar.data());
      });
      timed("relu fwd", [&] { relu_forward(l.bn.data(), l.r.data(), l.ys.elems()); });
      in = l.r.data();
      if (i < 2) {
        const Shape ps = m_layers[i + 1].xs;
        timed("pool fwd", [&] { maxpool2d_forward(in, l.ys, m_pool_out[i].data(), ps, m_pool, m_pool_arg[i].data()); });
        in = m_pool_out[i].data();
      }
    }
    timed("gap+fc+ce", [&] {
      global_avgpool_forward(in, m_layers[3].ys, m_gap.data());
      fc_forward(m_gap.data(), m_batch, 128, m_fc_w.data(), m_fc_b.data(), m_logits.data(), 10);
      softmax_ce_forward(m_logits.data(), m_labels.data(), m_batch, 10, 0.1f, m_probs.data());
      softmax_ce_backward(m_probs.data(), m_labels.data(), m_batch, 10, 0.1f, 1.0f, m_dlogits.data(), false);
      fc_backward_weights(m_gap.data(), m_dlogits.data(), m_batch, 128, 10, m_dfc_w.data(), m_dfc_b.data(), false);
      fc_backward_data(m_dlogits.data(), m_batch, 10, m_fc_w.data(), m_dgap.data(), 128, false);
      global_avgpool_backward(m_dgap.data(), m_layers[3].dr.data(), m_layers[3].ys, false);
    });
    // backward
    for (int i = 3; i >= 0; --i) {
      CbrLayer& l = m_layers[static_cast<std::size_t>(i)];
      const float* x = i == 0 ? m_x.data() : (i <= 2 ? m_pool_out[i - 1].data() : m_layers[i - 1].r.data());
      timed("relu bwd", [&] { relu_backward(l.r.data(), l.dr.data(), l.dr.data(), l.ys.elems(), false); });
      timed("bn bwd", [&] {
        batchnorm_backward(l.c.data(), l.dr.data(), l.ys, l.gamma.data(), l.mean.data(), l.invstd.data(),
                           l.dr.data(), l.dgamma.data(), l.dbeta.data(), false, false);
      });
      timed(kConvDw[i], [&] {
        conv2d_backward_filter(x, l.xs, l.dr.data(), l.ys, l.dw.data(), nullptr, l.p, false);
      });
      if (i == 0) break;
      float* dx = i <= 2 ? m_dpool[i - 1].data() : m_layers[i - 1].dr.data();
      timed(kConvDx[i], [&] { conv2d_backward_data(l.dr.data(), l.ys, l.w.data(), dx, l.xs, l.p, false); });
      if (i <= 2) {
        CbrLayer& prev = m_layers[i - 1];
        timed("pool bwd", [&] {
          maxpool2d_backward(dx, l.xs, nullptr, m_pool_arg[i - 1].data(), prev.dr.data(), prev.ys, m_pool, false);
        });
      }
    }
    timed("optimizer", [&] {
      // The runtime updates whole regions; here each tensor stands for its region.
      std::size_t off = 0;
      auto update = [&](std::vector<float>& w, const std::vector<float>& g, bool wd) {
        nesterov_update(w.data(), g.data(), m_vel.data() + off, static_cast<std::int64_t>(w.size()), &m_scalars, wd,
                        nullptr);
        off += w.size();
      };
      for (auto& l : m_layers) {
        update(l.w, l.dw, true);
        update(l.gamma, l.dgamma, false);
        update(l.beta, l.dbeta, false);
      }
      update(m_fc_w, m_dfc_w, true);
      update(m_fc_b, m_dfc_b, false);
    });
  }

  std::map<std::string, double> profile;
  bool profiling = false;

 private:
  template <class F>
  void timed(const char* what, F&& f) {
    if (!profiling) return f();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    profile[what] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  std::int64_t m_batch;
  std::vector<CbrLayer> m_layers;
  const Pool2dParams m_pool{2, 2, 2, 2, 0, 0};
  std::vector<float> m_x, m_pool_out[2], m_dpool[2], m_gap, m_dgap, m_fc_w, m_fc_b, m_dfc_w, m_dfc_b, m_logits,
      m_probs, m_dlogits, m_vel;
  std::vector<std::uint8_t> m_pool_arg[2];
  std::vector<std::int32_t> m_labels;
  OptimizerScalars m_scalars;
};

void BM_FashionNetStep(benchmark::State& state) {
  FashionNet net(128);
  net.step();
  const char* prof = std::getenv("RENAISSANCE_STEP_PROFILE");
  net.profiling = prof && prof[0] == '1';
  std::int64_t steps = 0;
  for (auto _ : state) {
    net.step();
    ++steps;
  }
  rate(state, "img/s", 128.0);
  if (net.profiling)
    for (const auto& [what, ms] : net.profile) std::printf("  %-10s %7.2f ms/step\n", what.c_str(), ms / steps);
}
BENCHMARK(BM_FashionNetStep)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
