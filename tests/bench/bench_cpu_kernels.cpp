// CPU kernel benchmarks (Google Benchmark): GEMM and convolutions (own GEMM path, XNNPACK, oneDNN) in GFLOP/s for the
// layers of the CPU models, batch norm (plain and fused), max-pool and the optimizer range update in GB/s of
// compulsory traffic, a whole fmnist_cnn step before and after oneDNN and the fused passes, and oneDNN's convolution
// passes with their weights in each candidate format (BM_OnednnWeightFormat).
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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>

#include <benchmark/benchmark.h>

#ifdef RENAISSANCE_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

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

// Where oneDNN's weights could live (issue 19, "memory formats chosen once so no reorder runs per step";
// docs/kernels-cpu.md, "Weight formats"). One pass of a layer over the batch in the kernel's batch pieces, run one
// after the other on this thread (OMP_NUM_THREADS=1 gives the one-core figure Conv2dPlan runs per piece), with the
// primitive's weights in: 0 its own format ("any") plus the reorder from/to OHWI once per call (what Conv2dPlan
// runs), 1 its own format without that reorder (the bound for any scheme), 2 the weight gradient's format, 3 the
// forward's, 4 the data gradient's (2-4: what one format kept in the arena for all three passes would give), 5 HWIO,
// 6 OHWI (the arena's: no reorder at all), 7 the per-call weight reorder alone (its time per call; no GFLOP/s).
// Formats without an optimised kernel (oneDNN's `ref`) are reported and not timed. range: layer, pass (0 forward,
// 1 dx, 2 dW), variant.
#ifdef RENAISSANCE_HAVE_ONEDNN
void BM_OnednnWeightFormat(benchmark::State& state) {
  using namespace dnnl;
  using Tag = memory::format_tag;
  const Layer& l = kLayers[state.range(0)];
  const int pass = static_cast<int>(state.range(1)), variant = static_cast<int>(state.range(2));
  if (l.p.groups != 1 || (pass == 1 && l.xs.c == 1)) {
    state.SkipWithError(l.p.groups != 1 ? "grouped: not studied" : "a first layer computes no dx");
    return;
  }
  const Shape ys = conv2d_output_shape(l.xs, l.cout, l.p);
  // The kernel's batch pieces (conv2d_onednn.cpp): forward/dx up to 32 of >= 256 output positions; dW 2-16.
  std::int64_t target = std::min<std::int64_t>(32, l.xs.n / ((256 + ys.h * ys.w - 1) / (ys.h * ys.w)));
  if (pass == 2)
    target =
        std::clamp<std::int64_t>(std::min<std::int64_t>(2 * ys.n * ys.h * ys.w / 512,
                                                        (64ll << 20) / (4 * conv2d_weight_elems(l.xs.c, l.cout, l.p))),
                                 2, 16);
  const std::int64_t mb = (l.xs.n + std::max<std::int64_t>(target, 1) - 1) / std::max<std::int64_t>(target, 1);
  const std::int64_t pieces = l.xs.n / mb;  // whole pieces only: every piece runs the same primitive
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc x({mb, l.xs.c, l.xs.h, l.xs.w}, memory::data_type::f32, Tag::nhwc);
  const memory::desc y({mb, ys.c, ys.h, ys.w}, memory::data_type::f32, Tag::nhwc);
  const memory::dims wdims{l.cout, l.xs.c, l.p.kernel_h, l.p.kernel_w}, strides{l.p.stride_h, l.p.stride_w},
      pad{l.p.pad_h, l.p.pad_w};
  const memory::desc any(wdims, memory::data_type::f32, Tag::any), ohwi(wdims, memory::data_type::f32, Tag::ohwi);
  const auto algo = algorithm::convolution_direct;
  auto fwd_pd = [&](const memory::desc& w) {
    return convolution_forward::primitive_desc(
        convolution_forward::desc(prop_kind::forward_training, algo, x, w, memory::desc(), y, strides, pad, pad), eng);
  };
  // The weight format each pass picks for itself.
  const auto f_any = fwd_pd(any);
  const memory::desc own[] = {
      f_any.weights_desc(),
      convolution_backward_data::primitive_desc(convolution_backward_data::desc(algo, x, any, y, strides, pad, pad),
                                                eng, f_any)
          .weights_desc(),
      convolution_backward_weights::primitive_desc(
          convolution_backward_weights::desc(algo, x, any, memory::desc(), y, strides, pad, pad), eng, f_any)
          .diff_weights_desc()};
  const memory::desc wmd = variant <= 1 || variant == 7 ? own[pass]
                           : variant == 2               ? own[2]
                           : variant == 3               ? own[0]
                           : variant == 4               ? own[1]
                           : variant == 5               ? memory::desc(wdims, memory::data_type::f32, Tag::hwio)
                                                        : ohwi;
  primitive prim;
  std::string impl;
  memory::desc wprim;
  try {
    const auto fpd = fwd_pd(wmd);
    if (pass == 0) {
      prim = convolution_forward(fpd), impl = fpd.impl_info_str(), wprim = fpd.weights_desc();
    } else if (pass == 1) {
      const convolution_backward_data::primitive_desc pd(
          convolution_backward_data::desc(algo, x, wmd, y, strides, pad, pad), eng, f_any);
      prim = convolution_backward_data(pd), impl = pd.impl_info_str(), wprim = pd.weights_desc();
    } else {
      const convolution_backward_weights::primitive_desc pd(
          convolution_backward_weights::desc(algo, x, wmd, memory::desc(), y, strides, pad, pad), eng, f_any);
      prim = convolution_backward_weights(pd), impl = pd.impl_info_str(), wprim = pd.diff_weights_desc();
    }
  } catch (const dnnl::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const char* pass_name[] = {"forward", "dx", "dW"};
  const char* variant_name[] = {"own+reorder", "own",  "dW-format", "fwd-format",
                                "dx-format",   "hwio", "ohwi",      "reorder-only"};
  const std::string label = std::string(l.name) + " " + pass_name[pass] + " " + variant_name[variant] + " " + impl;
  if (impl.rfind("ref", 0) == 0) {
    state.SkipWithError((label + ": oneDNN's reference loops, not timed").c_str());
    return;
  }
  auto xv = random_vec(l.xs.elems(), 1), yv = random_vec(ys.elems(), 4), out_x = xv, out_y = yv;
  auto wv = random_vec(conv2d_weight_elems(l.xs.c, l.cout, l.p), 2);
  memory w_user(ohwi, eng, wv.data()), w_prim(wprim, eng);
  reorder(w_user, w_prim).execute(strm, w_user, w_prim);
  const bool reorder_each_call = variant == 0;
  const reorder to_prim(w_user, w_prim), to_user(w_prim, w_user);
  const std::int64_t xper = l.xs.per_sample(), yper = ys.per_sample();
  if (variant == 7) {
    for (auto _ : state) {
      if (pass == 2)
        to_user.execute(strm, w_prim, w_user);
      else
        to_prim.execute(strm, w_user, w_prim);
    }
    state.SetLabel(label);
    return;
  }
  for (auto _ : state) {
    if (reorder_each_call && pass != 2) to_prim.execute(strm, w_user, w_prim);
    for (std::int64_t i = 0; i < pieces; ++i) {
      memory mx(x, eng, (pass == 1 ? out_x.data() : xv.data()) + i * mb * xper);
      memory my(y, eng, (pass == 0 ? out_y.data() : yv.data()) + i * mb * yper);
      if (pass == 0) prim.execute(strm, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, w_prim}, {DNNL_ARG_DST, my}});
      if (pass == 1) prim.execute(strm, {{DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_WEIGHTS, w_prim}, {DNNL_ARG_DIFF_SRC, mx}});
      if (pass == 2) prim.execute(strm, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_DIFF_WEIGHTS, w_prim}});
    }
    if (reorder_each_call && pass == 2) to_user.execute(strm, w_prim, w_user);
  }
  rate(state, "GFLOP/s",
       2e-9 * static_cast<double>(pieces * mb * ys.h * ys.w) * l.cout * l.p.kernel_h * l.p.kernel_w * l.xs.c);
  state.SetLabel(label);
}
BENCHMARK(BM_OnednnWeightFormat)
    ->Apply([](auto* b) {
      for (std::int64_t i = 0; i < 9; ++i)  // the fmnist_cnn and narrow ResNet-18 layers of kLayers
        for (std::int64_t pass = 0; pass < 3; ++pass)
          for (std::int64_t v = 0; v < 8; ++v) b->Args({i, pass, v});
    }) -> UseRealTime() -> Unit(benchmark::kMillisecond);
#endif

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

// BN → ReLU forward of a conv's output, range(1): 0 = the plain parts (batchnorm_forward_train, relu_forward in
// place), 1 = statistics + one fused apply. GB/s of the fused pass's compulsory traffic (read x twice, write y).
void BM_BatchNormReluForward(benchmark::State& state) {
  const Shape s = kBnShapes[state.range(0)];
  const auto x = random_vec(s.elems(), 1), g = random_vec(s.c, 2), b = random_vec(s.c, 3);
  std::vector<float> y(x.size()), mean(s.c), inv(s.c), rm(s.c, 0.0f), rv(s.c, 1.0f);
  for (auto _ : state) {
    if (state.range(1) == 0) {
      batchnorm_forward_train(x.data(), s, g.data(), b.data(), y.data(), mean.data(), inv.data(), rm.data(), rv.data());
      relu_forward(y.data(), y.data(), s.elems());
    } else {
      batchnorm_train_statistics(x.data(), s, mean.data(), inv.data(), rm.data(), rv.data());
      BnApply a;
      a.x = x.data(), a.gamma = g.data(), a.beta = b.data(), a.mean = mean.data(), a.invstd = inv.data();
      batchnorm_apply_fused(a, s, BnShortcut::kNone, nullptr, nullptr, true, false, y.data());
    }
  }
  rate(state, "GB/s", 3e-9 * 4 * s.elems());
  state.SetLabel(s.str() + (state.range(1) ? " fused" : " parts"));
}

// ReLU backward → BN backward, range(1): 0 = the parts (relu_backward in place, batchnorm_backward), 1 = folded.
// GB/s of the folded pass's compulsory traffic (x and dy read twice, dx written).
void BM_BatchNormReluBackward(benchmark::State& state) {
  const Shape s = kBnShapes[state.range(0)];
  const auto x = random_vec(s.elems(), 1), dy = random_vec(s.elems(), 4), g = random_vec(s.c, 2),
             b = random_vec(s.c, 3);
  std::vector<float> y(x.size()), mean(s.c), inv(s.c), dx(x.size()), dg(s.c), db(s.c), gr(x.size());
  batchnorm_forward_train(x.data(), s, g.data(), b.data(), y.data(), mean.data(), inv.data(), nullptr, nullptr);
  relu_forward(y.data(), y.data(), s.elems());
  for (auto _ : state) {
    if (state.range(1) == 0) {
      relu_backward(y.data(), dy.data(), gr.data(), s.elems(), false);
      batchnorm_backward(x.data(), gr.data(), s, g.data(), mean.data(), inv.data(), dx.data(), dg.data(), db.data(),
                         false, true);
    } else {
      batchnorm_relu_backward(x.data(), dy.data(), s, g.data(), b.data(), mean.data(), inv.data(), false, dx.data(),
                              dg.data(), db.data(), false, true);
    }
  }
  rate(state, "GB/s", 5e-9 * 4 * s.elems());
  state.SetLabel(s.str() + (state.range(1) ? " fused" : " parts"));
}
void bn_fused_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t f = 0; f < 2; ++f) b->Args({i, f});
}
BENCHMARK(BM_BatchNormReluForward)->Apply(bn_fused_args)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BatchNormReluBackward)->Apply(bn_fused_args)->UseRealTime()->Unit(benchmark::kMillisecond);

// 2x2 max-pool (forward with its one-byte argmax, backward from it) over a ReLU output. GB/s of compulsory traffic:
// forward reads x and writes y + argmax; backward reads dy + argmax and writes dx.
void BM_MaxPool(benchmark::State& state) {
  const Shape xs = kBnShapes[state.range(0)];
  const Pool2dParams p{2, 2, 2, 2, 0, 0};
  const Shape ys = maxpool2d_output_shape(xs, p);
  auto x = random_vec(xs.elems(), 1);
  for (auto& v : x) v = std::max(v, 0.0f);  // a ReLU output: half zeros, ties
  std::vector<float> y(ys.elems()), dx(xs.elems());
  std::vector<std::uint8_t> arg(ys.elems());
  const bool backward = state.range(1) == 1;
  maxpool2d_forward(x.data(), xs, y.data(), ys, p, arg.data());
  for (auto _ : state) {
    if (backward)
      maxpool2d_backward(y.data(), ys, nullptr, arg.data(), dx.data(), xs, p, false);
    else
      maxpool2d_forward(x.data(), xs, y.data(), ys, p, arg.data());
  }
  rate(state, "GB/s", 1e-9 * (4.0 * xs.elems() + 5.0 * ys.elems()));
  state.SetLabel(xs.str() + (backward ? " backward" : " forward"));
}
BENCHMARK(BM_MaxPool)->Apply(bn_fused_args)->UseRealTime()->Unit(benchmark::kMillisecond);

// oneDNN's own batch norm and max-pool on the same NHWC shapes, for the choice "oneDNN where it wins" (it does not:
// docs/kernels-cpu.md). Threads: oneDNN's OpenMP runtime (OMP_NUM_THREADS), as PyTorch runs it; its reductions then
// split by thread count. range(1) BN: 0 forward training (scale/shift, statistics computed), 1 the same with the
// ReLU fused (fuse_norm_relu), 2 backward (dx, dγ, dβ). Pooling: 0 forward training with workspace, 1 backward.
// GB/s: the same compulsory traffic as the own kernels' rows above.
#ifdef RENAISSANCE_HAVE_ONEDNN
void BM_OnednnBatchNorm(benchmark::State& state) {
  using namespace dnnl;
  const Shape s = kBnShapes[state.range(0)];
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc md({s.n, s.c, s.h, s.w}, memory::data_type::f32, memory::format_tag::nhwc);
  const memory::desc cd({s.c}, memory::data_type::f32, memory::format_tag::x);
  auto x = random_vec(s.elems(), 1), dy = random_vec(s.elems(), 4), g = random_vec(s.c, 2), b = random_vec(s.c, 3);
  std::vector<float> y(x.size()), dx(x.size()), mean(s.c), var(s.c), dg(s.c), db(s.c);
  std::vector<std::uint8_t> ws(x.size());
  memory mx(md, eng, x.data()), my(md, eng, y.data()), mdy(md, eng, dy.data()), mdx(md, eng, dx.data());
  memory mg(cd, eng, g.data()), mb(cd, eng, b.data()), mm(cd, eng, mean.data()), mv(cd, eng, var.data());
  memory mdg(cd, eng, dg.data()), mdb(cd, eng, db.data());
  const auto flags = normalization_flags::use_scale | normalization_flags::use_shift |
                     (state.range(1) == 1 ? normalization_flags::fuse_norm_relu : normalization_flags::none);
  const batch_normalization_forward::primitive_desc fpd(
      batch_normalization_forward::desc(prop_kind::forward_training, md, 1e-5f, flags), eng);
  const batch_normalization_forward fwd(fpd);
  std::unordered_map<int, memory> fargs{{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}, {DNNL_ARG_SCALE, mg},
                                        {DNNL_ARG_SHIFT, mb}, {DNNL_ARG_MEAN, mm}, {DNNL_ARG_VARIANCE, mv}};
  if (state.range(1) == 1) fargs.emplace(DNNL_ARG_WORKSPACE, memory(fpd.workspace_desc(), eng));
  if (state.range(1) < 2) {
    for (auto _ : state) fwd.execute(strm, fargs);
    rate(state, "GB/s", 2e-9 * 4 * s.elems());
  } else {
    fwd.execute(strm, fargs);
    const batch_normalization_backward::primitive_desc bpd(
        batch_normalization_backward::desc(prop_kind::backward, md, md, 1e-5f, flags), eng, fpd);
    const batch_normalization_backward bwd(bpd);
    const std::unordered_map<int, memory> bargs{{DNNL_ARG_SRC, mx},        {DNNL_ARG_DIFF_DST, mdy},
                                                {DNNL_ARG_SCALE, mg},      {DNNL_ARG_SHIFT, mb},
                                                {DNNL_ARG_MEAN, mm},       {DNNL_ARG_VARIANCE, mv},
                                                {DNNL_ARG_DIFF_SRC, mdx},  {DNNL_ARG_DIFF_SCALE, mdg},
                                                {DNNL_ARG_DIFF_SHIFT, mdb}};
    for (auto _ : state) bwd.execute(strm, bargs);
    rate(state, "GB/s", 3e-9 * 4 * s.elems());
  }
  const char* what[] = {" forward", " forward+relu", " backward"};
  state.SetLabel(s.str() + what[state.range(1)] + " " + fpd.impl_info_str());
}
BENCHMARK(BM_OnednnBatchNorm)
    ->Apply([](auto* b) {
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t k = 0; k < 3; ++k) b->Args({i, k});
    })
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_OnednnMaxPool(benchmark::State& state) {
  using namespace dnnl;
  const Shape xs = kBnShapes[state.range(0)];
  const Shape ys = maxpool2d_output_shape(xs, Pool2dParams{2, 2, 2, 2, 0, 0});
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc xd({xs.n, xs.c, xs.h, xs.w}, memory::data_type::f32, memory::format_tag::nhwc);
  const memory::desc yd({ys.n, ys.c, ys.h, ys.w}, memory::data_type::f32, memory::format_tag::nhwc);
  auto x = random_vec(xs.elems(), 1);
  for (auto& v : x) v = std::max(v, 0.0f);
  std::vector<float> y(ys.elems()), dx(xs.elems());
  memory mx(xd, eng, x.data()), my(yd, eng, y.data()), mdx(xd, eng, dx.data());
  const pooling_forward::primitive_desc fpd(pooling_forward::desc(prop_kind::forward_training, algorithm::pooling_max,
                                                                  xd, yd, {2, 2}, {2, 2}, {0, 0}, {0, 0}),
                                            eng);
  memory mws(fpd.workspace_desc(), eng);
  const pooling_forward fwd(fpd);
  const std::unordered_map<int, memory> fargs{{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}, {DNNL_ARG_WORKSPACE, mws}};
  fwd.execute(strm, fargs);
  if (state.range(1) == 0) {
    for (auto _ : state) fwd.execute(strm, fargs);
  } else {
    const pooling_backward::primitive_desc bpd(
        pooling_backward::desc(algorithm::pooling_max, xd, yd, {2, 2}, {2, 2}, {0, 0}, {0, 0}), eng, fpd);
    const pooling_backward bwd(bpd);
    const std::unordered_map<int, memory> bargs{{DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_WORKSPACE, mws},
                                                {DNNL_ARG_DIFF_SRC, mdx}};
    for (auto _ : state) bwd.execute(strm, bargs);
  }
  rate(state, "GB/s", 1e-9 * (4.0 * xs.elems() + 5.0 * ys.elems()));
  state.SetLabel(xs.str() + (state.range(1) ? " backward " : " forward ") + fpd.impl_info_str());
}
BENCHMARK(BM_OnednnMaxPool)->Apply(bn_fused_args)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

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

// The default model, the zoo's fmnist_cnn (cbr32 - max-pool - cbr64 - max-pool - cbr64 - flatten - fc10, softmax CE
// with label smoothing 0.1, SGD Nesterov; batch 128, FP32): every kernel call of one training step, in order, as the
// runtime issues them (first layer: no dx). range(0): 0 = the kernels before oneDNN and the fused passes (XNNPACK
// forward and dx, own GEMM weight gradient, BN, ReLU and their backward one by one), 1 = oneDNN plans made once and
// the fused BN → ReLU and ReLU → BN backward passes. Reports img/s; RENAISSANCE_STEP_PROFILE=1 prints the time per
// kernel kind.
struct CbrLayer {
  Shape xs, ys;
  Conv2dParams p{3, 3, 1, 1, 1, 1, 1};
  std::vector<float> w, gamma, beta, mean, invstd, rmean, rvar, dw, dgamma, dbeta, c, r, dr, dc;
  std::unique_ptr<Conv2dPlan> fwd, dgrad, wgrad;
};

class FashionNet {
 public:
  FashionNet(std::int64_t batch, bool fused) : m_batch(batch), m_fused(fused) {
    const std::int64_t chans[] = {1, 32, 64, 64};
    std::int64_t hw = 28;
    // Before: what Auto chose then for these 3×3 layers (XNNPACK forward and dx, the own GEMM weight gradient).
    const Conv2dAlgo conv = fused ? Conv2dAlgo::Onednn : Conv2dAlgo::Xnnpack;
    for (int i = 0; i < 3; ++i) {
      CbrLayer l;
      l.xs = {batch, hw, hw, chans[i]};
      l.ys = conv2d_output_shape(l.xs, chans[i + 1], l.p);
      l.w = random_vec(conv2d_weight_elems(chans[i], chans[i + 1], l.p), 10 + i);
      for (auto& v : l.w) v *= 0.2f;
      l.gamma.assign(chans[i + 1], 1.0f), l.beta.assign(chans[i + 1], 0.0f);
      l.mean.resize(chans[i + 1]), l.invstd.resize(chans[i + 1]);
      l.rmean.assign(chans[i + 1], 0.0f), l.rvar.assign(chans[i + 1], 1.0f);
      l.dw.resize(l.w.size()), l.dgamma.resize(chans[i + 1]), l.dbeta.resize(chans[i + 1]);
      for (auto* v : {&l.c, &l.r, &l.dr, &l.dc}) v->resize(l.ys.elems() + 4);
      if (fused && !onednn_available()) throw std::runtime_error("built without oneDNN");
      l.fwd = std::make_unique<Conv2dPlan>(l.xs, l.ys, l.p, Conv2dPass::Forward, false, conv);
      if (i > 0) l.dgrad = std::make_unique<Conv2dPlan>(l.xs, l.ys, l.p, Conv2dPass::BackwardData, false, conv);
      l.wgrad = std::make_unique<Conv2dPlan>(l.xs, l.ys, l.p, Conv2dPass::BackwardFilter, false,
                                             fused ? Conv2dAlgo::Onednn : Conv2dAlgo::Gemm);
      m_layers.push_back(std::move(l));
      if (i < 2) hw /= 2;  // max-pool after the first two blocks
    }
    m_x = random_vec(m_layers[0].xs.elems() + 4, 1);
    for (int i = 0; i < 2; ++i) {
      m_pool_out[i].resize(m_layers[i + 1].xs.elems() + 4);
      m_pool_arg[i].resize(m_layers[i + 1].xs.elems());
      m_dpool[i].resize(m_layers[i + 1].xs.elems() + 4);
    }
    m_flat = m_layers[2].ys.per_sample();
    m_fc_w = random_vec(10 * m_flat, 2), m_fc_b.assign(10, 0.0f), m_dfc_w.resize(10 * m_flat), m_dfc_b.resize(10);
    for (auto& v : m_fc_w) v *= 0.05f;
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
      timed("conv fwd", [&] { l.fwd->forward(in, l.w.data(), nullptr, l.c.data()); });
      if (m_fused) {
        timed("bn+relu fwd", [&] {
          batchnorm_train_statistics(l.c.data(), l.ys, l.mean.data(), l.invstd.data(), l.rmean.data(), l.rvar.data());
          BnApply a;
          a.x = l.c.data(), a.gamma = l.gamma.data(), a.beta = l.beta.data(), a.mean = l.mean.data();
          a.invstd = l.invstd.data();
          batchnorm_apply_fused(a, l.ys, BnShortcut::kNone, nullptr, nullptr, true, false, l.r.data());
        });
      } else {
        timed("bn fwd", [&] {
          batchnorm_forward_train(l.c.data(), l.ys, l.gamma.data(), l.beta.data(), l.r.data(), l.mean.data(),
                                  l.invstd.data(), l.rmean.data(), l.rvar.data());
        });
        timed("relu fwd", [&] { relu_forward(l.r.data(), l.r.data(), l.ys.elems()); });  // in place, as planned
      }
      in = l.r.data();
      if (i < 2) {
        const Shape ps = m_layers[i + 1].xs;
        timed("pool fwd", [&] { maxpool2d_forward(in, l.ys, m_pool_out[i].data(), ps, m_pool, m_pool_arg[i].data()); });
        in = m_pool_out[i].data();
      }
    }
    CbrLayer& last = m_layers.back();
    timed("fc+ce", [&] {
      fc_forward(in, m_batch, m_flat, m_fc_w.data(), m_fc_b.data(), m_logits.data(), 10);
      softmax_ce_forward(m_logits.data(), m_labels.data(), m_batch, 10, 0.1f, m_probs.data());
      softmax_ce_backward(m_probs.data(), m_labels.data(), m_batch, 10, 0.1f, 1.0f, m_dlogits.data(), false);
      fc_backward_weights(in, m_dlogits.data(), m_batch, m_flat, 10, m_dfc_w.data(), m_dfc_b.data(), false);
      fc_backward_data(m_dlogits.data(), m_batch, 10, m_fc_w.data(), last.dr.data(), m_flat, false);
    });
    // backward
    for (int i = 2; i >= 0; --i) {
      CbrLayer& l = m_layers[static_cast<std::size_t>(i)];
      const float* x = i == 0 ? m_x.data() : m_pool_out[i - 1].data();
      if (m_fused) {
        timed("relu+bn bwd", [&] {
          batchnorm_relu_backward(l.c.data(), l.dr.data(), l.ys, l.gamma.data(), l.beta.data(), l.mean.data(),
                                  l.invstd.data(), false, l.dc.data(), l.dgamma.data(), l.dbeta.data(), false, false);
        });
      } else {
        timed("relu bwd", [&] { relu_backward(l.r.data(), l.dr.data(), l.dr.data(), l.ys.elems(), false); });
        timed("bn bwd", [&] {
          batchnorm_backward(l.c.data(), l.dr.data(), l.ys, l.gamma.data(), l.mean.data(), l.invstd.data(),
                             l.dc.data(), l.dgamma.data(), l.dbeta.data(), false, false);
        });
      }
      timed("conv dw", [&] { l.wgrad->backward_filter(x, l.dc.data(), l.dw.data(), nullptr, false); });
      if (i == 0) break;
      float* dx = m_dpool[i - 1].data();
      timed("conv dx", [&] { l.dgrad->backward_data(l.dc.data(), l.w.data(), dx, false); });
      CbrLayer& prev = m_layers[static_cast<std::size_t>(i) - 1];
      timed("pool bwd", [&] {
        maxpool2d_backward(dx, l.xs, nullptr, m_pool_arg[i - 1].data(), prev.dr.data(), prev.ys, m_pool, false);
      });
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
  bool m_fused;
  std::int64_t m_flat = 0;
  std::vector<CbrLayer> m_layers;
  const Pool2dParams m_pool{2, 2, 2, 2, 0, 0};
  std::vector<float> m_x, m_pool_out[2], m_dpool[2], m_fc_w, m_fc_b, m_dfc_w, m_dfc_b, m_logits, m_probs, m_dlogits,
      m_vel;
  std::vector<std::uint8_t> m_pool_arg[2];
  std::vector<std::int32_t> m_labels;
  OptimizerScalars m_scalars;
};

void BM_FashionNetStep(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  if (fused && !onednn_available()) {
    state.SkipWithError("built without oneDNN");
    return;
  }
  FashionNet net(128, fused);
  net.step();
  const char* prof = std::getenv("RENAISSANCE_STEP_PROFILE");
  net.profiling = prof && prof[0] == '1';
  std::int64_t steps = 0;
  for (auto _ : state) {
    net.step();
    ++steps;
  }
  rate(state, "img/s", 128.0);
  state.SetLabel(fused ? "onednn+fused" : "before (xnnpack/gemm, parts)");
  if (net.profiling)
    for (const auto& [what, ms] : net.profile) std::printf("  %-12s %7.2f ms/step\n", what.c_str(), ms / steps);
}
BENCHMARK(BM_FashionNetStep)->DenseRange(0, 1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
