// `renaissance bench`: training-step throughput on synthetic data (N warm-up + M timed steps).
#include "cli_errors.h"
#include "commands.h"
#include "environment.h"
#include "gpu_options.h"
#include "json_writer.h"
#include "model_options.h"

#include <renaissance/comm/communicator.h>
#include <renaissance/core/error.h>
#include <renaissance/io/importers.h>
#include <renaissance/plan/arch_plan.h>
#include <renaissance/runtime/devices.h>
#include <renaissance/runtime/trainer.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::app {

namespace {

struct BenchCli {
  ModelOptions model;
  std::int64_t batch = 256;
  std::int64_t warmup = 10;
  std::int64_t steps = 50;
  bool amp = false;
  std::string graphs = "on";
  std::string fused_kernels = "on";
  std::string cpu_winograd;  ///< on|off; empty: RENAISSANCE_CPU_WINOGRAD, else on
  std::string fold_residual_sums = "on";
  std::string fuse_residual_bn_backward = "on";
  std::string relu_mask = "on";
  std::string fuse_shortcut_bn_backward = "on";
  std::string recompute = "off";
  std::int64_t recompute_budget = 0;
  std::string device = "auto";
  std::string optimizer = "momentum";
  bool json = false;
  double comm_timeout = 0;
  bool profile = false;
  std::int64_t profile_steps = 10;
  GpuOptions gpu;  ///< --deterministic, --engine-cache, --conv-api
};

constexpr std::size_t kProfileRows = 40;  ///< rows of a profile table before "others"

/// GB/s of a kernel row when `traffic` knows its label and its calls a step are those passes; < 0: none.
double row_gbps(const runtime::ProfileRow& x, const std::map<std::string, runtime::PassTraffic>* traffic) {
  if (traffic == nullptr || x.ms_per_step <= 0) return -1;
  const auto it = traffic->find(x.label);
  if (it == traffic->end() || std::abs(x.calls_per_step - it->second.passes) > 1e-6) return -1;
  return it->second.bytes / (x.ms_per_step * 1e-3) / 1e9;
}

/// One profile table: the slowest kProfileRows rows, then the rest as "others". With `traffic` (the kernel table),
/// a GB/s column for the fused passes.
void print_profile_table(const char* title, const std::vector<runtime::ProfileRow>& rows, bool calls,
                         const std::map<std::string, runtime::PassTraffic>* traffic = nullptr) {
  if (calls)
    std::printf("\n  %-44s %11s %10s %7s %9s\n", title, "calls/step", "ms/step", "%", "GB/s");
  else
    std::printf("\n  %-44s %10s %7s\n", title, "ms/step", "%");
  runtime::ProfileRow others;
  std::size_t rest = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const runtime::ProfileRow& x = rows[i];
    if (i >= kProfileRows) {
      ++rest;
      others.calls_per_step += x.calls_per_step;
      others.ms_per_step += x.ms_per_step;
      others.percent += x.percent;
      continue;
    }
    const double gbps = row_gbps(x, traffic);
    if (calls)
      std::printf("  %-44s %11.1f %10.4f %7.2f %9s\n", x.label.c_str(), x.calls_per_step, x.ms_per_step, x.percent,
                  gbps < 0 ? "-" : fmt::format("{:.1f}", gbps).c_str());
    else
      std::printf("  %-44s %10.4f %7.2f\n", x.label.c_str(), x.ms_per_step, x.percent);
  }
  if (rest == 0) return;
  const std::string label = fmt::format("others ({} rows)", rest);
  if (calls)
    std::printf("  %-44s %11.1f %10.4f %7.2f %9s\n", label.c_str(), others.calls_per_step, others.ms_per_step,
                others.percent, "-");
  else
    std::printf("  %-44s %10.4f %7.2f\n", label.c_str(), others.ms_per_step, others.percent);
}

void json_profile_rows(JsonWriter& j, const std::string& key, const std::vector<runtime::ProfileRow>& rows,
                       const std::map<std::string, runtime::PassTraffic>* traffic = nullptr) {
  j.key(key).begin_array();
  for (const runtime::ProfileRow& x : rows) {
    j.begin_object().kv("label", x.label);
    if (!x.graph.empty()) j.kv("graph", x.graph);
    j.kv("calls_per_step", x.calls_per_step).kv("ms_per_step", x.ms_per_step).kv("percent", x.percent);
    const double gbps = row_gbps(x, traffic);
    if (gbps >= 0) j.kv("bytes_per_step", traffic->at(x.label).bytes).kv("gb_per_s", gbps);
    j.end_object();
  }
  j.end_array();
}

/// A directory of this process's, removed with what is in it when the scope ends (an error included).
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(std::filesystem::path p) : path(std::move(p)) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    RN_CHECK_CTX(!ec, path.string(), "bench: cannot create its temporary directory: {} (hint: point TMPDIR at a "
                 "writable directory)", ec.message());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

void run_bench(const BenchCli& c) {
  if (!c.cpu_winograd.empty()) runtime::set_cpu_winograd(c.cpu_winograd == "on");
  RN_CHECK(c.profile_steps >= 1, "--profile-steps must be at least 1, got {}", c.profile_steps);
  const blueprint::BluePrint bp = c.model.load();  // --resolution applied (zoo models and model files)
  plan::BuildOptions bo;
  const plan::ArchPlan probe = plan::ArchPlan::build(bp, bo);
  runtime::TrainOptions t;
  t.batch = c.batch;
  t.amp = c.amp;
  t.backend = pick_backend(c.device);
  // Data-parallel under mpirun/srun: --batch is global, each rank steps batch/ranks; rank 0 reports.
  const std::unique_ptr<runtime::Communicator> comm = comm::open_communicator(t.backend, c.comm_timeout);
  t.comm = comm.get();
  t.optimizer = plan::optimizer_from_name(c.optimizer);
  t.validate = false;
  t.fuse_kernels = c.fused_kernels == "on";
  t.fold_residual_sums = c.fold_residual_sums == "on";
  t.fuse_residual_bn_backward = c.fuse_residual_bn_backward == "on";
  t.relu_masks = c.relu_mask == "on";
  t.fuse_shortcut_bn_backward = c.fuse_shortcut_bn_backward == "on";
  t.recompute_bn_relu = c.recompute == "bn-relu";
  t.recompute_budget_bytes = c.recompute_budget;
  c.gpu.apply(t, "");
  // The plan against the memory first: a batch that cannot fit is refused before its synthetic data is written.
  RN_CHECK_CTX(probe.num_classes >= 1 && probe.num_classes <= io::kMaxClasses, bp.name,
               "{} classes: a dataset (bench's synthetic batch too) has at most {}", probe.num_classes,
               io::kMaxClasses);
  // At least 64 values per channel, in whole batches: a batch of 1 image of 1x1 pixels had one value per channel,
  // whose standard deviation of 0 the dataset refused to normalise (bench rejected its own synthetic data). Whole
  // batches, so no partial-batch variant is planned; images of 8x8 and more need no more than the batch.
  const std::int64_t pixels = std::max<std::int64_t>(bp.in_h * bp.in_w, 1);
  const std::int64_t images = (64 + pixels - 1) / pixels;
  const std::int64_t samples = (std::max(images, c.batch) + c.batch - 1) / c.batch * c.batch;
  runtime::Trainer::check_memory(bp, t, samples, 1);
  // A synthetic dataset of one batch (or a few, above), in a private temporary directory, removed however the run
  // ends.
  std::error_code tec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(tec);
  RN_CHECK_CTX(!tec, std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
               "bench: no temporary directory for its synthetic batch: {} (hint: set TMPDIR to a writable directory)",
               tec.message());
  const TempDir dir(tmp / fmt::format("renaissance-bench-{}", ::getpid()));
  t.data_path = (dir.path / "synthetic.h5").string();
  io::make_synthetic(t.data_path, samples, 1, bp.in_h, bp.in_w, bp.in_c, static_cast<int>(probe.num_classes), 1);
  runtime::BenchResult r;
  runtime::ProfileResult prof;
  std::map<std::string, runtime::PassTraffic> traffic;  // --profile: the fused passes' compulsory bytes a step, per label
  runtime::StartupTimes startup;
  std::int64_t device_used = -1;
  int recomputed = 0;  // values the plan recomputes (--recompute bn-relu, within --recompute-budget)
  const auto t_start = std::chrono::steady_clock::now();
  double startup_s = 0;
  // Every warm-up, timed and profiled step is a collective: ranks given other counts would pair one rank's gradient
  // all-reduce with another's agreement (a truncated message, or a hang).
  t.command_settings = fmt::format(
      "bench warmup={}\nbench steps={}\nbench graphs={}\nbench profile={}\n"
      "bench profile steps={}\ncpu winograd={}\n{}",
      c.warmup, c.steps, c.graphs, c.profile, c.profile ? c.profile_steps : 0,
      t.backend == runtime::Backend::CPU && runtime::cpu_winograd_requested(),
      t.backend == runtime::Backend::CPU ? cpu_kernel_env_settings() : "");
  {
    runtime::Trainer trainer(bp, t);
    startup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    startup = trainer.startup();
    if (t.recompute_bn_relu) recomputed = trainer.plan().config.recompute_limit;
    r = trainer.benchmark(c.warmup, c.steps, c.graphs == "on");
    // Everything is allocated at start-up, so what is in use now is the peak: arena, workspace, library state.
    if (t.backend == runtime::Backend::CUDA) {
      std::int64_t free_b = 0, total_b = 0;
      runtime::cuda_device_memory(&free_b, &total_b);
      device_used = total_b - free_b;
    }
    // After the timed steps, on their own: the profile runs node by node, so it never touches the figures above.
    if (c.profile) {
      prof = trainer.profile(0, c.profile_steps);
      traffic = runtime::fused_pass_traffic(trainer.plan(), startup.engines_stats > 0);
    }
  }
  if (!is_root_rank()) return;
  const double per_rank = r.images_per_s / static_cast<double>(r.ranks);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const std::int64_t host_peak = static_cast<std::int64_t>(ru.ru_maxrss) * 1024;
  if (c.json) {
    JsonWriter j;
    j.begin_object().kv("model", bp.name).kv("device", runtime::backend_name(t.backend)).kv("batch", c.batch);
    j.kv("resolution", bp.in_h).kv("amp", c.amp).kv("graphs", c.graphs == "on").kv("warmup", c.warmup);
    j.kv("fused_kernels", c.fused_kernels == "on").kv("streams", t.concurrent_streams);
    j.kv("fold_residual_sums", c.fold_residual_sums == "on")
        .kv("fuse_residual_bn_backward", c.fuse_residual_bn_backward == "on")
        .kv("relu_mask", c.relu_mask == "on")
        .kv("fuse_shortcut_bn_backward", c.fuse_shortcut_bn_backward == "on")
        .kv("recompute", c.recompute);
    j.kv("recompute_budget_bytes", c.recompute_budget).kv("recomputed", recomputed);
    if (t.backend == runtime::Backend::CPU)
      j.kv("cpu_winograd", runtime::cpu_winograd()).kv("cpu_vector_isa", runtime::cpu_vector_isa());
    j.kv("steps", c.steps).kv("images_per_s", r.images_per_s).kv("ms_per_step", r.ms_per_step);
    j.kv("ranks", r.ranks).kv("images_per_s_per_rank", per_rank);
    j.kv("arena_bytes", r.arena_bytes).kv("captures", r.captures).kv("host_peak_bytes", host_peak);
    j.kv("deterministic", t.deterministic).kv("conv_api", c.gpu.conv_api).kv("own_kernels", t.own_kernels != 0);
    j.kv("conv_stats", t.conv_stats);
    j.kv("startup_s", startup_s).kv("startup_compile_s", startup.compile_s).kv("startup_engines_s", startup.engines_s);
    j.kv("startup_capture_s", startup.capture_s).kv("startup_init_s", startup.init_s);
    j.kv("startup_device_s", startup.device_s).kv("startup_data_s", startup.data_s);
    j.kv("engines_cached", startup.engines_cached).kv("engines_chosen", startup.engines_chosen);
    j.kv("engines_legacy", startup.engines_legacy).kv("engines_own", startup.engines_own);
    j.kv("engines_conv_stats", startup.engines_stats);
    if (device_used >= 0) j.kv("device_used_bytes", device_used);
    if (c.profile) {
      j.kv("profile_steps", prof.steps).kv("profile_total_ms_per_step", prof.total_ms_per_step);
      j.kv("profile_wall_ms_per_step", prof.wall_ms_per_step);
      json_profile_rows(j, "profile", prof.kernels, &traffic);
      json_profile_rows(j, "profile_graphs", prof.graphs);
      json_profile_rows(j, "profile_graph_kernels", prof.graph_kernels);
      json_profile_rows(j, "profile_nodes", prof.details);
    }
    j.end_object();
    std::puts(j.str().c_str());
    return;
  }
  std::printf("%s  batch %lld  %lldx%lld  %s%s  amp %s  graphs %s  (%lld warm-up + %lld timed steps)\n",
              bp.name.c_str(), static_cast<long long>(c.batch), static_cast<long long>(bp.in_h),
              static_cast<long long>(bp.in_w), runtime::backend_name(t.backend),
              t.backend == runtime::Backend::CPU && runtime::cpu_winograd() ? " (Winograd)" : "", c.amp ? "on" : "off",
              c.graphs.c_str(), static_cast<long long>(c.warmup), static_cast<long long>(c.steps));
  if (r.ranks > 1)
    std::printf("  %lld ranks x batch %lld: %.1f images/s per rank\n", static_cast<long long>(r.ranks),
                static_cast<long long>(c.batch / r.ranks), per_rank);
  std::printf("  %.1f images/s   %.3f ms/step   arena %.1f MiB   %lld captures", r.images_per_s, r.ms_per_step,
              static_cast<double>(r.arena_bytes) / (1 << 20), static_cast<long long>(r.captures));
  if (device_used >= 0) std::printf("   device memory in use %.1f MiB", static_cast<double>(device_used) / (1 << 20));
  std::printf("   host peak RSS %.1f MiB\n", static_cast<double>(host_peak) / (1 << 20));
  std::printf(
      "  start-up %.2f s: compile %.3f s, engines %.2f s (%lld from the cache, %lld chosen, %lld on the legacy "
      "API, %lld on own kernels), capture %.2f s, init %.2f s%s\n",
      startup_s, startup.compile_s, startup.engines_s, static_cast<long long>(startup.engines_cached),
      static_cast<long long>(startup.engines_chosen), static_cast<long long>(startup.engines_legacy),
      static_cast<long long>(startup.engines_own), startup.capture_s, startup.init_s,
      t.deterministic ? "" : "  (--deterministic off)");
  if (!c.profile) return;
  std::printf("\nprofile: %lld steps run node by node (un-captured; launch gaps included: for where the time goes, "
              "not throughput)\n",
              static_cast<long long>(prof.steps));
  std::printf("  %.4f ms/step in kernels, %.4f ms/step wall (%.1f%% host work and gaps outside the kernels)\n",
              prof.total_ms_per_step, prof.wall_ms_per_step,
              prof.wall_ms_per_step > 0 ? 100.0 * (1.0 - prof.total_ms_per_step / prof.wall_ms_per_step) : 0.0);
  print_profile_table("subgraph", prof.graphs, false);
  print_profile_table("kernel", prof.kernels, true, &traffic);
  if (!prof.details.empty()) {
    // Every convolution pass on its own row (all of them: which layers fell back to the legacy API shows here).
    std::printf("\n  %-72s %-16s %10s\n", "convolution pass [engine]", "kernel", "ms/step");
    for (const runtime::ProfileRow& x : prof.details)
      std::printf("  %-72s %-16s %10.4f\n", x.label.c_str(), x.graph.c_str(), x.ms_per_step);
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto c = std::make_shared<BenchCli>();
  CLI::App* cmd = app.add_subcommand("bench", "Time training steps on synthetic data (images/s, ms/step, memory)");
  c->model.add_to(*cmd);
  cmd->add_option("--batch", c->batch, "Global batch size (each of N ranks steps batch/N)")->capture_default_str();
  // Checked while parsing, before the start-up (it failed after it, naming no option, or ran for ever at 2^63).
  cmd->add_option("--warmup", c->warmup, "Warm-up steps (not timed; the first captures happen here)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(0), std::int64_t(1) << 30));
  cmd->add_option("--steps", c->steps, "Timed steps")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 30));
  cmd->add_flag("--amp", c->amp, "FP16 storage, fused layers, dynamic loss scaling");
  cmd->add_option("--graphs", c->graphs, "on: replay captured graphs; off: launch node by node")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--fused-kernels", c->fused_kernels,
                  "on: the compiler's fused passes in fused layers (BN-apply + add + ReLU in one pass, FP32 and AMP); "
                  "off: one kernel per part")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--cpu-winograd", c->cpu_winograd,
                  "CPU: oneDNN's Winograd kernels for the 3x3 stride-1 layers of 16k channels (faster on AVX-512, "
                  "~3x the direct kernels' rounding error; off: the direct kernels only, as PyTorch runs them; "
                  "default: RENAISSANCE_CPU_WINOGRAD, else on)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--fold-residual-sums", c->fold_residual_sums,
                  "--amp: on: a residual block's second data gradient writes its own buffer (beta = 0) and the "
                  "previous block's end ReLU backward sums both; off: that data gradient adds into the gradient")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--fuse-residual-bn-backward", c->fuse_residual_bn_backward,
                  "--amp: on: that sum's ReLU backward runs inside the backward of the BN before the sum (one "
                  "memory pass fewer per residual block end, same bits); off: a pass of its own")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  add_relu_mask_option(*cmd, c->relu_mask);
  cmd->add_option("--fuse-shortcut-bn-backward", c->fuse_shortcut_bn_backward,
                  "--amp: on: a projection block's shortcut BN backward runs inside the block end's sum+relu+bn "
                  "backward, which forms its gradient (two memory passes fewer, same bits); off: a pass of its own")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--recompute", c->recompute,
                  "bn-relu: BN -> ReLU outputs the backward reads are formed again there instead of kept (less "
                  "memory, one element-wise pass each); off: keep them")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "bn-relu"}));
  add_recompute_budget_option(*cmd, c->recompute_budget);
  cmd->add_option("--device", c->device, "cpu|cuda|auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--optimizer", c->optimizer, "sgd|momentum|nesterov|adam|adamw|lars")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam", "adamw", "lars"}));
  cmd->add_flag("--json", c->json, "Print the result as JSON");
  cmd->add_flag("--profile", c->profile,
                "After the benchmark, time every kernel of un-captured steps: tables per subgraph and per kernel");
  cmd->add_option("--profile-steps", c->profile_steps, "Steps the profile times")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 30));  // as --steps: 2^63 ran for ever
  c->gpu.add_to(*cmd);
  add_comm_timeout_option(*cmd, c->comm_timeout);
  cmd->callback([c, cmd] {
    // As train checks it: 0, a negative or a NaN timeout would abort every collective at once, or none.
    const double s = c->comm_timeout;
    RN_CHECK(cmd->count("--comm-timeout") == 0 || (std::isfinite(s) && s > 0 && s <= 1e9),
             "--comm-timeout must be a number of seconds > 0, got {}", s);
    run_bench(*c);
  });
}

}  // namespace renaissance::app
