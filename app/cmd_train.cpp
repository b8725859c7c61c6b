// `renaissance train`: train a model on an HDF5 dataset through the static plan.
#include "checkpoint_options.h"
#include "cli_errors.h"
#include "commands.h"
#include "environment.h"
#include "gpu_options.h"
#include "json_writer.h"
#include "model_options.h"
#include "preflight.h"
#include "progress.h"
#include "run_config.h"

#include <renaissance/comm/communicator.h>
#include <renaissance/comm/watchdog.h>
#include <renaissance/core/error.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/importers.h>
#include <renaissance/io/tensorboard.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/devices.h>
#include <renaissance/runtime/trainer.h>

#include <fmt/format.h>
#include <renaissance/core/log.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>

namespace renaissance::app {

namespace {

constexpr const char* kDefaultData = "data/fashion-mnist.h5";

struct TrainCli {
  ModelOptions model;
  runtime::TrainOptions t;
  std::string data = kDefaultData;
  std::string optimizer = "nesterov";
  std::string schedule = "onecycle";
  std::string device = "auto";
  std::string metrics;
  std::string config;
  std::map<std::string, int> from_config;  ///< the keys --config set, with their lines (apply_run_config)
  std::string save;
  bool no_flip = false;
  std::string tta = "off";
  bool no_validate = false;
  std::string validate = "epoch";  ///< --validate epoch|last|off
  std::optional<double> onecycle_pct, onecycle_div;  ///< --onecycle-pct, --onecycle-div (onecycle only)
  std::string onecycle_momentum = "off";             ///< --onecycle-momentum off|BASE,MAX (onecycle only)
  std::string crop = "none";
  std::string data_cache = "auto";
  std::string decode = "auto";
  std::string fused_kernels = "on";
  std::string recompute = "off";
  std::int64_t recompute_budget = 0;
  std::string relu_mask = "on";
  std::string cpu_winograd;  ///< on|off; empty: RENAISSANCE_CPU_WINOGRAD, else on
  std::string crop_scale = "0.08,1";
  std::string crop_ratio = "0.75,1.3333333333333333";
  double comm_timeout = 0;
  std::int64_t log_every = 0;  ///< --log-every: a heartbeat line every N steps
  std::string tensorboard;     ///< --tensorboard DIR
  std::string config_text;     ///< every option's value (TensorBoard's run/config text)
  CheckpointCli ckpt;          ///< --checkpoint-dir, --checkpoint-every, --keep, --resume, --loss-log
  GpuOptions gpu;              ///< --deterministic, --engine-cache, --conv-api
};

/// The run's identifier in the metrics JSONL: the Slurm job id (the same across requeues, whose lines append to the
/// same file), else UTC start time, host and process id.
std::string make_run_id() {
  if (const char* job = std::getenv("SLURM_JOB_ID"); job && *job) return fmt::format("slurm-{}", job);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
  return fmt::format("{}-{}-{}", when, host, getpid());
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// The epoch's scalars for TensorBoard (tags grouped as train/, val/, opt/, perf/).
std::vector<std::pair<std::string, double>> epoch_scalars(const runtime::EpochMetrics& m, bool validated) {
  std::vector<std::pair<std::string, double>> v = {{"train/loss", m.train_loss}, {"train/top1", m.train_top1}};
  if (validated) {
    v.insert(v.end(), {{"val/loss", m.val_loss}, {"val/top1", m.val_top1}, {"val/top5", m.val_top5}});
    if (m.ema_val_top1 >= 0) v.emplace_back("val/ema_top1", m.ema_val_top1);
    if (m.tta_val_top1 >= 0) v.insert(v.end(), {{"val/tta_top1", m.tta_val_top1}, {"val/tta_loss", m.tta_val_loss}});
  }
  v.insert(v.end(), {{"opt/lr", m.lr},
                     {"opt/loss_scale", m.loss_scale},
                     {"perf/images_per_s", m.images_per_s},
                     {"perf/epoch_seconds", m.seconds}});
  return v;
}

std::string metrics_json(const runtime::EpochMetrics& m, bool validated, const std::string& run_id) {
  JsonWriter j;
  j.begin_object().kv("epoch", m.epoch).kv("step", m.step).kv("train_loss", m.train_loss);
  j.kv("train_top1", m.train_top1);
  if (validated) j.kv("val_loss", m.val_loss).kv("val_top1", m.val_top1).kv("val_top5", m.val_top5);
  if (m.ema_val_top1 >= 0) j.kv("ema_val_top1", m.ema_val_top1);
  if (m.tta_val_top1 >= 0) j.kv("tta_val_top1", m.tta_val_top1).kv("tta_val_loss", m.tta_val_loss);
  j.kv("images_per_s", m.images_per_s).kv("seconds", m.seconds).kv("lr", m.lr).kv("loss_scale", m.loss_scale);
  j.kv("time", unix_time()).kv("run_id", run_id);  // seconds since 1970 (UTC) when the epoch ended; see make_run_id
  j.end_object();
  return j.str();
}

/// "MIN,MAX" of two positive numbers (--crop-scale, --crop-ratio); "3/4" style fractions are accepted too.
std::pair<double, double> parse_range(const std::string& text, const char* option) {
  // strtod, not std::stod: stod throws on an underflow, so 1e-308 read as "not MIN,MAX" instead of reaching the
  // option's range check.
  auto parse = [](const std::string& t, double* v) {
    if (t.empty() || std::isspace(static_cast<unsigned char>(t[0]))) return false;
    char* end = nullptr;
    *v = std::strtod(t.c_str(), &end);
    return end == t.c_str() + t.size();
  };
  auto number = [&](const std::string& part) {
    const auto slash = part.find('/');
    double a = 0, b = 0;
    if (slash == std::string::npos) {
      if (parse(part, &a) && std::isfinite(a)) return a;
    } else if (parse(part.substr(0, slash), &a) && parse(part.substr(slash + 1), &b) && b != 0 &&
               std::isfinite(a / b)) {
      return a / b;
    }
    RN_FAIL_CTX(option, "'{}' is not MIN,MAX (e.g. 0.08,1 or 3/4,4/3)", text);
  };
  const auto comma = text.find(',');
  RN_CHECK_CTX(comma != std::string::npos, option, "'{}' is not MIN,MAX (e.g. 0.08,1 or 3/4,4/3)", text);
  return {number(text.substr(0, comma)), number(text.substr(comma + 1))};
}

void ensure_default_data(const std::string& path) {
  if (path != kDefaultData || std::filesystem::exists(path)) return;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::filesystem::create_directories(dir, ec);
  RN_CHECK_CTX(!ec, dir.string(), "--data: cannot create the directory for the default dataset {}: {} (hint: pass "
               "--data FILE)", path, ec.message());
  std::printf("importing Fashion-MNIST from %s into %s\n", io::kFashionMnistDir, path.c_str());
  io::import_fashion_mnist(path);
}

/// Options that were given (on the command line or in run.yaml) but do nothing with the others, or leave the run
/// short of what they promise: a warning each on rank 0 (they ran silently; errors would break a recipe's keys under
/// another --optimizer or --schedule on the command line).
void warn_inapplicable_options(const CLI::App& cmd, const TrainCli& c) {
  if (!is_root_rank()) return;
  auto given = [&](const char* o) { return cmd.count(o) > 0; };
  const runtime::TrainOptions& t = c.t;
  if (given("--warmup-epochs") && t.warmup_epochs > 0 && c.schedule == "onecycle")
    spdlog::warn("--warmup-epochs {} has no effect with --schedule onecycle, which rises for --onecycle-pct of the run "
                 "instead (the warm-up is for constant, step and cosine)",
                 t.warmup_epochs);
  if (given("--step-epochs") && c.schedule != "step")
    spdlog::warn("--step-epochs {} has no effect with --schedule {} (it sets the decay of --schedule step)",
                 t.step_epochs, c.schedule);
  if (given("--momentum") && (c.optimizer == "sgd" || c.optimizer == "adam" || c.optimizer == "adamw"))
    spdlog::warn("--momentum {} has no effect with --optimizer {} (it is for momentum, nesterov and lars{})",
                 t.momentum, c.optimizer, c.optimizer == "sgd" ? "" : "; adam's first moment decays by beta1 = 0.9, fixed");
  if (given("--start-resolution") && t.start_resolution > 0 && t.lowres_epochs == 0)
    spdlog::warn("--start-resolution {} has no effect without --lowres-epochs (the epochs trained at that size)",
                 t.start_resolution);
  if (t.warmup_epochs >= static_cast<double>(t.epochs) && t.warmup_epochs > 0 && c.schedule != "onecycle")
    spdlog::warn("--warmup-epochs {} >= --epochs {}: the run ends within its warm-up, and the learning rate never "
                 "reaches --lr {}",
                 t.warmup_epochs, t.epochs, t.lr);
  if (given("--ema-decay") && !t.ema)
    spdlog::warn("--ema-decay {} has no effect without --ema (no average is kept)", t.ema_decay);
  for (const char* o : {"--crop-scale", "--crop-ratio"})
    if (given(o) && c.crop != "random-resized")
      spdlog::warn("{} has no effect with --crop {} (it shapes --crop random-resized)", o, c.crop);
  if (given("--keep") && c.ckpt.dir.empty())
    spdlog::warn("--keep {} has no effect without --checkpoint-dir (no checkpoints are written)", c.ckpt.keep);
  if (given("--val-batch") && (c.no_validate || c.validate == "off"))
    spdlog::warn("--val-batch has no effect: the run does not validate");
  if (t.lowres_epochs >= t.epochs && t.start_resolution > 0)
    spdlog::warn("--lowres-epochs {} >= --epochs {}: every epoch trains at --start-resolution {}, none at the "
                 "model's resolution",
                 t.lowres_epochs, t.epochs, t.start_resolution);
}

void run_train(TrainCli& c) {
  c.t.backend = pick_backend(c.device);
  // Data-parallel under mpirun/srun (DESIGN §9): --batch is global; rank 0 prints and writes the files.
  const std::unique_ptr<runtime::Communicator> comm = comm::open_communicator(c.t.backend, c.comm_timeout);
  c.t.comm = comm.get();
  const bool root = is_root_rank();
  c.t.optimizer = plan::optimizer_from_name(c.optimizer);
  c.t.schedule = runtime::schedule_from_name(c.schedule);
  // The onecycle options without the onecycle schedule: typed on the command line, an error; set by a recipe
  // (--config) that the command line runs with another --schedule or --optimizer, a warning, and left out. A recipe
  // that sets both (schedule: cosine beside onecycle-pct) contradicts itself: the error, as on the command line.
  const auto recipe_only = [&](const char* key) { return c.from_config.count(key) > 0; };
  if (c.t.schedule != runtime::ScheduleKind::ONE_CYCLE && !recipe_only("schedule") &&
      (c.onecycle_pct || c.onecycle_div) && (!c.onecycle_pct || recipe_only("onecycle-pct")) &&
      (!c.onecycle_div || recipe_only("onecycle-div"))) {
    if (root) spdlog::warn("{}: onecycle-pct/onecycle-div have no effect with --schedule {}", c.config, c.schedule);
    c.onecycle_pct.reset();
    c.onecycle_div.reset();
  }
  const bool momentum_optimizer = c.t.optimizer == plan::OptimizerKind::MOMENTUM ||
                                  c.t.optimizer == plan::OptimizerKind::NESTEROV ||
                                  c.t.optimizer == plan::OptimizerKind::LARS;
  if (c.onecycle_momentum != "off" && recipe_only("onecycle-momentum") &&
      ((c.t.schedule != runtime::ScheduleKind::ONE_CYCLE && !recipe_only("schedule")) ||
       (!momentum_optimizer && !recipe_only("optimizer")))) {
    if (root)
      spdlog::warn("{}: onecycle-momentum has no effect with --schedule {} --optimizer {}", c.config, c.schedule,
                   c.optimizer);
    c.onecycle_momentum = "off";
  }
  RN_CHECK(c.t.schedule == runtime::ScheduleKind::ONE_CYCLE || (!c.onecycle_pct && !c.onecycle_div),
           "--onecycle-pct and --onecycle-div shape the onecycle schedule: they need --schedule onecycle (got {})",
           c.schedule);
  if (c.onecycle_pct) {
    RN_CHECK(*c.onecycle_pct > 0.0 && *c.onecycle_pct < 1.0, "--onecycle-pct must lie strictly between 0 and 1, got {}",
             *c.onecycle_pct);
    c.t.onecycle_pct = *c.onecycle_pct;
  }
  if (c.onecycle_div) c.t.onecycle_div = *c.onecycle_div;
  if (c.onecycle_momentum != "off") {
    RN_CHECK(c.t.schedule == runtime::ScheduleKind::ONE_CYCLE,
             "--onecycle-momentum cycles the momentum with the onecycle schedule: it needs --schedule onecycle "
             "(got {})",
             c.schedule);
    RN_CHECK(c.t.optimizer == plan::OptimizerKind::MOMENTUM || c.t.optimizer == plan::OptimizerKind::NESTEROV ||
                 c.t.optimizer == plan::OptimizerKind::LARS,
             "--onecycle-momentum cycles the momentum of momentum, nesterov and lars; --optimizer {} has none",
             c.optimizer);
    std::pair<double, double> range;
    try {
      range = parse_range(c.onecycle_momentum, "--onecycle-momentum");
    } catch (const Error&) {
      RN_FAIL("--onecycle-momentum takes off or BASE,MAX (e.g. 0.85,0.95), got '{}'", c.onecycle_momentum);
    }
    const auto [base, max] = range;
    // As the kernels hold them (floats): 0.99999999 passed as a double and became a momentum of 1.0f.
    RN_CHECK(base >= 0.0 && base <= max && static_cast<float>(max) < 1.0f,
             "--onecycle-momentum {}: needs 0 <= BASE <= MAX < 1 (the momentum at the peak rate, then at the ends)",
             c.onecycle_momentum);
    c.t.onecycle_momentum = true;
    c.t.onecycle_base_momentum = base;
    c.t.onecycle_max_momentum = max;
  }
  c.t.augmentation.horizontal_flip = !c.no_flip;
  c.t.tta_flip = c.tta == "flip";
  if (c.no_validate) c.validate = "off";
  RN_CHECK(!c.t.tta_flip || c.validate != "off",
           "--tta flip scores the validation: it needs validation (--validate epoch or last, no --no-validate)");
  c.t.augmentation.crop = io::parse_crop_mode(c.crop);
  c.t.data_cache = runtime::parse_data_cache(c.data_cache);
  c.t.decode = runtime::parse_decode(c.decode);
  {
    const auto [smin, smax] = parse_range(c.crop_scale, "--crop-scale");
    const auto [rmin, rmax] = parse_range(c.crop_ratio, "--crop-ratio");
    c.t.augmentation.scale_min = smin;
    c.t.augmentation.scale_max = smax;
    c.t.augmentation.ratio_min = rmin;
    c.t.augmentation.ratio_max = rmax;
  }
  c.t.validate = c.validate != "off";
  c.t.validate_each_epoch = c.validate == "epoch";
  RN_CHECK(c.t.validate_each_epoch || c.ckpt.keep_best.empty(),
           "--keep-best val_top1 compares every epoch's validation: it needs --validate epoch");
  if (!c.cpu_winograd.empty()) runtime::set_cpu_winograd(c.cpu_winograd == "on");
  c.t.fuse_kernels = c.fused_kernels == "on";
  c.t.recompute_bn_relu = c.recompute == "bn-relu";
  c.t.recompute_budget_bytes = c.recompute_budget;
  c.t.relu_masks = c.relu_mask == "on";
  RN_CHECK(c.t.epochs >= 1, "--epochs must be >= 1, got {}", c.t.epochs);
  RN_CHECK(c.t.batch >= 1, "--batch must be >= 1, got {}", c.t.batch);
  // The model and the checkpoint options first: a bad one stops the run before the default data set is imported.
  const blueprint::BluePrint bp = c.model.load();
  c.ckpt.apply(c.t);
  if (root) ensure_default_data(c.data);
  barrier(comm.get());  // the other ranks read what rank 0 imported
  c.t.data_path = c.data;
  const std::string run_dir = !c.t.checkpoint_dir.empty() ? c.t.checkpoint_dir
                              : !c.save.empty()           ? std::filesystem::path(c.save).parent_path().string()
                                                          : std::string();
  c.gpu.apply(c.t, run_dir.empty() && !c.save.empty() ? "." : run_dir);
  const TrainPreflight preflight = preflight_train({c.data, c.model.model_file, c.config, c.ckpt.resume, c.save,
                                                    c.metrics, c.ckpt.loss_log, c.ckpt.dir, c.tensorboard},
                                                   c.t, root);
  // The checkpoint to resume is read first: the Trainer matches it against the plan before its device start-up.
  std::string skipped;  // what --resume auto passed over here, named if the ranks disagree
  std::unique_ptr<runtime::InitialState> resume = c.ckpt.read_resume(root, &skipped);
  // Every rank reads the checkpoint it resumes from: one that found another (node-local directories, another
  // --resume file) or none would train other replicas under averaged gradients and blend their metrics.
  require_same_on_ranks(
      comm.get(), [&] { return state_fingerprint(resume.get()); }, "the checkpoint to resume from",
      (resume ? resume->path : std::string("(none found: a fresh start)")) + skipped,
      "give every rank the same checkpoint: one --checkpoint-dir on a shared file system, or the same --resume file");
  // Rank 0 writes the outputs: one named on another rank only would be dropped, so the ranks agree on which exist.
  auto given = [](const std::string& path) { return path.empty() ? "none" : "given"; };
  // The CPU convolutions' setting too (not whether this CPU has the kernels: nodes may differ): Winograd asked for on
  // one rank and not on another computed each rank's gradients with other rounding.
  const bool cpu = c.t.backend == runtime::Backend::CPU;
  c.t.command_settings = fmt::format("save={}\nmetrics={}\nloss log={}\ntensorboard={}\ncpu winograd={}\n{}",
                                     given(c.save), given(c.metrics), given(c.ckpt.loss_log), given(c.tensorboard),
                                     cpu && runtime::cpu_winograd_requested(), cpu ? cpu_kernel_env_settings() : "");
  runtime::Trainer trainer(bp, c.t, resume.get());
  const bool resumed = resume != nullptr;
  if (resumed && root)
    std::printf("resumed from %s at step %lld\n", resume->path.c_str(), static_cast<long long>(trainer.steps()));
  std::fflush(stdout);
  resume.reset();  // the host copy of the tensors
  {
    // Room for the outputs, now that their size is known: rank 0 writes them, every rank stops alike.
    // At most --keep checkpoints and the one being written, or as many as the run can write (every N steps up to
    // --max-steps, or one an epoch; the last and a preemption's one more); with --keep-best, best.h5 and its
    // replacement too.
    std::int64_t writes = c.ckpt.keep + 1;
    if (c.t.checkpoint_every > 0 && c.t.max_steps > 0)
      writes = (std::max<std::int64_t>(0, c.t.max_steps - trainer.steps()) + c.t.checkpoint_every - 1) /
                   c.t.checkpoint_every +
               1;
    else if (c.t.checkpoint_every == 0 && c.t.checkpoint_each_epoch)
      writes = c.t.epochs + 1;
    const int files = static_cast<int>(std::min<std::int64_t>(c.ckpt.keep + 1, writes) +
                                       (c.ckpt.keep_best.empty() ? 0 : std::min<std::int64_t>(2, writes)));
    const std::string no_room = root ? check_room_for_outputs(c.save, trainer.file_tensor_bytes(false), c.ckpt.dir,
                                                              trainer.file_tensor_bytes(true), files)
                                     : std::string();
    const bool refused = comm ? comm->agree_max(no_room.empty() ? 0 : 1) != 0 : !no_room.empty();
    RN_CHECK(!refused, "{}", root ? no_room : "rank 0 has no room for the run's outputs (see its error)");
  }
  if (root && comm)
    std::printf("data-parallel: %d ranks x %lld samples per step (global batch %lld)%s\n", comm->world_size(),
                static_cast<long long>(c.t.batch / comm->world_size()), static_cast<long long>(c.t.batch),
                c.t.backend == runtime::Backend::CUDA
                    ? "; gradients all-reduced by NCCL inside the captured step graphs, bucket 1 beside the first "
                      "layer's backward"
                    : "");
  // On the CPU: the kernel threads of each rank (its affinity mask, or RENAISSANCE_CPU_THREADS), for Slurm logs.
  const std::string threads =
      c.t.backend == runtime::Backend::CPU
          ? fmt::format(", {} CPU threads{}", runtime::cpu_threads(), runtime::cpu_winograd() ? ", Winograd" : "")
          : std::string();
  const std::string bound =
      c.t.max_steps > 0 ? fmt::format(" (at most {} steps: --max-steps)", c.t.max_steps) : std::string();
  if (root)
    std::printf("training %s on %s: %lld parameters, arena %.1f MiB, %lld epochs%s, batch %lld, %s, lr %g (%s)%s\n",
                bp.name.c_str(), c.data.c_str(), static_cast<long long>(trainer.plan().arch.parameter_count()),
                static_cast<double>(trainer.plan().arena_bytes()) / (1 << 20), static_cast<long long>(c.t.epochs),
                bound.c_str(), static_cast<long long>(c.t.batch), c.optimizer.c_str(), c.t.lr, c.schedule.c_str(),
                threads.c_str());
  std::fflush(stdout);
  std::shared_ptr<RunLog> metrics;
  if (!c.metrics.empty() && root) metrics = std::make_shared<RunLog>(c.metrics, "--metrics", resumed, trainer.steps());
  const std::string run_id = make_run_id();
  std::unique_ptr<io::TensorBoardWriter> tb;
  if (!c.tensorboard.empty() && root) {
    tb = std::make_unique<io::TensorBoardWriter>(c.tensorboard);
    // Points past the checkpoint that a killed run wrote are written again from here: TensorBoard drops the old ones.
    // A run asked to resume that found no checkpoint starts again from step 0: a killed attempt's points all go.
    if (resumed)
      tb->session_start(trainer.steps() + 1);
    else if (!c.ckpt.resume.empty())
      tb->session_start(0);
    tb->text(trainer.steps(), "run/config",
             fmt::format("run `{}`, model `{}`, data `{}`\n\n```\n{}```", run_id, bp.name, c.data, c.config_text));
    std::printf("tensorboard: %s (tensorboard --logdir %s)\n", tb->path().c_str(), c.tensorboard.c_str());
  }
  ProgressOptions po;
  po.epochs = c.t.epochs;
  po.max_steps = c.t.max_steps;
  po.start_step = trainer.steps();
  po.batch = c.t.batch;
  po.log_every = c.log_every;
  // Open MPI gives each rank a pseudo-terminal of mpirun's, also when mpirun's own output goes to a log: the bar's
  // redraws (\r, ESC[K) filled `mpirun ... > run.log`. Its ranks print epoch lines. (srun's ranks write to a pipe, and
  // `srun --pty bash` is a real terminal, which keeps the bar.)
  po.tty = isatty(fileno(stdout)) != 0 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr;
  Progress progress(po);
  // Per-step losses for TensorBoard: every --log-every steps, else every 50 (each read is a host synchronisation).
  const std::int64_t tb_every = c.log_every > 0 ? c.log_every : 50;
  runtime::TrainObserver obs;
  obs.on_step = [&](std::int64_t e, std::int64_t b, std::int64_t n, double ips) {
    if (root) progress.step(e, b, n, ips);
  };
  obs.on_epoch = [&](const runtime::EpochMetrics& m) {
    if (root) progress.epoch(m);
    if (metrics) metrics->write(metrics_json(m, m.validated, run_id), fmt::format("epoch {}", m.epoch));
    if (tb) tb->scalars(m.step, epoch_scalars(m, m.validated));
  };
  c.ckpt.observe(obs, root, resumed, trainer);
  // The loss of a step is read back (a host sync) only where someone uses it: the loss log (every step), the bar's
  // redraws and heartbeats, TensorBoard's per-step curve.
  const bool every_step_loss = static_cast<bool>(obs.on_step_loss);
  auto loss_log = obs.on_step_loss;
  obs.on_step_loss = [&, loss_log](std::int64_t step, std::int64_t epoch, double loss) {
    if (loss_log) loss_log(step, epoch, loss);
    if (!root) return;
    if (every_step_loss || progress.wants_loss(step)) progress.loss(step, epoch, loss);
    if (tb && step % tb_every == 0) tb->scalar(step, "train/step_loss", loss);
  };
  obs.wants_step_loss = [&, every_step_loss](std::int64_t step) {
    // The same answer on every rank: a data-parallel loss read-back synchronises only this rank's device, but keep
    // the ranks' work alike.
    return every_step_loss || progress.wants_loss(step) || (!c.tensorboard.empty() && step % tb_every == 0);
  };
  std::vector<runtime::EpochMetrics> history;
  try {
    history = trainer.run(obs);
  } catch (const std::exception& e) {
    // Preempted, and the checkpoint could not be written (a full disk): still 75, so the job is requeued and resumes
    // from the previous checkpoint, which the failed write left in place. Not when the run diverged: a requeued job
    // would diverge again.
    if (trainer.preempted() && !dynamic_cast<const runtime::DivergedError*>(&e)) {
      std::fprintf(stderr, "renaissance: error: %s\n", e.what());
      // The error may have come after this step's checkpoint (a --metrics line that could not be written).
      const bool written = !trainer.last_checkpoint().empty() &&
                           std::filesystem::path(trainer.last_checkpoint()).filename() ==
                               io::checkpoint_file_name(trainer.steps());
      if (root && written)
        std::fprintf(stderr, "renaissance: preempted; the checkpoint of step %lld is written (%s); exit %d (requeue: "
                             "the run resumes from it)\n",
                     static_cast<long long>(trainer.steps()), trainer.last_checkpoint().c_str(), kExitPreempted);
      else if (std::error_code ec;
               root && std::filesystem::exists(std::filesystem::path(c.ckpt.dir) / io::kLatestCheckpoint, ec))
        std::fprintf(stderr,
                     "renaissance: preempted, but this checkpoint could not be written: the previous one in %s "
                     "stays; exit %d (requeue: the run resumes from it)\n",
                     c.ckpt.dir.c_str(), kExitPreempted);
      else if (root)  // it named a previous checkpoint where there was none
        std::fprintf(stderr,
                     "renaissance: preempted, but this checkpoint could not be written, and %s holds none of this "
                     "run yet; exit %d (requeue: the run starts again from its beginning)\n",
                     c.ckpt.dir.c_str(), kExitPreempted);
      set_exit_code(kExitPreempted);
      return;
    }
    throw;
  }
  if (trainer.preempted()) {  // every rank: the checkpoint is written, the job script requeues on this code
    c.ckpt.report_preempted(trainer, root);
    set_exit_code(kExitPreempted);
    return;
  }
  if (!root) return;
  if (!history.empty() && history.back().validated) {
    const runtime::EpochMetrics& last = history.back();
    const std::string tta =
        last.tta_val_top1 >= 0 ? fmt::format(", with flip test-time augmentation {:.4f}", last.tta_val_top1) : "";
    std::printf("done: %lld steps, val_top1 %.4f%s\n", static_cast<long long>(trainer.steps()), last.val_top1,
                tta.c_str());
  } else {
    std::printf("done: %lld steps\n", static_cast<long long>(trainer.steps()));
  }
  if (!c.save.empty()) {
    trainer.save_weights(c.save);
    std::printf("weights saved to %s\n", c.save.c_str());
  }
}

struct EvalCli {
  ModelOptions model;
  std::string data = kDefaultData;
  std::string weights;
  std::string checkpoint;  ///< a checkpoint instead of --weights (its model unless --model/--model-file is given)
  bool model_given = false;
  std::int64_t batch = 256;
  bool batch_given = false;
  bool amp = false;
  bool ema = false;
  bool json = false;
  std::string device = "auto";
  std::string tta = "off";
  std::int64_t val_resize = -1;  ///< -1: the file's recorded one (else 0, size/0.875)
  double comm_timeout = 0;       ///< --comm-timeout (its timeout message named the option, which eval refused)
};

void run_eval(const EvalCli& c) {
  runtime::TrainOptions t;
  t.data_path = c.data;
  t.backend = pick_backend(c.device);
  // Under mpirun/srun the val batches are dealt over the ranks and the sums all-reduced; rank 0 prints.
  const std::unique_ptr<runtime::Communicator> comm = comm::open_communicator(t.backend, c.comm_timeout);
  t.comm = comm.get();
  t.batch = c.batch;
  // The default batch over ranks that do not divide it (`mpirun -np 3 renaissance eval`): the nearest multiple below,
  // since scoring is the same at any batch; a --batch typed is taken as it is (and must divide).
  if (const int world = comm ? comm->world_size() : 1; !c.batch_given && world > 1)
    t.batch = std::max<std::int64_t>(world, c.batch / world * world);
  t.amp = c.amp;
  t.ema = c.ema;
  t.epochs = 1;
  t.inference_only = true;
  // In the options the ranks compare (--tta flip given to one rank only ran its passes there, unreported).
  t.tta_flip = c.tta == "flip";
  RN_CHECK(c.weights.empty() != c.checkpoint.empty(), "eval needs exactly one of --weights and --checkpoint");
  // The checkpoint's recorded model: --resolution and --classes apply to --model/--model-file only (they were
  // ignored without a word here).
  RN_CHECK(
      c.checkpoint.empty() || c.model_given || (c.model.resolution == 0 && c.model.classes == 0),
      "--resolution and --classes shape --model or --model-file; with --checkpoint alone the checkpoint's recorded "
      "model is scored as it was trained: leave them out, or pass the model too");
  blueprint::BluePrint bp = c.model.load();
  // Read and verified, then matched against the plan before the Trainer times its engines: a corrupt or wrong file
  // costs no start-up.
  auto initial = std::make_unique<runtime::InitialState>();
  if (c.checkpoint.empty()) {
    io::WeightsFile weights = io::read_weights(c.weights);
    if (c.ema) weights.require_ema(c.weights);
    *initial = runtime::InitialState::of_weights(std::move(weights), c.weights);
  } else {
    io::Checkpoint ck = io::read_checkpoint(c.checkpoint);
    // Its recorded YAML is checked with --model too (a checkpoint inspect calls INVALID was scored with --model).
    std::optional<blueprint::BluePrint> recorded = checkpoint_model(ck, c.checkpoint, !c.model_given);
    if (!c.model_given) bp = std::move(*recorded);
    *initial = runtime::InitialState::of_checkpoint(std::move(ck), c.checkpoint, /*weights_only=*/true);
  }
  t.augmentation.val_resize = scoring_val_resize(c.val_resize, *initial);
  // Under mpirun/srun the val batches are dealt over the ranks: every rank must score the same images with the same
  // weights, or the sums blend two evaluations under rank 0's file names.
  const io::DatasetFile data(c.data);
  require_same_on_ranks(
      comm.get(), [&] { return data.content_fingerprint(); }, "the dataset's content", c.data,
      "give every rank the same dataset file (copy it again, or use a shared path)");
  // Labels out of range before any inference, as train checks them (they stopped the scoring after its whole pass,
  // naming a batch); after the agreement, so every rank has the same labels and says the same error.
  data.validate_labels(io::Split::val);
  require_same_on_ranks(
      comm.get(), [&] { return state_fingerprint(initial.get()); }, "the content of the weights", initial->path,
      "give every rank the same weights or checkpoint file");
  runtime::Trainer trainer(bp, t, initial.get());
  initial.reset();  // the host copy of the tensors (a checkpoint's optimizer moments too), not needed from here
  const std::string& source = c.checkpoint.empty() ? c.weights : c.checkpoint;
  const runtime::EpochMetrics m = trainer.evaluate(c.ema);
  const bool tta = c.tta == "flip";
  const runtime::Trainer::TtaResult flip = tta ? trainer.evaluate_flip_tta(c.ema) : runtime::Trainer::TtaResult{};
  if (!is_root_rank()) return;
  // Scored as it is (the top-1 still counts), but not silently: logits that overflowed (FP16 holds at most 65504) or
  // weights that diverged make the loss NaN or inf.
  if (!std::isfinite(m.val_loss))
    spdlog::warn(
        "the validation loss is {}: some logits are not finite ({}); the accuracies are counted as usual (a "
        "NaN logit is never correct)",
        m.val_loss, c.amp ? "with --amp they overflowed FP16: evaluate without --amp" : "the weights diverged?");
  if (c.json) {
    JsonWriter j;
    j.begin_object()
        .kv("model", bp.name)
        .kv("data", c.data)
        .kv(c.checkpoint.empty() ? "weights" : "checkpoint", source);
    j.kv("ema", c.ema);
    j.kv("val_loss", m.val_loss).kv("val_top1", m.val_top1).kv("val_top5", m.val_top5);
    if (tta) j.kv("tta_val_top1", flip.top1).kv("tta_val_loss", flip.loss);
    j.end_object();
    std::puts(j.str().c_str());
  } else {
    const std::string with_tta =
        tta ? fmt::format("; flip test-time augmentation: loss {:.4f}  top1 {:.4f}", flip.loss, flip.top1) : "";
    std::printf("%s on %s (val split) with %s%s: loss %.4f  top1 %.4f  top5 %.4f%s\n", bp.name.c_str(), c.data.c_str(),
                source.c_str(), c.ema ? " (EMA)" : "", m.val_loss, m.val_top1, m.val_top5, with_tta.c_str());
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto c = std::make_shared<TrainCli>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model (default: fmnist_cnn on Fashion-MNIST)");
  c->model.add_to(*cmd);
  cmd->add_option("--data", c->data, "HDF5 dataset (renaissance data import ...); the default is imported if missing")
      ->capture_default_str();
  cmd->add_option("--epochs", c->t.epochs, "Epochs")->capture_default_str();
  cmd->add_option("--batch", c->t.batch, "Global batch size")->capture_default_str();
  cmd->add_option("--val-batch", c->t.val_batch, "Validation batch size (0: --batch)");
  cmd->add_option("--optimizer", c->optimizer, "sgd|momentum|nesterov|adam|adamw|lars")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam", "adamw", "lars"}));
  cmd->add_option("--lr", c->t.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--momentum", c->t.momentum, "Momentum (SGD family, LARS)")->capture_default_str();
  cmd->add_option("--weight-decay", c->t.weight_decay, "Weight decay (not on BN/bias)")->capture_default_str();
  cmd->add_option("--schedule", c->schedule, "constant|step|cosine|onecycle")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "step", "cosine", "onecycle"}));
  cmd->add_option("--onecycle-pct", c->onecycle_pct,
                  "onecycle: the fraction of the steps over which the rate rises (PyTorch's pct_start; default 0.25)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--onecycle-div", c->onecycle_div,
                  "onecycle: the peak rate over the initial one (PyTorch's div_factor; default 25)")
      ->check(CLI::Range(1.0, 1e9));
  cmd->add_option("--onecycle-momentum", c->onecycle_momentum,
                  "onecycle: off (--momentum throughout) or BASE,MAX: the momentum falls from MAX to BASE while the "
                  "rate rises and climbs back while it falls (PyTorch OneCycleLR's cycle_momentum, its defaults "
                  "0.85,0.95); momentum, nesterov and lars")
      ->capture_default_str();
  cmd->add_option("--warmup-epochs", c->t.warmup_epochs, "Linear warm-up (constant/step/cosine)");
  cmd->add_option("--step-epochs", c->t.step_epochs, "step schedule: decay every N epochs");
  cmd->add_option("--label-smoothing", c->t.label_smoothing, "Label smoothing")->capture_default_str();
  cmd->add_option("--seed", c->t.seed, "Seed of initialisation, order and augmentation")
      ->capture_default_str()
      ->check(seed_value());
  cmd->add_flag("--zero-init-residual", c->t.zero_init_residual,
                "Start the last BN of every residual branch at gamma = 0, so each residual block starts as the "
                "identity (torchvision's zero_init_residual; Goyal et al.)");
  cmd->add_flag("--drop-last", c->t.drop_last,
                "Train only full batches: each epoch leaves out its order's last (train size mod --batch) samples, "
                "as PyTorch's drop_last (default: the partial batch is trained)");
  cmd->add_flag("--ema", c->t.ema, "Keep an EMA of the weights and validate on it too");
  cmd->add_option("--ema-decay", c->t.ema_decay, "EMA decay (step t uses min(decay, (1+t)/(10+t)))")
      ->capture_default_str();
  cmd->add_flag("--amp", c->t.amp, "FP16 storage with FP32 masters and dynamic loss scaling");
  cmd->add_option("--device", c->device, "cpu|cuda|auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--max-steps", c->t.max_steps, "Stop after N optimizer steps");
  cmd->add_option("--metrics", c->metrics, "Write one JSON object per epoch to this JSONL file");
  cmd->add_option("--crop-padding", c->t.augmentation.crop_padding, "Random crop with this zero padding (0: off)")
      ->capture_default_str();
  cmd->add_flag("--no-flip", c->no_flip, "No random horizontal flips");
  cmd->add_option("--tta", c->tta,
                  "Test-time augmentation after the last epoch: flip scores each val image by the mean of its logits "
                  "and its mirror image's (tta_val_top1, tta_val_loss in --metrics)")
      ->check(CLI::IsMember({"off", "flip"}))
      ->capture_default_str();
  cmd->add_option("--crop", c->crop,
                  "none: images as stored; random-resized: torchvision's RandomResizedCrop to the model's size; "
                  "center: the validation transform, Resize + CenterCrop (JPEG stores default to it; a copy for "
                  "images of the model's size)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "random-resized", "center"}));
  // A malformed range is a usage error (exit 2), like any other malformed value.
  auto range_check = [](const char* option, double max) {
    return CLI::Validator(
        [option, max](std::string& v) {
          try {
            const auto [lo, hi] = parse_range(v, option);
            if (!(lo > 0 && lo <= hi && hi <= max))
              return fmt::format("'{}': need 0 < MIN <= MAX{}", v, max == 1 ? " <= 1" : "");
          } catch (const std::exception&) {
            return fmt::format("'{}' is not MIN,MAX (e.g. 0.08,1 or 3/4,4/3)", v);
          }
          return std::string();
        },
        "MIN,MAX");
  };
  cmd->add_option("--crop-scale", c->crop_scale, "random-resized: area fraction MIN,MAX")
      ->capture_default_str()
      ->check(range_check("--crop-scale", 1.0));
  cmd->add_option("--crop-ratio", c->crop_ratio, "random-resized: aspect ratio MIN,MAX (w/h, log-uniform)")
      ->capture_default_str()
      ->check(range_check("--crop-ratio", std::numeric_limits<double>::infinity()));
  cmd->add_option("--val-resize", c->t.augmentation.val_resize,
                  "Validation of images not of the model's size: short side to this, then the centre crop "
                  "(0: size/0.875)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(0), std::int64_t(65535)));
  cmd->add_option("--loader-threads", c->t.loader_threads,
                  "Host threads decoding, augmenting and normalising samples (0: every CPU of the affinity mask)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--data-cache", c->data_cache,
                  "GPU, raw stores and JPEG stores with --decode gpu (decoded once at start-up): keep the images on "
                  "the device and crop, resample, shift, flip and normalise each batch there (auto: when they fit "
                  "in 25 % of the device's memory; on: or fail saying why; off: the host loader, or nvJPEG batch by "
                  "batch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "off", "on"}));
  cmd->add_option("--decode", c->decode,
                  "JPEG stores: where to decode (gpu: nvJPEG batched decode, then crop/resample/flip/normalise on "
                  "the GPU, opt-in; cpu: libjpeg-turbo on the loader threads; auto: cpu until the GPU path is known "
                  "to be bit-reproducible)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}));
  cmd->add_option("--gpu-decoders", c->t.gpu_decoders,
                  "--decode gpu: threads decoding batches ahead with nvJPEG while the step runs (1 is bit-"
                  "reproducible; with more, the JPEG engines' pixels depend on the thread that decoded a batch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--start-resolution", c->t.start_resolution,
                  "Progressive resize: train the first epochs at this size");
  cmd->add_option("--lowres-epochs", c->t.lowres_epochs, "Progressive resize: epochs at --start-resolution");
  cmd->add_option("--validate", c->validate,
                  "When to score the val split: after every epoch, only after the last one (the epochs before it "
                  "report no validation; --keep-best needs epoch), or never")
      ->capture_default_str()
      ->check(CLI::IsMember({"epoch", "last", "off"}));
  cmd->add_flag("--no-validate", c->no_validate, "Skip validation (--validate off)")->excludes("--validate");
  cmd->add_option("--save", c->save, "Write the trained weights (HDF5: /params, /bn, /ema) to this file");
  cmd->add_option("--config", c->config, "run.yaml: any of these options as keys (the command line wins)");
  c->ckpt.add_to(*cmd);
  c->gpu.add_to(*cmd);
  cmd->add_option("--log-every", c->log_every,
                  "A one-line heartbeat (step, running loss, img/s, ETA) every N steps, for logs that are not a "
                  "terminal (Slurm); 0: none")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(0), std::int64_t(1) << 53));  // (NonNegativeNumber printed a 309-digit bound)
  cmd->add_option("--tensorboard", c->tensorboard,
                  "Write TensorBoard event files into this directory (losses, accuracies, lr, loss scale, img/s, "
                  "the run's options)")
      ->check(CLI::Validator(
          [](std::string& dir) -> std::string {
            return dir.empty() ? "needs a directory (an empty path wrote no events without a word)" : "";
          },
          ""));
  add_comm_timeout_option(*cmd, c->comm_timeout);
  cmd->add_option("--fused-kernels", c->fused_kernels,
                  "on: the compiler's fused passes (BN+ReLU, BN+add+ReLU, ReLU+BN backward; `plan --nodes` lists "
                  "them); off: every fused layer runs its plain parts")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--recompute", c->recompute,
                  "bn-relu: each BN -> ReLU output the backward reads is formed again there from the BN's input and "
                  "saved statistics instead of kept from the forward (less memory at the peak, one element-wise pass "
                  "each, the same results bit for bit); off: keep them")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "bn-relu"}));
  add_recompute_budget_option(*cmd, c->recompute_budget);
  add_relu_mask_option(*cmd, c->relu_mask);
  cmd->add_option("--cpu-winograd", c->cpu_winograd,
                  "CPU: oneDNN's Winograd kernels for the 3x3 stride-1 layers of 16k channels (faster on AVX-512, "
                  "~3x the direct kernels' rounding error; off: the direct kernels only, as PyTorch runs them; "
                  "default: RENAISSANCE_CPU_WINOGRAD, else on)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_flag("--sync-bn", c->t.sync_bn,
                "Data-parallel runs: BatchNorm statistics over the global batch (all ranks)");
  cmd->callback([c, cmd] {
    if (!c->config.empty()) c->from_config = apply_run_config(*cmd, c->config);
    if (c->ckpt.dir.empty()) disarm_preemption_early();  // the options are read: no checkpoint directory
    check_train_numbers(*cmd, c->config, c->from_config);
    warn_inapplicable_options(*cmd, *c);
    c->config_text = cmd->config_to_str(true, false);
    run_train(*c);
  });
}

void register_eval_command(CLI::App& app) {
  auto c = std::make_shared<EvalCli>();
  CLI::App* cmd = app.add_subcommand("eval", "Score trained weights on a dataset's validation split");
  c->model.add_to(*cmd);
  cmd->add_option("--data", c->data, "HDF5 dataset")->capture_default_str();
  cmd->add_option("--weights", c->weights, "Weights file written by `renaissance train --save`");
  cmd->add_option("--checkpoint", c->checkpoint,
                  "Checkpoint written by `renaissance train --checkpoint-dir` (its model unless --model is given)");
  cmd->add_option("--batch", c->batch,
                  "Batch size (global: dealt over the ranks under mpirun/srun, where the default is rounded down to a "
                  "multiple of the rank count)")
      ->capture_default_str();
  cmd->add_flag("--amp", c->amp, "Evaluate in FP16 (FP32 accumulation)");
  cmd->add_flag("--ema", c->ema, "Evaluate the EMA weights");
  cmd->add_flag("--json", c->json, "Print the result as JSON");
  add_val_resize_option(*cmd, c->val_resize);
  add_comm_timeout_option(*cmd, c->comm_timeout);
  cmd->add_option("--tta", c->tta, "flip: also score each image by the mean of its logits and its mirror image's")
      ->check(CLI::IsMember({"off", "flip"}))
      ->capture_default_str();
  cmd->add_option("--device", c->device, "cpu|cuda|auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->callback([c, cmd] {
    c->model_given = cmd->get_option("--model")->count() > 0 || cmd->get_option("--model-file")->count() > 0;
    c->batch_given = cmd->get_option("--batch")->count() > 0;
    run_eval(*c);
  });
}

}  // namespace renaissance::app
