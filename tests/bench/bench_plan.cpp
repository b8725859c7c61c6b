// Google Benchmark: the whole planning path (BluePrint → ArchPlan → Compiler, six variants) and serialisation.
// Target (issue 2): compiling ResNet-50 (AMP, AdamW, EMA) under 100 ms on the 2-core CI machine.
// Deep nets (issue 13): BM_CompileDeepRelu/BM_CompileDeepCbr at several depths with Google Benchmark's complexity fit,
// which should come out as O(N) (the pairwise placement and fusion search grew with N^2).
#include <renaissance/blueprint/blueprint.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/plan/compiler.h>

#include <benchmark/benchmark.h>

namespace {

using namespace renaissance;

void compile_model(benchmark::State& state, const char* model, bool amp, plan::OptimizerKind opt, bool ema) {
  const blueprint::BluePrint bp = blueprint::zoo_model(model);
  plan::TrainConfig cfg;
  cfg.amp = amp;
  cfg.optimizer = opt;
  cfg.ema = ema;
  cfg.batch = 256;
  cfg.dataset_size = 1281167;  // ImageNet-1k train
  cfg.val_size = 50000;
  std::int64_t arena = 0;
  for (auto _ : state) {
    plan::BuildOptions bo;
    bo.amp = amp;
    bo.fuse = amp;
    const plan::ArchPlan arch = plan::ArchPlan::build(bp, bo);
    const plan::CompiledPlan p = plan::Compiler::compile(arch, cfg);
    arena = p.arena_bytes();
    benchmark::DoNotOptimize(arena);
  }
  state.counters["arena_GiB"] = static_cast<double>(arena) / (1024.0 * 1024.0 * 1024.0);
}

void BM_CompileResNet50_AmpAdamW(benchmark::State& s) {
  compile_model(s, "resnet50", true, plan::OptimizerKind::ADAMW, true);
}
void BM_CompileResNet50_Fp32Momentum(benchmark::State& s) {
  compile_model(s, "resnet50", false, plan::OptimizerKind::MOMENTUM, false);
}
void BM_CompileResNet101_AmpAdamW(benchmark::State& s) {
  compile_model(s, "resnet101", true, plan::OptimizerKind::ADAMW, true);
}
void BM_CompileFmnistCnn(benchmark::State& s) { compile_model(s, "fmnist_cnn", false, plan::OptimizerKind::NESTEROV, false); }

/// `n` layers (`relu`, or conv+BN+ReLU: `cbr`, which the fusion pass fuses) between a conv and the classifier on an
/// 8x8x1 input, compiled for training (six variants, liveness reuse), as the test PlanScaling and
/// docs/benchmarks.md's planning-time table.
void compile_deep(benchmark::State& state, bool cbr) {
  const std::int64_t n = state.range(0);
  blueprint::BluePrint bp;
  bp.name = "deep";
  bp.in_h = 8;
  bp.in_w = 8;
  bp.in_c = 1;
  bp.root = blueprint::seq({blueprint::conv(4, 3, 1, 1),
                            blueprint::repeat(n, cbr ? blueprint::cbr(4, 3, 1, 1) : blueprint::relu()),
                            blueprint::gap(), blueprint::fc(10), blueprint::softmax_ce(10)});
  plan::TrainConfig cfg;
  cfg.batch = 32;
  cfg.dataset_size = 1000;
  cfg.val_size = 300;
  plan::BuildOptions bo;
  bo.fuse = cbr;
  for (auto _ : state) {
    const plan::CompiledPlan p = plan::Compiler::compile(plan::ArchPlan::build(bp, bo), cfg);
    benchmark::DoNotOptimize(p.hash);
  }
  state.SetComplexityN(n);
}
void BM_CompileDeepRelu(benchmark::State& s) { compile_deep(s, false); }
void BM_CompileDeepCbr(benchmark::State& s) { compile_deep(s, true); }

void BM_SerializeResNet50(benchmark::State& state) {
  plan::BuildOptions bo;
  bo.amp = true;
  bo.fuse = true;
  plan::TrainConfig cfg;
  cfg.amp = true;
  cfg.optimizer = plan::OptimizerKind::ADAMW;
  const plan::CompiledPlan p = plan::Compiler::compile(plan::ArchPlan::build(blueprint::zoo_model("resnet50"), bo), cfg);
  std::size_t bytes = 0;
  for (auto _ : state) {
    const auto buf = plan::serialize(p);
    const plan::CompiledPlan back = plan::deserialize(buf);
    bytes = buf.size();
    benchmark::DoNotOptimize(back.hash);
  }
  state.counters["plan_KiB"] = static_cast<double>(bytes) / 1024.0;
}

BENCHMARK(BM_CompileResNet50_AmpAdamW)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileResNet50_Fp32Momentum)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileResNet101_AmpAdamW)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileFmnistCnn)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileDeepRelu)->Arg(2500)->Arg(5000)->Arg(10000)->Arg(20000)->Complexity()->Unit(benchmark::kSecond);
BENCHMARK(BM_CompileDeepCbr)->Arg(1250)->Arg(2500)->Arg(5000)->Arg(10000)->Complexity()->Unit(benchmark::kSecond);
BENCHMARK(BM_SerializeResNet50)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
