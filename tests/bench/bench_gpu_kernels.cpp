// GPU kernel benchmarks (Google Benchmark, manual time from CUDA events): the batch-norm family the fused layers run
// (statistics, BN + ReLU apply, ReLU + BN backward, the residual sum's ReLU backward with and without the BN backward
// after it) on the FP16 activation shapes of ResNet-50 b256 and resnet18_cifar b512, in GB/s of compulsory traffic
// beside a device-to-device copy of the same tensor (the bandwidth ceiling). What it is for: checking each pass against
// that ceiling (DESIGN §11, lever 4) and measuring a kernel change in one device call.
//   build-gpu/tests/bench/bench_gpu_kernels --benchmark_min_time=0.2s      (scripts/bench/gpu_session.sh STEPS=kernels)
// `ConvStats/...` (issue 15, --conv-stats): each ResNet-50 b256 forward convolution with the batch-norm statistics of
// its output, as the deterministic step runs it (the fastest of the first four deterministic plain plans, then the
// own statistics kernel) against one cuDNN plan with GEN_STATS in its epilogue (the fastest of its first four; none
// is offered in deterministic mode, docs/design.md); `per_step` counts the layers of that shape in one step.
//   build-gpu/tests/bench/bench_gpu_kernels --benchmark_filter=ConvStats
// Without a CUDA device it prints why and exits 0.
#include <kernels/cuda/batchnorm.h>
#include <kernels/cuda/conv.h>
#include <kernels/cuda/conv_graph.h>
#include <kernels/cuda/dnn_handles.h>
#include <kernels/cuda/elementwise.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace renaissance;
using namespace renaissance::cuda;

struct Case {
  const char* model;
  int n, h, w, c;
};
// Every distinct BN shape of the two models (FP16, channels a multiple of 8: no padding).
const Case kCases[] = {
    {"resnet50", 256, 112, 112, 64},     {"resnet50", 256, 56, 56, 64},        {"resnet50", 256, 56, 56, 256},
    {"resnet50", 256, 28, 28, 128},      {"resnet50", 256, 28, 28, 512},       {"resnet50", 256, 14, 14, 256},
    {"resnet50", 256, 14, 14, 1024},     {"resnet50", 256, 7, 7, 512},         {"resnet50", 256, 7, 7, 2048},
    {"resnet18_cifar", 512, 32, 32, 64}, {"resnet18_cifar", 512, 16, 16, 128}, {"resnet18_cifar", 512, 8, 8, 256},
    {"resnet18_cifar", 512, 4, 4, 512}};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(std::size_t bytes) { check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

/// The tensors of one shape: six FP16 activations (x, y, dy, a, g, dx) with random values (y ≥ 0, about half of it
/// zero, as a ReLU output), per-channel parameters and statistics, the BN workspace.
struct Tensors {
  TensorRef x, y, dy, a, g, dx;
  std::vector<std::unique_ptr<DeviceMem>> mem;
  float *gamma, *beta, *mean, *var, *invstd, *dgamma, *dbeta, *eps;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  std::size_t bytes = 0;  ///< of one activation

  explicit Tensors(const Case& k) {
    const Shape s{k.n, k.h, k.w, k.c};
    const std::size_t elems = static_cast<std::size_t>(s.elems());
    bytes = elems * sizeof(__half);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    // 1 Mi random values, repeated over the tensor (the values only steer the ReLU masks and the arithmetic).
    std::vector<__half> block(std::size_t{1} << 20);
    auto activation = [&](bool relu) {
      for (auto& v : block) {
        const float f = u(rng);
        v = __float2half(relu && f < 0.0f ? 0.0f : f);
      }
      mem.push_back(std::make_unique<DeviceMem>(bytes));
      for (std::size_t at = 0; at < elems; at += block.size()) {
        const std::size_t n = std::min(block.size(), elems - at);
        check(cudaMemcpy(static_cast<__half*>(mem.back()->p) + at, block.data(), n * sizeof(__half),
                         cudaMemcpyHostToDevice),
              "upload");
      }
      return TensorRef{mem.back()->p, s, DType::F16, k.c};
    };
    x = activation(false);
    y = activation(true);
    dy = activation(false);
    a = activation(false);
    g = activation(false);
    dx = activation(false);
    auto params = [&](float lo, float hi) {
      std::vector<float> v(static_cast<std::size_t>(k.c));
      std::uniform_real_distribution<float> p(lo, hi);
      for (auto& f : v) f = p(rng);
      mem.push_back(std::make_unique<DeviceMem>(v.size() * 4));
      check(cudaMemcpy(mem.back()->p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
      return mem.back()->f();
    };
    gamma = params(0.5f, 1.5f);
    beta = params(-0.5f, 0.5f);
    mean = params(-0.1f, 0.1f);
    var = params(0.5f, 1.5f);
    invstd = params(0.8f, 1.2f);
    dgamma = params(0.0f, 0.0f);
    dbeta = params(0.0f, 0.0f);
    eps = params(1e-5f, 1e-5f);
    ws_bytes = batchnorm_workspace_bytes(x);
    mem.push_back(std::make_unique<DeviceMem>(ws_bytes));
    ws = mem.back()->p;
  }
};

/// Times `launch` with CUDA events (10 launches per iteration, after 3 untimed) and reports GB/s of `passes`
/// activation-sized reads and writes.
template <typename F>
void run(benchmark::State& state, const Tensors& t, double passes, F launch) {
  cudaStream_t stream = nullptr;
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  for (int i = 0; i < 3; ++i) launch(stream);
  check(cudaStreamSynchronize(stream), "warm-up");
  constexpr int kLaunches = 10;
  double total = 0.0;
  for (auto _ : state) {
    check(cudaEventRecord(e0, stream), "record");
    for (int i = 0; i < kLaunches; ++i) launch(stream);
    check(cudaEventRecord(e1, stream), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    const double s = ms * 1e-3 / kLaunches;
    total += s;
    state.SetIterationTime(s);
  }
  const double avg = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = passes * static_cast<double>(t.bytes) / avg * 1e-9;
  state.counters["us"] = avg * 1e6;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

/// The tensors of the case being measured, made once for all its benchmarks (they run in registration order).
const Tensors& tensors_of(const Case& k) {
  static const Case* current = nullptr;
  static std::unique_ptr<Tensors> t;
  if (current != &k) {
    t.reset();
    t = std::make_unique<Tensors>(k);
    current = &k;
  }
  return *t;
}

void register_case(const Case& k) {  // k: an element of kCases (its address keys tensors_of)
  const std::string shape = std::string(k.model) + "/" + std::to_string(k.n) + "x" + std::to_string(k.h) + "x" +
                            std::to_string(k.w) + "x" + std::to_string(k.c);
  auto add = [&](const char* what, double passes, auto launch) {
    benchmark::RegisterBenchmark((std::string(what) + "/" + shape).c_str(),
                                 [kp = &k, passes, launch](benchmark::State& state) {
                                   const Tensors& t = tensors_of(*kp);
                                   run(state, t, passes, [&](cudaStream_t s) { launch(s, t); });
                                 })
        ->UseManualTime()
        ->Iterations(50)  // a fixed count: left to itself the library ran ~7 s per benchmark (2026-12-06, one H100)
        ->Unit(benchmark::kMicrosecond);
  };
  // The ceiling: read x, write dx.
  add("copy", 2, [](cudaStream_t s, const Tensors& t) {
    check(cudaMemcpyAsync(t.dx.ptr, t.x.ptr, t.bytes, cudaMemcpyDeviceToDevice, s), "copy");
  });
  // Statistics: read x (partials), then the finalize over the partials.
  add("bn_statistics", 1, [](cudaStream_t s, const Tensors& t) {
    batchnorm_train_statistics(s, t.x, t.eps, t.mean, t.var, t.invstd, t.ws, t.ws_bytes);
  });
  // BN + ReLU apply (plan BN_RELU after its statistics): read x, write y.
  add("bn_relu_apply", 2, [](cudaStream_t s, const Tensors& t) {
    batchnorm_apply_fused(s, false, BnApply{t.x, t.gamma, t.beta, t.mean, t.invstd, nullptr}, Shortcut::kNone, {},
                          nullptr, true, t.dx);
  });
  // BN + add + ReLU apply (plan BN_ADD_RELU): read x and the shortcut, write y.
  add("bn_add_relu_apply", 3, [](cudaStream_t s, const Tensors& t) {
    batchnorm_apply_fused(s, false, BnApply{t.x, t.gamma, t.beta, t.mean, t.invstd, nullptr}, Shortcut::kTensor, t.a,
                          nullptr, true, t.dx);
  });
  // ReLU + BN backward (plan RELU_BN_BWD): read x, dy; read x, dy, write dx.
  add("relu_bn_backward", 5, [](cudaStream_t s, const Tensors& t) {
    const ReluMask m{t.invstd, t.gamma, t.beta};
    batchnorm_relu_backward(s, t.x, t.dy, t.gamma, t.mean, t.invstd, &m, t.dx, false, t.dgamma, t.dbeta, t.ws,
                            t.ws_bytes);
  });
  // The residual sum's ReLU backward, then the BN backward, as two calls (plan ADD_RELU_BWD + BN_BWD): read y, dy, a,
  // write g; read g, x; read g, x, write dx.
  add("add_relu_then_bn_backward", 9, [](cudaStream_t s, const Tensors& t) {
    relu_backward_sum(s, t.y, t.dy, t.a, t.g);
    batchnorm_backward(s, t.x, t.g, t.gamma, t.mean, t.invstd, t.dx, false, t.dgamma, t.dbeta, t.ws, t.ws_bytes);
  });
  // The same in one statistics pass (plan ADD_RELU_BN_BWD): read y, dy, a, x, write g; read g, x, write dx.
  add("add_relu_bn_backward", 8, [](cudaStream_t s, const Tensors& t) {
    batchnorm_add_relu_backward(s, t.y, t.dy, t.a, t.g, t.x, t.gamma, t.mean, t.invstd, t.dx, false, t.dgamma, t.dbeta,
                                t.ws, t.ws_bytes);
  });
}

// ---- convolution + batch-norm statistics (ConvStats) ------------------------------------------------------

struct ConvCase {
  const char* name;
  int per_step;  ///< layers of this shape in one ResNet-50 step
  int h, w, cin, cout, k, stride;
};
// ResNet-50's forward convolutions at batch 256 (torchvision v1.5: the stride on the 3x3); the stem with its input
// padded to 8 channels, as AMP plans store it.
const ConvCase kConvCases[] = {
    {"stem_7x7s2_8to64", 1, 224, 224, 8, 64, 7, 2},
    {"l1_1x1_64to64", 1, 56, 56, 64, 64, 1, 1},        {"l1_3x3_64", 3, 56, 56, 64, 64, 3, 1},
    {"l1_1x1_64to256", 4, 56, 56, 64, 256, 1, 1},      {"l1_1x1_256to64", 2, 56, 56, 256, 64, 1, 1},
    {"l2_1x1_256to128", 1, 56, 56, 256, 128, 1, 1},    {"l2_3x3s2_128", 1, 56, 56, 128, 128, 3, 2},
    {"l2_1x1s2_256to512", 1, 56, 56, 256, 512, 1, 2},  {"l2_1x1_128to512", 4, 28, 28, 128, 512, 1, 1},
    {"l2_1x1_512to128", 3, 28, 28, 512, 128, 1, 1},    {"l2_3x3_128", 3, 28, 28, 128, 128, 3, 1},
    {"l3_1x1_512to256", 1, 28, 28, 512, 256, 1, 1},    {"l3_3x3s2_256", 1, 28, 28, 256, 256, 3, 2},
    {"l3_1x1s2_512to1024", 1, 28, 28, 512, 1024, 1, 2}, {"l3_1x1_256to1024", 6, 14, 14, 256, 1024, 1, 1},
    {"l3_1x1_1024to256", 5, 14, 14, 1024, 256, 1, 1},  {"l3_3x3_256", 5, 14, 14, 256, 256, 3, 1},
    {"l4_1x1_1024to512", 1, 14, 14, 1024, 512, 1, 1},  {"l4_3x3s2_512", 1, 14, 14, 512, 512, 3, 2},
    {"l4_1x1s2_1024to2048", 1, 14, 14, 1024, 2048, 1, 2}, {"l4_1x1_512to2048", 3, 7, 7, 512, 2048, 1, 1},
    {"l4_1x1_2048to512", 2, 7, 7, 2048, 512, 1, 1},    {"l4_3x3_512", 2, 7, 7, 512, 512, 3, 1},
};
constexpr int kConvBatch = 256;
constexpr std::size_t kConvWorkspace = std::size_t{256} << 20;

/// One shape's tensors and the chosen plan of one variant (0: plain + own statistics, 1: GEN_STATS).
struct ConvStatsSetup {
  Shape xs, ys;
  std::vector<std::unique_ptr<DeviceMem>> mem;
  void *x, *w, *y, *ws;
  float *sum, *sqsum, *mean, *var, *invstd, *eps;
  void* bn_ws;
  std::size_t bn_ws_bytes;
  std::unique_ptr<GraphConv> graph;
  int plan = -1;
  std::string engine;

  ConvStatsSetup(const ConvCase& k, int variant) {
    const int pad = k.k / 2;
    xs = Shape{kConvBatch, k.h, k.w, k.cin};
    ys = Shape{kConvBatch, (k.h + 2 * pad - k.k) / k.stride + 1, (k.w + 2 * pad - k.k) / k.stride + 1, k.cout};
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto halves = [&](std::size_t n, float scale) {
      std::vector<__half> v(n);
      for (auto& h : v) h = __float2half(u(rng) * scale);
      mem.push_back(std::make_unique<DeviceMem>(n * sizeof(__half)));
      check(cudaMemcpy(mem.back()->p, v.data(), n * sizeof(__half), cudaMemcpyHostToDevice), "upload");
      return mem.back()->p;
    };
    auto floats = [&](std::size_t n, float value) {
      std::vector<float> v(n, value);
      mem.push_back(std::make_unique<DeviceMem>(n * 4));
      check(cudaMemcpy(mem.back()->p, v.data(), n * 4, cudaMemcpyHostToDevice), "upload");
      return mem.back()->f();
    };
    x = halves(static_cast<std::size_t>(xs.elems()), 1.0f);
    w = halves(static_cast<std::size_t>(k.cout) * k.k * k.k * k.cin, 0.05f);
    y = halves(static_cast<std::size_t>(ys.elems()), 0.0f);
    const auto c = static_cast<std::size_t>(k.cout);
    sum = floats(c, 0);
    sqsum = floats(c, 0);
    mean = floats(c, 0);
    var = floats(c, 0);
    invstd = floats(c, 0);
    eps = floats(1, 1e-5f);
    bn_ws_bytes = batchnorm_workspace_bytes(TensorRef{y, ys, DType::F16, k.cout});
    mem.push_back(std::make_unique<DeviceMem>(bn_ws_bytes));
    bn_ws = mem.back()->p;
    mem.push_back(std::make_unique<DeviceMem>(kConvWorkspace));
    ws = mem.back()->p;

    GraphConvDesc d;
    d.pass = ConvPass::Forward;
    d.x = xs;
    d.y = ys;
    d.x_cs = k.cin;
    d.y_cs = k.cout;
    d.kernel_h = d.kernel_w = k.k;
    d.stride_h = d.stride_w = k.stride;
    d.pad_h = d.pad_w = pad;
    d.dtype = DType::F16;
    d.strict_fp32 = false;
    d.genstats = variant != 0;
    d.deterministic = variant == 0;
    d.workspace_limit = kConvWorkspace;
    graph = std::make_unique<GraphConv>(d);
    DnnHandles& h = DnnHandles::for_device(0);
    h.set_stream(nullptr);
    std::string why;
    const int n = graph->query(h.cudnn(), &why);
    // The fastest of the first four that build, 20 runs each (as ConvOp's start-up timing).
    float best = 0;
    int built = 0;
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    for (int i = 0; i < n && i < 24 && built < 4; ++i) {
      if (!graph->build(i, &why)) continue;
      ++built;
      launch_plan(h, i, nullptr);
      check(cudaEventRecord(e0, nullptr), "record");
      for (int r = 0; r < 20; ++r) launch_plan(h, i, nullptr);
      check(cudaEventRecord(e1, nullptr), "record");
      check(cudaEventSynchronize(e1), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      if (plan < 0 || ms < best) {
        best = ms;
        plan = i;
        engine = graph->config(i).name;
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (plan < 0) engine = "none: " + why;
  }
  void launch_plan(DnnHandles& h, int i, cudaStream_t s) const {
    if (!graph->desc().genstats) {
      graph->execute(h.cudnn(), i, x, w, y, ws);
      batchnorm_train_statistics(s, TensorRef{y, ys, DType::F16, ys.c}, eps, mean, var, invstd, bn_ws, bn_ws_bytes);
    } else {
      graph->execute(h.cudnn(), i, x, w, y, ws, sum, sqsum);
    }
  }
};

void register_conv_case(const ConvCase& k) {
  static const char* const kVariant[] = {"conv+bn_statistics", "conv_genstats"};
  for (int variant = 0; variant < 2; ++variant)
    benchmark::RegisterBenchmark(
        (std::string("ConvStats/") + kVariant[variant] + "/" + k.name).c_str(),
        [kp = &k, variant](benchmark::State& state) {
          ConvStatsSetup t(*kp, variant);
          state.SetLabel(t.engine);
          state.counters["per_step"] = kp->per_step;
          if (t.plan < 0) {
            state.SkipWithError(("no plan: " + t.engine).c_str());
            return;
          }
          DnnHandles& h = DnnHandles::for_device(0);
          cudaEvent_t e0, e1;
          check(cudaEventCreate(&e0), "event");
          check(cudaEventCreate(&e1), "event");
          double total = 0;
          for (auto _ : state) {
            check(cudaEventRecord(e0, nullptr), "record");
            for (int i = 0; i < 10; ++i) t.launch_plan(h, t.plan, nullptr);
            check(cudaEventRecord(e1, nullptr), "record");
            check(cudaEventSynchronize(e1), "sync");
            float ms = 0;
            check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
            state.SetIterationTime(ms * 1e-3 / 10);
            total += ms * 1e-3 / 10;
          }
          state.counters["us"] = total / static_cast<double>(state.iterations()) * 1e6;
          cudaEventDestroy(e0);
          cudaEventDestroy(e1);
        })
        ->UseManualTime()
        ->Iterations(30)
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_gpu_kernels: no CUDA device, nothing measured\n");
    return 0;
  }
  for (const Case& k : kCases) register_case(k);
  for (const ConvCase& k : kConvCases) register_conv_case(k);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
