// GPU kernel benchmarks (Google Benchmark, manual time from CUDA events): the batch-norm family the fused layers run
// (statistics, BN + ReLU apply, ReLU + BN backward, the residual sum's ReLU backward with and without the BN backward
// after it) on the FP16 activation shapes of ResNet-50 b256 and resnet18_cifar b512, in GB/s of compulsory traffic
// beside a device-to-device copy of the same tensor (the bandwidth ceiling). What it is for: checking each pass against
// that ceiling (DESIGN §11, lever 4) and measuring a kernel change in one device call.
//   build-gpu/tests/bench/bench_gpu_kernels --benchmark_min_time=0.2s      (scripts/bench/gpu_session.sh STEPS=kernels)
// Without a CUDA device it prints why and exits 0.
#include <kernels/cuda/batchnorm.h>
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

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_gpu_kernels: no CUDA device, nothing measured\n");
    return 0;
  }
  for (const Case& k : kCases) register_case(k);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
