// The Trainer: construction, the training loop, evaluation, tensor access, logits and the device cache.
#include <renaissance/io/image.h>
#include <renaissance/plan/residual_init.h>
#include <renaissance/runtime/trainer_impl.h>

#include <unistd.h>

#include <exception>
#include <fstream>
#include <sstream>

namespace renaissance::runtime {

namespace {
/// How long a start-up waits for another one that holds the engine cache (a cold ResNet-50 start-up times for ~3 s).
constexpr double kEngineCacheWaitS = 300;

/// What the plan is compiled with: one rank's share of the batch and the split (sharding.h) and the options.
plan::TrainConfig train_config(const TrainOptions& opts, const ShardLayout& shard, std::int64_t val_samples) {
  const int world = opts.comm ? opts.comm->world_size() : 1;
  plan::TrainConfig cfg;
  cfg.dataset_size = shard.rank_samples();
  cfg.batch = shard.rank_batch;
  cfg.val_size = std::max<std::int64_t>(val_samples, 1);
  cfg.val_batch = opts.val_batch > 0 ? std::max<std::int64_t>(1, opts.val_batch / world) : 0;
  cfg.optimizer = opts.optimizer;
  cfg.ema = opts.ema;
  cfg.amp = opts.amp;
  // The low-resolution variant only where it trains (--start-resolution without --lowres-epochs has no effect, and
  // compiled and allocated a variant: 10.9 GiB of arena for a tiny model at --start-resolution 1024).
  cfg.start_resolution = opts.lowres_epochs > 0 ? opts.start_resolution : 0;
  cfg.reuse_memory = opts.reuse_memory;
  cfg.fuse_kernels = opts.fuse_kernels;
  cfg.fold_residual_sums = opts.fold_residual_sums;
  cfg.fuse_residual_bn_backward = opts.fuse_residual_bn_backward;
  cfg.relu_masks = opts.relu_masks;
  cfg.fuse_shortcut_bn_backward = opts.fuse_shortcut_bn_backward;
  cfg.recompute_bn_relu = opts.recompute_bn_relu;
  cfg.recompute_budget_bytes = opts.recompute_budget_bytes;
  return cfg;
}

plan::BuildOptions build_options(const TrainOptions& opts) {
  plan::BuildOptions bo;
  bo.amp = opts.amp;
  bo.fuse = opts.fuse;
  return bo;
}

/// The arena against the memory it will live in, before it is allocated: a clear error, not a failed allocation.
void guard_arena(const blueprint::BluePrint& bp, const TrainOptions& opts, std::int64_t arena_bytes) {
  const std::string what = fmt::format("model '{}' (batch {}, {})", bp.name, opts.batch, opts.amp ? "amp" : "fp32");
  if (opts.backend == Backend::CUDA)
    guard_device_memory({what, arena_bytes, opts.workspace_mib << 20, 0});
  else
    guard_host_memory(what, arena_bytes, opts.comm ? opts.comm->ranks_on_this_node() : 1);
}
}  // namespace

void Trainer::check_memory(const blueprint::BluePrint& model, const TrainOptions& opts, std::int64_t train_samples,
                           std::int64_t val_samples) {
  const plan::CompiledPlan p = plan::Compiler::compile(plan::ArchPlan::build(model, build_options(opts)),
                                                       train_config(opts, shard_of(opts, train_samples), val_samples));
  guard_arena(model, opts, p.arena_bytes());
}

namespace {

/// Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime), or -1.
double process_age_s() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string line;
  double up = 0;
  if (!std::getline(stat, line) || !(uptime >> up)) return -1;
  const std::size_t paren = line.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream rest(line.substr(paren + 2));  // from field 3 on
  std::string field;
  for (int i = 3; i <= 22; ++i)  // field 22: the start time, in clock ticks after boot
    if (!(rest >> field)) return -1;
  const long ticks = sysconf(_SC_CLK_TCK);
  return ticks > 0 ? up - std::stod(field) / static_cast<double>(ticks) : -1;
}

}  // namespace

Trainer::Trainer(const blueprint::BluePrint& model, TrainOptions opts, const InitialState* initial) {
  const double t_begin = now_s();
  // The dataset decides the input channels and size the plan is compiled for.
  io::DatasetFile probe(opts.data_path);
  const io::SplitInfo& tr = probe.info(io::Split::train);
  const io::SplitInfo& va = probe.info(io::Split::val);
  RN_CHECK_CTX(tr.count > 0, opts.data_path, "the train split is empty");
  blueprint::BluePrint bp = model;
  RN_CHECK_CTX(bp.in_c == tr.channels, opts.data_path,
               "images have {} channels but model '{}' expects {} (hint: pick a model for this dataset)", tr.channels,
               bp.name, bp.in_c);
  // A crop renders every image at the model's size; without one a raw store must have it. A JPEG store is cropped
  // (centre crops unless --crop random-resized).
  // Scoring (eval, predict) renders images of another size as training validated them: resized and centre-cropped
  // (weights trained with crops on a raw store of another size could not be scored at all).
  const bool renders =
      opts.augmentation.crop != io::CropMode::none || probe.storage() == io::Storage::jpeg || opts.inference_only;
  if (!renders)
    RN_CHECK_CTX(bp.in_h == tr.height && bp.in_w == tr.width, opts.data_path,
                 "images are {}x{} but model '{}' expects {}x{} (hint: --crop random-resized or --crop center renders "
                 "them at the model's size)",
                 tr.height, tr.width, bp.name, bp.in_h, bp.in_w);
  const bool root = !opts.comm || opts.comm->rank() == 0;
  const bool other_size = probe.storage() == io::Storage::jpeg || bp.in_h != va.height || bp.in_w != va.width;
  if (root && opts.inference_only && other_size)
    spdlog::info("{}: images {} are resized (short side {}) and centre-cropped to {}x{}, as training validated them",
                 opts.data_path,
                 probe.storage() == io::Storage::jpeg ? std::string("of a JPEG store")
                                                      : fmt::format("of {}x{}", va.height, va.width),
                 opts.augmentation.val_resize > 0 ? fmt::format("{}", opts.augmentation.val_resize)
                                                  : std::string("size/0.875, --val-resize 0"),
                 bp.in_h, bp.in_w);
  else if (root && probe.storage() == io::Storage::jpeg && opts.augmentation.crop == io::CropMode::none)
    spdlog::info(
        "{}: a JPEG store: training images are resized and centre-cropped to {}x{} (--crop random-resized "
        "for random crops)",
        opts.data_path, bp.in_h, bp.in_w);
  const double t_start = now_s();
  const plan::BuildOptions bo = build_options(opts);
  // Data-parallel: each rank's plan is compiled for its share of every global batch (sharding.h).
  const plan::TrainConfig cfg = train_config(opts, shard_of(opts, tr.count), va.count);
  // On every backend (a no-op off the GPU, but the same request): the CLI's `--conv-stats on` lands here.
  RN_CHECK_CTX(!(opts.conv_stats && opts.deterministic), "--conv-stats",
               "on needs --deterministic off: cuDNN's GEN_STATS plans do not repeat their bits (docs/design.md); "
               "auto takes them whenever --deterministic is off");
  // DESIGN §9: rank 0 alone builds and compiles the plan and broadcasts it; each rank's inputs and options are
  // checked against rank 0's first (a difference is the same error on every rank, before any capture).
  m_plan = distribute_plan(opts.comm, bp, bo, cfg, describe_run_options(opts));
  RN_CHECK_CTX(m_plan->arch.num_classes == probe.num_classes(), opts.data_path,
               "the dataset has {} classes but model '{}' predicts {}", probe.num_classes(), bp.name,
               m_plan->arch.num_classes);
  std::vector<std::string> zero_gamma;
  if (opts.zero_init_residual) {
    zero_gamma = plan::residual_branch_bn_scales(*m_plan);
    RN_CHECK_CTX(!zero_gamma.empty(), bp.name,
                 "--zero-init-residual: the model has no residual sum whose branch ends in a BN");
  }
  // A batch normalisation that would see one value per channel (a last batch of one sample before a BN on 1x1
  // features): the kernels stopped the run at that step, after the epoch's work (--sync-bn sums over the ranks).
  const int world = opts.comm ? opts.comm->world_size() : 1;
  if (!opts.inference_only && !(opts.sync_bn && world > 1))
    if (const auto one = plan::single_value_batch_norm(*m_plan)) {
      const bool last = one->variant == plan::Variant::TRAIN_LAST || one->variant == plan::Variant::TRAIN_LOWRES_LAST;
      const std::string per_rank = world > 1 ? " per rank" : "";
      RN_FAIL_CTX(fmt::format("layer '{}'", one->layer),
                  "its batch normalisation would see one value per channel in {} (batch {}{}): batch statistics need "
                  "at least two (hint: {})",
                  last ? "the last batch of each epoch, the samples --batch leaves over" : "every batch", one->batch,
                  per_rank,
                  last ? "--drop-last, or a --batch that leaves more than one sample over"
                       : (world > 1 ? "a larger --batch, or --sync-bn" : "a larger --batch"));
    }
  // A file to start from is matched against the plan before any device work (engine timing, capture).
  if (initial) check_initial_state(*m_plan, opts, *initial);
  guard_arena(bp, opts, m_plan->arena_bytes());  // before the arena and the workspace exist
  const double t_compiled = now_s();
  m_impl = std::make_unique<Impl>(opts, *m_plan, std::move(probe));  // the file opened once
  Impl& I = *m_impl;
  I.zero_gamma = std::move(zero_gamma);
  I.startup.compile_s = t_compiled - t_start;
  I.startup.device_s = now_s() - t_compiled;
  auto log0 = [&](const std::string& line) {
    if (line.empty() || I.rank != 0) return;
    if (line.rfind("warning: ", 0) == 0)
      spdlog::warn("{}", line.substr(9));
    else
      spdlog::info("{}", line);
  };
  const bool gpu = opts.backend == Backend::CUDA;
  if (gpu && !opts.deterministic)
    log0(
        "--deterministic off: non-deterministic cuDNN engines and cuBLASLt reductions are admitted where they are "
        "faster; runs with the same seed are not bit-identical");
  if (gpu && opts.conv_stats)
    log0(
        "--conv-stats on: batch-norm statistics from the convolutions' GEN_STATS epilogue where timed faster "
        "(other bits than --conv-stats off)");
  // A single-process run holds the shared engine cache from before it loads it until it has saved what it timed:
  // two runs starting together then time once, and both train with those engines (engine_cache_file.h).
  std::unique_ptr<EngineCacheLock> cache_lock;
  if (gpu && I.world == 1) {
    std::string waited;
    cache_lock = lock_engine_cache(opts.engine_cache, kEngineCacheWaitS, &waited);
    log0(waited);
  }
  if (gpu) log0(load_engine_cache(opts.engine_cache));
  I.start_cache_prefetch();  // reads the dataset while the engines are chosen and the subgraphs captured
  const EngineStats e0 = engine_stats();
  const double t_capture = now_s();
  I.capture_all();
  const EngineStats e1 = engine_stats();
  I.startup.engines_s = e1.seconds - e0.seconds;
  I.startup.capture_s = now_s() - t_capture - I.startup.engines_s;
  I.startup.engines_cached = static_cast<std::int64_t>(e1.cached - e0.cached);
  I.startup.engines_chosen = static_cast<std::int64_t>(e1.chosen - e0.chosen);
  for (const std::string& d : conv_engines()) {
    if (d.find("[legacy") != std::string::npos) ++I.startup.engines_legacy;
    if (d.find("[own") != std::string::npos) ++I.startup.engines_own;
    if (d.find(" +stats") != std::string::npos) ++I.startup.engines_stats;  // cuda_fused.cpp, plan_conv_stats
  }
  if (gpu) {
    if (e1.rejected > e0.rejected)
      log0(fmt::format("warning: {} cached engine choice(s) could not be used again and were chosen afresh (first: {})",
                       e1.rejected - e0.rejected, e1.first_rejection));
    log0(save_engine_cache(opts.engine_cache, cache_lock.get()));
    cache_lock.reset();
    if (I.startup.engines_cached + I.startup.engines_chosen > 0)
      log0(
          fmt::format("convolution engines: {} from the cache, {} chosen in {:.1f} s, {} on the legacy API, {} on "
                      "own kernels",
                      I.startup.engines_cached, I.startup.engines_chosen, I.startup.engines_s, I.startup.engines_legacy,
                      I.startup.engines_own) +
          (opts.conv_stats ? fmt::format(", {} forward(s) with the BN statistics in the epilogue (--conv-stats)",
                                         I.startup.engines_stats)
                           : std::string()));
  }
  const double t_data = now_s();
  const std::string decode_line = I.setup_jpeg();  // first: the cache of a JPEG store is decoded by it
  const std::string cache_line = I.setup_cache();
  I.startup.data_s = now_s() - t_data;
  if (!(I.cache && I.cache->jpeg())) log0(decode_line);  // else the cache's line says how it was decoded
  if (I.jpeg) log0(hardware_queue_warning());
  log0(cache_line);
  const double t_init = now_s();
  if (opts.debug_arena_fill >= 0) I.ctx.fill_at(I.arena.base(), opts.debug_arena_fill & 0xFF, I.arena.bytes());
  I.init_weights();
  I.startup.init_s = now_s() - t_init;
  I.startup.total_s = now_s() - t_begin;
  const double age = process_age_s();
  log0(fmt::format(
      "start-up {:.2f} s{}: plan {:.2f} s, device and arena {:.2f} s, engines {:.2f} s, capture {:.2f} s, data {:.2f} "
      "s, weights {:.2f} s",
      I.startup.total_s, age >= 0 ? fmt::format(" ({:.2f} s since the process started)", age) : std::string(),
      I.startup.compile_s, I.startup.device_s, I.startup.engines_s, I.startup.capture_s, I.startup.data_s,
      I.startup.init_s));
  if (!opts.debug_poison_families.empty()) I.poison_families(opts.debug_poison_families);
  try {
    m_impl->model_yaml = blueprint::blueprint_to_yaml(model);  // recorded in checkpoints
  } catch (const std::exception&) {
    m_impl->model_yaml.clear();  // a model the YAML form cannot express: checkpoints then need --model
  }
  if (initial) (void)load_state(*initial);
}

Trainer::~Trainer() = default;

const StartupTimes& Trainer::startup() const { return m_impl->startup; }

std::vector<std::string> Trainer::conv_engines() const {
  std::vector<std::string> out;
  std::function<void(const ResolvedNode&)> walk = [&](const ResolvedNode& r) {
    if (!r.detail.empty()) out.push_back(r.detail);
    for (const ResolvedNode& s : r.sub) walk(s);
  };
  for (const CapturedGraph* g : m_impl->atlas.all())
    for (const ResolvedNode& r : g->nodes()) walk(r);
  return out;
}

std::vector<EpochMetrics> Trainer::run(const TrainObserver& observer) {
  Impl& I = *m_impl;
  const TrainOptions& o = I.opt;
  const std::int64_t n = I.data.size(io::Split::train);
  // o.batch is the global batch; this rank trains its slice of each (sharding.h).
  const ShardLayout shard = shard_of(o, n);
  const std::int64_t batches = shard.batches();
  if (I.rank == 0 && shard.epoch_samples < n) {
    if (o.drop_last)
      spdlog::info("--drop-last: the last {} sample(s) of each epoch's order are not trained (every batch is full)",
                   n - shard.epoch_samples);
    else
      spdlog::info(
          "{} ranks: the last {} sample(s) of each epoch's order are not trained (the partial global batch "
          "of {} is split evenly over the ranks)",
          I.world, n - shard.epoch_samples, n % o.batch);
  }
  const std::int64_t total_steps = o.max_steps > 0 ? std::min(o.max_steps, batches * o.epochs) : batches * o.epochs;
  // The step in this run's units: a run resumed with another batch size (or dataset) continues at the checkpoint's
  // sample in its own count of batches, while m_step, the optimizer's step and the checkpoints' names, goes on from
  // the checkpoint's (4 -> 32 after 10 steps: the epoch's second of 2 batches is step 1 of the schedule and the run
  // ends after its 6th, where it ended at once because 10 >= 6). Zero for a fresh run and a resume with the same
  // batch. --max-steps counts optimizer steps (m_step).
  const std::int64_t shift = m_step - (I.cur_epoch * batches + I.cur_position);
  auto done = [&] { return (o.max_steps > 0 && m_step >= o.max_steps) || m_step - shift >= batches * o.epochs; };
  Schedule sched;
  sched.kind = o.schedule;
  sched.base_lr = o.lr;
  sched.total_steps = total_steps;
  sched.warmup_steps = static_cast<std::int64_t>(o.warmup_epochs * static_cast<double>(batches));
  sched.one_cycle_pct = o.onecycle_pct;
  sched.div_factor = o.onecycle_div;
  sched.momentum = o.momentum;
  sched.cycle_momentum = o.onecycle_momentum;
  sched.base_momentum = o.onecycle_base_momentum;
  sched.max_momentum = o.onecycle_max_momentum;
  sched.step_size = o.step_epochs * batches;
  sched.gamma = o.step_gamma;
  const std::uint64_t seed = o.seed;
  std::vector<EpochMetrics> history;
  I.preempted = false;
  if (I.cur_position > 0) I.restore_partial_metrics();  // resuming mid-epoch: the epoch's sums so far
  for (std::int64_t epoch = I.cur_epoch; epoch < o.epochs && !done(); ++epoch) {
    const bool lowres = epoch < o.lowres_epochs && o.start_resolution > 0;
    const double t0 = now_s();
    // The augmentation of a sample is keyed by its position in the global epoch order, whatever the rank count.
    std::vector<std::int64_t> positions;
    // Resuming mid-epoch: the same order and augmentation keys, without the batches already trained.
    const std::int64_t first_batch = epoch == I.cur_epoch ? I.cur_position : 0;
    std::vector<std::int64_t> order =
        drop_batches(shard_order(shard, epoch_order(seed, epoch, n, o.shuffle), &positions), &positions,
                     first_batch * shard.rank_batch);
    // Every sample is decoded and augmented on the loader threads, keyed by its position in the global order.
    const Variant full = lowres ? Variant::TRAIN_LOWRES : Variant::TRAIN_BASE;
    const DTensor& in = I.plan.plan(full).tensor(I.plan.baseline.data_a);
    std::optional<io::BatchLoader> loader;  // none with the device cache: its pass table replaces it
    CachedBatches cached(order.size(), shard.rank_batch);
    if (I.cache)
      I.begin_cached_pass(io::Split::train, order, epoch, &positions);
    else
      loader.emplace(I.data, io::Split::train, shard.rank_batch, std::move(order), io::BatchTransform{}, std::nullopt,
                     I.loader_options(io::Split::train, in.shape.h, in.shape.w, epoch, &positions));
    JpegAhead ahead(I.jpeg.get(), loader ? &*loader : nullptr, io::Split::train, o.gpu_decoders);
    std::int64_t samples = 0;
    double lr = 0;
    while (auto b = ahead ? I.jpeg->next() : loader ? loader->next() : cached.next()) {
      const int s = static_cast<int>(b->index % 2);
      const bool last = b->count < shard.rank_batch;
      const Variant v = lowres ? (last ? Variant::TRAIN_LOWRES_LAST : Variant::TRAIN_LOWRES)
                               : (last ? Variant::TRAIN_LAST : Variant::TRAIN_BASE);
      RN_CHECK(b->count == I.plan.specs[static_cast<std::size_t>(v)].batch_size,
               "internal: batch of {} samples for variant '{}'", b->count, plan::variant_name(v));
      // data: slot s was last used two batches ago; once that step is done, stage and copy this batch while the
      // previous step still runs on the device (or gather it there from the device cache).
      I.wait_slot(s);
      if (I.cache) {
        I.transfer_cached(io::Split::train, s, b->count);
      } else if (I.jpeg) {
        I.check_labels(*b);
        I.transfer_jpeg(io::Split::train, s, *b, v, epoch, &positions);
      } else {
        I.check_labels(*b);
        I.stage(s, *b, v);
        I.transfer(v, s);
      }
      lr = sched.lr(m_step - shift);
      I.last_lr = lr;
      I.hyper[plan::kHyperLr] = static_cast<float>(lr);
      I.last_momentum = sched.momentum_at(m_step - shift);
      I.hyper[plan::kHyperMomentum] = static_cast<float>(I.last_momentum);
      I.hyper[plan::kHyperStep] = static_cast<float>(m_step + 1);
      // EMA warm-up (TensorFlow's num_updates): min(decay, (1 + t) / (10 + t)) at step t, so a short run's average
      // is not dominated by the initial weights (0.999^1000 still gives them 37 %).
      I.hyper[plan::kHyperEmaDecay] = static_cast<float>(
          std::min(o.ema_decay, (1.0 + static_cast<double>(m_step + 1)) / (10.0 + static_cast<double>(m_step + 1))));
      I.push_hyper_async(s);
      if (o.comm) o.comm->set_step(m_step + 1);
      if (I.step(v, s, true) && !o.amp && o.backend == Backend::CPU)
        throw Error(fmt::format("NaN or inf in the gradients at step {} (epoch {}, batch {} of {})", m_step + 1,
                                epoch + 1, first_batch + b->index + 1, batches),
                    "training", "the loss diverged: lower --lr, or use --amp for dynamic loss scaling");
      I.session->release_slot(s);
      ++m_step;
      I.session->trace_node_hashes(m_step);
      samples += b->count * I.world;  // every rank trains the same count: the global batch
      if (observer.on_step)
        observer.on_step(epoch + 1, first_batch + b->index + 1, batches, static_cast<double>(samples) / (now_s() - t0));
      // Step boundary: checkpoint and preemption policy (collective; an epoch's last step is handled at its end).
      I.cur_position = first_batch + b->index + 1;
      if (observer.on_step_loss && (!observer.wants_step_loss || observer.wants_step_loss(m_step)))
        observer.on_step_loss(m_step, epoch + 1, I.step_loss());
      // A stop request that comes with the run's last step is no preemption: the run ends here anyway and reports
      // its epoch (a resumed run would find nothing left to do, and the epoch would go unreported).
      const bool stop = I.stop_agreed() && !done();
      if (stop) I.preempted = true;  // before the checkpoint: a failed write is still a preemption (exit 75)
      if (I.cur_position < batches && (stop || done() || I.checkpoint_due(m_step))) {
        const std::vector<float> partial = I.gather_train_metrics();
        if (stop || done()) I.stopped_metrics = partial;
        if (!o.checkpoint_dir.empty()) I.write_checkpoint_in_dir(m_step, partial, observer);
      }
      if (stop) {
        if (I.cur_position < batches) return history;  // the resumed run reports this epoch whole
        break;
      }
      if (done()) break;
    }
    const double train_s = now_s() - t0;
    ahead.end();  // validation below decodes ahead too
    I.log_jpeg_fallbacks();
    if (ahead && I.rank == 0) {
      const GpuJpegInput::AheadStats st = I.jpeg->ahead_stats();
      const double per = st.batches ? 1e3 / static_cast<double>(st.batches) : 0.0;
      spdlog::info(
          "JPEG decode ahead ({} threads): {} batches; per batch on a decoder thread {:.1f} ms waiting for a free "
          "buffer, {:.1f} ms reading, {:.1f} ms waiting for its last render, {:.1f} ms decoding; the step waited "
          "{:.2f} s for them",
          o.gpu_decoders, st.batches, st.ring_s * per, st.read_s * per, st.slot_s * per, st.decode_s * per, st.wait_s);
    }
    EpochMetrics m;
    m.epoch = epoch + 1;
    m.step = m_step;
    m.train_samples = samples;
    m.seconds = train_s;
    m.images_per_s = static_cast<double>(samples) / train_s;
    m.lr = lr;
    const auto loss_scale = I.read_loss_scale();
    if (o.amp) require_loss_scale_left(loss_scale, m_step);
    m.loss_scale = loss_scale[plan::kLossScale];
    I.replay_phase(Variant::TRAIN_BASE, plan::StepPhase::TRAIN_RESULT);
    const auto acc = I.accumulated();
    const double count = std::max(1.0f, acc[plan::kResultCount]);
    m.train_loss = acc[plan::kResultLoss] / count;
    if (!o.amp && !std::isfinite(m.train_loss))
      throw Error(fmt::format("NaN or inf in the training loss of epoch {} (step {})", epoch + 1, m_step), "training",
                  "the loss diverged: lower --lr, or use --amp for dynamic loss scaling");
    // Steps whose loss overflowed FP16 are skipped by the loss scaling and leave the weights as they were; weights
    // that are no longer finite mean the run diverged (checked only then: it reads every weight back).
    if (o.amp && !std::isfinite(m.train_loss)) require_not_diverged(weight_tensors(), m_step);
    m.train_top1 = acc[plan::kResultTop1] / count;
    I.replay_phase(Variant::TRAIN_BASE, plan::StepPhase::TRAIN_EPOCH_END);
    const bool last_epoch = epoch + 1 >= o.epochs || done();
    if (o.validate && (o.validate_each_epoch || last_epoch)) {
      m.validated = true;
      const EpochMetrics val = evaluate(false);
      m.val_loss = val.val_loss;
      m.val_top1 = val.val_top1;
      m.val_top5 = val.val_top5;
      if (o.ema) m.ema_val_top1 = evaluate(true).val_top1;
      if (o.tta_flip && !I.preempted && last_epoch) {
        const TtaResult tta = evaluate_flip_tta(false);
        m.tta_val_top1 = tta.top1;
        m.tta_val_loss = tta.loss;
      }
    }
    m.seconds = now_s() - t0;
    history.push_back(m);
    // An observer that fails (a --metrics file on a full disk) fails the run, but after the epoch's checkpoint: the
    // checkpoint disk may have room, and the epoch's training was lost with it.
    std::exception_ptr observer_error;
    if (observer.on_epoch) {
      try {
        observer.on_epoch(m);
      } catch (...) {
        observer_error = std::current_exception();
      }
    }
    if (m.validated) I.last_epoch_metrics = m;
    const bool epoch_complete = I.cur_position >= batches;
    // A stop request that came during the epoch's validation: this epoch's checkpoint is the preemption's (the run
    // trained a step of the next epoch and wrote a second checkpoint before it stopped). Collective, as at a step.
    if (epoch_complete && !I.preempted && !last_epoch && I.stop_agreed()) I.preempted = true;
    if (epoch_complete) {  // a checkpoint from here resumes at the next epoch
      I.cur_epoch = epoch + 1;
      I.cur_position = 0;
      I.stopped_metrics.clear();
      if (!o.checkpoint_dir.empty() &&
          (I.preempted || done() || o.checkpoint_each_epoch || I.checkpoint_due(m_step)))
        I.write_checkpoint_in_dir(m_step, std::vector<float>(plan::kResultSlots * I.comm_world(), 0.0f), observer);
      else if (o.checkpoint_keep_best && m.validated)
        I.keep_best_in_dir(m_step);
    }
    if (observer_error) std::rethrow_exception(observer_error);
    if (epoch_complete && I.preempted) return history;
  }
  return history;
}
EpochMetrics Trainer::evaluate(bool ema) {
  Impl& I = *m_impl;
  RN_CHECK(!ema || I.opt.ema, "EMA evaluation needs a run with --ema");
  const std::int64_t n = I.data.size(io::Split::val);
  RN_CHECK_CTX(n > 0, I.data.path(), "the val split is empty");
  const std::int64_t vb = I.plan.specs[static_cast<std::size_t>(Variant::VAL_BASE)].batch_size;
  // Validation loss is the plain cross-entropy: no label smoothing.
  const float smoothing = I.hyper[plan::kHyperLabelSmoothing];
  I.hyper[plan::kHyperLabelSmoothing] = 0.0f;
  I.push_hyper();
  I.replay_phase(Variant::VAL_BASE, plan::StepPhase::VAL_BEGIN);
  if (ema && I.opt.amp) I.replay_phase(Variant::VAL_BASE, plan::StepPhase::VAL_EMA_BEGIN);
  // Data-parallel: the val batches are dealt round-robin over the ranks; VAL_RESULT_COMM sums the metrics.
  const DTensor& vin = I.plan.plan(Variant::VAL_BASE).tensor(I.plan.baseline.data_a);
  std::vector<std::int64_t> val_order = round_robin_batches(epoch_order(0, 0, n, false), vb, I.world, I.rank);
  std::optional<io::BatchLoader> loader;  // none with the device cache
  CachedBatches cached(val_order.size(), vb);
  if (I.cache)
    I.begin_cached_pass(io::Split::val, val_order, 0, nullptr);
  else
    loader.emplace(I.data, io::Split::val, vb, std::move(val_order), io::BatchTransform{}, std::nullopt,
                   I.loader_options(io::Split::val, vin.shape.h, vin.shape.w, 0, nullptr));
  const JpegAhead ahead(I.jpeg.get(), loader ? &*loader : nullptr, io::Split::val, I.opt.gpu_decoders);
  while (auto b = ahead ? I.jpeg->next() : loader ? loader->next() : cached.next()) {
    const int s = static_cast<int>(b->index % 2);
    const Variant v = b->count < vb ? Variant::VAL_LAST : Variant::VAL_BASE;
    I.wait_slot(s);  // the batch two back is done with slot s
    if (I.cache) {
      I.transfer_cached(io::Split::val, s, b->count);
    } else if (I.jpeg) {
      I.check_labels(*b);
      I.transfer_jpeg(io::Split::val, s, *b, v, 0, nullptr);
    } else {
      I.check_labels(*b);
      I.stage(s, *b, v);
      I.transfer(v, s);
    }
    I.replay_phase(v, ema ? plan::StepPhase::VAL_BATCH_EMA : plan::StepPhase::VAL_BATCH_MAIN, s);
    I.session->release_slot(s);
  }
  I.replay_phase(Variant::VAL_BASE, plan::StepPhase::VAL_RESULT);
  const auto acc = I.accumulated();
  const double count = std::max(1.0f, acc[plan::kResultCount]);
  EpochMetrics m;
  m.val_loss = acc[plan::kResultLoss] / count;
  m.val_top1 = acc[plan::kResultTop1] / count;
  m.val_top5 = acc[plan::kResultTop5] / count;
  I.replay_phase(Variant::VAL_BASE, plan::StepPhase::VAL_END);
  I.hyper[plan::kHyperLabelSmoothing] = smoothing;
  I.push_hyper();
  return m;
}

std::vector<float> Trainer::tensor_values(const std::string& name) const {
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);
  const DTensor& t = mp.tensor(mp.at(name));
  std::vector<float> out(static_cast<std::size_t>(t.shape.elems()));
  std::vector<std::byte> bytes(static_cast<std::size_t>(t.shape.elems()) * dtype_size(t.dtype));
  m_impl->ctx.download(t.id, bytes.data(), static_cast<std::int64_t>(bytes.size()));
  const std::byte* p = bytes.data();
  if (t.dtype == DType::F32) {
    std::memcpy(out.data(), p, out.size() * 4);
  } else if (t.dtype == DType::F16) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(p);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = cpu::half_to_float(h[i]);
  } else {
    RN_FAIL("tensor '{}' is {}, not a float tensor", name, dtype_name(t.dtype));
  }
  return out;
}

std::vector<std::uint8_t> Trainer::tensor_bytes(const std::string& name) const {
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);
  const DTensor& t = mp.tensor(mp.at(name));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(t.shape.elems()) * dtype_size(t.dtype));
  m_impl->ctx.download(t.id, bytes.data(), static_cast<std::int64_t>(bytes.size()));
  return bytes;
}

void Trainer::set_tensor_values(const std::string& name, const std::vector<float>& values) {
  Impl& I = *m_impl;
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);
  const DTensor& t = mp.tensor(mp.at(name));
  RN_CHECK(t.dtype == DType::F32, "set_tensor_values: tensor '{}' is {}, not F32", name, dtype_name(t.dtype));
  RN_CHECK(static_cast<std::int64_t>(values.size()) == t.shape.elems(),
           "set_tensor_values: tensor '{}' has {} elements ({}), got {} values", name, t.shape.elems(), t.shape.str(),
           values.size());
  I.session->synchronize();  // no step still reading it
  I.ctx.upload(t.id, values.data(), static_cast<std::int64_t>(values.size() * sizeof(float)));
  if (I.opt.amp && region_family(t.region) == RegionFamily::W) I.replay(Variant::TRAIN_BASE, GraphId::CAST_W_TO_A);
  I.session->synchronize();
}

std::vector<float> Trainer::state_values() const {
  std::vector<float> out;
  for (const DTensor& t : m_plan->plan(Variant::TRAIN_BASE).tensors()) {
    const RegionFamily f = region_family(t.region);
    if (f != RegionFamily::W && f != RegionFamily::B) continue;
    const std::vector<float> v = tensor_values(t.name);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}
// ---- logits for interoperability checks (renaissance predict) -------------------------------------------------

Trainer::TtaResult Trainer::evaluate_flip_tta(bool ema) {
  Impl& I = *m_impl;
  const std::int64_t n = I.data.size(io::Split::val);
  RN_CHECK_CTX(n > 0, I.data.path(), "the val split is empty");
  const std::int64_t classes = I.plan.arch.num_classes;
  const std::vector<float> plain = logits(io::Split::val, 0, n, ema, false);
  const std::vector<float> mirrored = logits(io::Split::val, 0, n, ema, true);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  I.data.read(io::Split::val, 0, n, nullptr, labels.data());
  TtaResult r;
  std::vector<double> z(static_cast<std::size_t>(classes));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t best = 0;
    double top = -std::numeric_limits<double>::infinity();
    for (std::int64_t k = 0; k < classes; ++k) {
      const auto at = static_cast<std::size_t>(i * classes + k);
      z[static_cast<std::size_t>(k)] = 0.5 * (static_cast<double>(plain[at]) + static_cast<double>(mirrored[at]));
      if (z[static_cast<std::size_t>(k)] > top) {  // the first of equal maxima, as the step's metrics count
        top = z[static_cast<std::size_t>(k)];
        best = k;
      }
    }
    double sum = 0;
    for (const double v : z) sum += std::exp(v - top);
    const std::int32_t y = labels[static_cast<std::size_t>(i)];
    r.loss += top + std::log(sum) - z[static_cast<std::size_t>(y)];
    // A NaN logit of the label (all NaN: best stays 0) is never correct, as the step's metrics count.
    r.top1 += best == y && !std::isnan(z[static_cast<std::size_t>(y)]) ? 1.0 : 0.0;
  }
  r.top1 /= static_cast<double>(n);
  r.loss /= static_cast<double>(n);
  return r;
}

std::vector<float> Trainer::logits(io::Split split, std::int64_t first, std::int64_t count, bool ema, bool hflip) {
  Impl& I = *m_impl;
  RN_CHECK(!ema || I.opt.ema, "logits of the EMA weights need a run with --ema");
  const std::int64_t n = I.data.size(split);
  RN_CHECK_CTX(first >= 0 && count >= 1 && first + count <= n, I.data.path(),
               "samples [{}, {}) are outside the {} split of {} samples", first, first + count, io::split_name(split),
               n);
  const Variant v = Variant::VAL_BASE;
  const std::int64_t vb = I.plan.specs[static_cast<std::size_t>(v)].batch_size;
  const std::int64_t classes = I.plan.arch.num_classes;
  const DTensor& vin = I.plan.plan(v).tensor(I.plan.baseline.data_a);
  const std::int64_t sb = vin.shape.h * vin.shape.w * I.img_c;  // rendered as validation renders them
  if (ema && I.opt.amp) I.replay(v, GraphId::CAST_E_TO_E16);
  std::vector<std::uint8_t> images(static_cast<std::size_t>(vb * sb));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(vb));
  std::vector<std::int64_t> range(static_cast<std::size_t>(count));
  std::iota(range.begin(), range.end(), first);
  io::BatchLoader loader(I.data, split, vb, std::move(range), {}, std::nullopt,
                         I.loader_options(io::Split::val, vin.shape.h, vin.shape.w, 0, nullptr, true));
  std::vector<float> out(static_cast<std::size_t>(count * classes));
  const TensorView lv = I.ctx.view(I.plan.baseline.logits, v);
  RN_CHECK(lv.shape.n == vb && lv.shape.h * lv.shape.w * lv.shape.c == classes,
           "internal: logits tensor {} for batch {} and {} classes", lv.shape.str(), vb, classes);
  const std::int64_t row = lv.strides[0];  // elements per sample (CUDA pads channels)
  std::vector<std::byte> raw(static_cast<std::size_t>(vb * row) * dtype_size(lv.dtype));
  std::int64_t batch_index = 0;
  for (std::int64_t done = 0; done < count; done += vb, ++batch_index) {
    const std::int64_t k = std::min(vb, count - done);
    const io::Batch loaded = *loader.next();
    RN_CHECK(loaded.count == k, "internal: {} samples loaded for {}", loaded.count, k);
    std::memcpy(images.data(), loaded.images, static_cast<std::size_t>(k * sb));
    std::memcpy(labels.data(), loaded.labels, static_cast<std::size_t>(k) * sizeof(std::int32_t));
    if (hflip) {  // each row's pixels (img_c bytes each) in reverse order
      const std::int64_t w = vin.shape.w, c = I.img_c;
      for (std::int64_t row = 0; row < k * vin.shape.h; ++row) {
        std::uint8_t* p = images.data() + row * w * c;
        for (std::int64_t x = 0; x < w / 2; ++x)
          std::swap_ranges(p + x * c, p + (x + 1) * c, p + (w - 1 - x) * c);
      }
    }
    for (std::int64_t i = k; i < vb; ++i) {  // pad: inference treats samples independently (running BN stats)
      std::memcpy(images.data() + i * sb, images.data() + (k - 1) * sb, static_cast<std::size_t>(sb));
      labels[static_cast<std::size_t>(i)] = labels[static_cast<std::size_t>(k - 1)];
    }
    const io::Batch b{images.data(), labels.data(), vb, batch_index, first + done, vin.shape.h, vin.shape.w};
    const int s = static_cast<int>(batch_index % 2);
    I.check_labels(b);
    I.wait_slot(s);
    I.stage(s, b, v);
    I.transfer(v, s);
    I.replay(v, ema ? (s == 0 ? GraphId::INF_EMA_A : GraphId::INF_EMA_B)
                    : (s == 0 ? GraphId::INF_MAIN_A : GraphId::INF_MAIN_B));
    I.session->release_slot(s);
    I.session->synchronize();
    I.ctx.download_at(lv.ptr, raw.data(), static_cast<std::int64_t>(raw.size()));
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t c = 0; c < classes; ++c) {
        const std::size_t at = static_cast<std::size_t>(i * row + c);
        float x = 0;
        if (lv.dtype == DType::F32) {
          std::memcpy(&x, raw.data() + at * 4, 4);
        } else {
          std::uint16_t h = 0;
          std::memcpy(&h, raw.data() + at * 2, 2);
          x = cpu::half_to_float(h);
        }
        out[static_cast<std::size_t>((done + i) * classes + c)] = x;
      }
  }
  return out;
}

void Trainer::Impl::start_cache_prefetch() {
  if (opt.backend != Backend::CUDA || opt.data_cache == DataCacheMode::off || data.storage() != io::Storage::raw)
    return;
  std::int64_t bytes = 0;
  for (io::Split s : io::kAllSplits) {
    const io::SplitInfo& info = data.info(s);
    bytes += info.count * (info.height * info.width * info.channels + 4);
  }
  const std::int64_t host_free = host_available_bytes();
  if (bytes > kPrefetchMaxBytes || (host_free >= 0 && bytes > host_free / 4)) return;
  cache_prefetch = std::async(std::launch::async, [this] { return read_host_dataset(data); });
}

std::string Trainer::Impl::setup_cache() {
  const io::SplitInfo& tr = data.info(io::Split::train);
  const io::SplitInfo& va = data.info(io::Split::val);
  const std::int64_t train_batch = plan.specs[static_cast<std::size_t>(Variant::TRAIN_BASE)].batch_size;
  const std::int64_t val_batch = plan.specs[static_cast<std::size_t>(Variant::VAL_BASE)].batch_size;
  DataCacheRequest r;
  r.mode = opt.data_cache;
  r.gpu = opt.backend == Backend::CUDA;
  r.raw_store = data.storage() == io::Storage::raw;
  r.jpeg_on_gpu = !r.raw_store && jpeg != nullptr;
  r.progressive = opt.start_resolution > 0 && opt.lowres_epochs > 0;
  if (r.raw_store) {
    r.bytes = (tr.count + va.count) * (tr.height * tr.width * tr.channels + 52) +
              std::max(train_batch, val_batch) * tr.height * model_w * tr.channels;
  } else if (r.jpeg_on_gpu) {  // the decoded images at their own sizes, their table, the tallest image's scratch
    r.bytes = GpuDataCache::jpeg_image_bytes(data) + (tr.count + va.count) * (52 + 24) +
              std::max(train_batch, val_batch) * std::max(tr.max_height, va.max_height) * model_w * tr.channels;
  }
  if (r.gpu) device_memory_now(&r.free_bytes, &r.total_bytes);
  const DataCacheDecision d = decide_data_cache(r);
  if (!d.use) {
    if (cache_prefetch.valid()) cache_prefetch.wait();  // its copy (or its error) is not needed: the loader reads
    cache_prefetch = {};
    return opt.data_cache == DataCacheMode::off || !r.gpu ? std::string() : "data cache: off (" + d.reason + ")";
  }
  const double t0 = now_s();
  std::string decoded;
  if (r.jpeg_on_gpu) {
    // Decoded once here; the batch-by-batch decoder (its nvJPEG state and ring of buffers) is not needed after.
    cache = std::make_unique<GpuDataCache>(data, static_cast<int>(plan.arch.num_classes), *jpeg, pool.get(),
                                           opt.gpu_decoders);
    log_jpeg_fallbacks();
    decoded = fmt::format(" (JPEG, decoded by nvJPEG in {:.2f} s: {}, {} decoder thread(s){})", cache->decode_seconds(),
                          jpeg->backend(), opt.gpu_decoders,
                          jpeg->cpu_fallbacks() ? fmt::format(", {} on the CPU", jpeg->cpu_fallbacks()) : "");
    jpeg.reset();
  } else if (cache_prefetch.valid()) {
    const HostDataset host = cache_prefetch.get();  // rethrows what reading the store threw
    cache = std::make_unique<GpuDataCache>(data, static_cast<int>(plan.arch.num_classes), &host);
  } else {
    cache = std::make_unique<GpuDataCache>(data, static_cast<int>(plan.arch.num_classes));
  }
  // What each split's gathers render (the host loader's choices, loader_options): training resamples unless it
  // only shifts and flips a store of the model's size; validation unless the store has the model's size.
  const io::CropMode crop = opt.augmentation.crop;
  const bool train_resamples = !(stored_is_model_size && (crop == io::CropMode::none || crop == io::CropMode::center));
  const bool val_resamples = !stored_is_model_size;
  if (train_resamples || val_resamples)
    cache->reserve_scratch(std::max(train_resamples ? train_batch : 0, val_resamples ? val_batch : 0), model_w);
  // One gather per split, slot and batch size the variants use, captured now (nothing is captured mid-run).
  const Variant train_vs[] = {Variant::TRAIN_BASE, Variant::TRAIN_LAST};
  const Variant val_vs[] = {Variant::VAL_BASE, Variant::VAL_LAST};
  for (io::Split split : {io::Split::train, io::Split::val}) {
    const bool train = split == io::Split::train;
    for (Variant v : train ? train_vs : val_vs) {
      const std::int64_t count = plan.specs[static_cast<std::size_t>(v)].batch_size;
      if (count <= 0) continue;
      for (int s = 0; s < 2; ++s) {
        const DTensor& dt = plan.plan(v).tensor(s == 0 ? plan.baseline.data_a : plan.baseline.data_b);
        GpuDataCache::Dest dst;
        dst.labels = ctx.ptr_at(s == 0 ? plan.baseline.labels_a : plan.baseline.labels_b);
        dst.data = ctx.ptr_at(s == 0 ? plan.baseline.data_a : plan.baseline.data_b);
        dst.dtype = dt.dtype;
        dst.channels = dt.shape.c;
        cache->prepare(split, s, train ? train_batch : val_batch, count, dst, data.mean().data(), data.stddev().data(),
                       dt.shape.h, dt.shape.w, train ? train_resamples : val_resamples);
      }
    }
  }
  startup.data_cache_s = now_s() - t0;
  const std::string size = cache->jpeg() ? fmt::format("up to {}x{}x{}", cache->height(), cache->width(), tr.channels)
                                         : fmt::format("{}x{}x{}", tr.height, tr.width, tr.channels);
  return fmt::format(
      "data cache: {} + {} images ({}, {}) on the device in {:.2f} s{}; batches are gathered{}, "
      "shifted, flipped and normalised there",
      tr.count, va.count, size, gib(cache->bytes()), startup.data_cache_s, decoded,
      train_resamples ? ", cropped, resampled" : "");
}

void Trainer::Impl::begin_cached_pass(io::Split split, const std::vector<std::int64_t>& order, std::int64_t epoch,
                                      const std::vector<std::int64_t>* positions) {
  // The geometry the host loader's render would use (loader_options).
  // (a JPEG store's, transfer_jpeg's: its images have no common size, so training crops them, centrally without
  // a crop of the run's).
  io::AugmentSpec spec;
  if (split == io::Split::val) {
    if (stored_is_model_size) {  // a copy
      cache->begin_pass(split, order, nullptr);
      return;
    }
    spec = val_spec(opt.augmentation, model_h, model_w, false);
  } else {
    Augmentation aug = opt.augmentation;
    if (aug.crop == io::CropMode::center && stored_is_model_size) aug.crop = io::CropMode::none;
    spec = train_spec(aug, model_h, model_w);
    if (cache->jpeg() && spec.crop == io::CropMode::none) spec.crop = io::CropMode::center;
    if (!spec.random() && spec.crop == io::CropMode::none) {  // delivered as stored
      cache->begin_pass(split, order, nullptr);
      return;
    }
  }
  std::vector<io::SampleGeometry> geom(order.size());
  const std::uint64_t seed = split == io::Split::train ? opt.seed : 0;
  const std::int64_t e = split == io::Split::train ? epoch : 0;
  for (std::size_t p = 0; p < order.size(); ++p)
    geom[p] = io::sample_geometry(spec, seed, e, positions ? (*positions)[p] : static_cast<std::int64_t>(p),
                                  cache->sample_height(split, order[p]), cache->sample_width(split, order[p]));
  cache->begin_pass(split, order, &geom);
}

std::string Trainer::Impl::setup_jpeg() {
  const bool gpu = opt.backend == Backend::CUDA;
  const bool store = data.storage() == io::Storage::jpeg;
  const DecodeDecision d = decide_decode(opt.decode, gpu, store, nvjpeg_in_build());
  if (!d.gpu) {
    if (!store) return std::string();
    return fmt::format("JPEG decode: on the CPU, {} loader threads (libjpeg-turbo{})",
                       opt.loader_threads > 0 ? opt.loader_threads : io::available_cpus(),
                       gpu ? "; " + d.reason : std::string());
  }
  const double t0 = now_s();
  jpeg = std::make_unique<GpuJpegInput>(data.channels(), data.path());
  const bool engines = std::string(jpeg->backend()).rfind("hardware", 0) == 0;
  return fmt::format(
      "JPEG decode: on the GPU, nvJPEG batched (backends: {}) on {} thread(s) a batch ahead of the step, "
      "crop/resample/flip/normalise on the GPU; images nvJPEG cannot decode go to {} ({:.2f} s to start){}",
      jpeg->backend(), opt.gpu_decoders,
      io::have_jpeg_codec() ? "libjpeg-turbo, counted" : "an error (no libjpeg-turbo in this build)", now_s() - t0,
      opt.gpu_decoders > 1 && engines
          ? "; with more than one decoder thread the JPEG engines' pixels depend on which thread decoded a batch, "
            "so the run is not bit-reproducible (--gpu-decoders 1 is)"
          : "");
}

void Trainer::Impl::log_jpeg_fallbacks() {
  if (!jpeg || jpeg->cpu_fallbacks() == jpeg_fallbacks_logged) return;
  if (rank == 0)
    spdlog::warn("JPEG decode: {} image(s) nvJPEG could not decode were decoded on the CPU so far (first: {})",
                 jpeg->cpu_fallbacks(), jpeg->first_fallback());
  jpeg_fallbacks_logged = jpeg->cpu_fallbacks();
}

void Trainer::Impl::transfer_jpeg(io::Split split, int s, const io::Batch& b, Variant v, std::int64_t epoch,
                                  const std::vector<std::int64_t>* positions) {
  RN_CHECK(b.encoded, "internal: a JPEG batch without its bytes");
  const DTensor& dt = plan.plan(v).tensor(s == 0 ? plan.baseline.data_a : plan.baseline.data_b);
  // The spec the host loader's render would use (loader_options): training, the run's crop (a JPEG store has no
  // size of its own: none is the centre crop); validation, resize + centre crop.
  io::AugmentSpec spec;
  std::uint64_t seed = 0;
  if (split == io::Split::train) {
    spec = train_spec(opt.augmentation, dt.shape.h, dt.shape.w);
    if (spec.crop == io::CropMode::none) spec.crop = io::CropMode::center;
    seed = opt.seed;
  } else {
    spec = val_spec(opt.augmentation, dt.shape.h, dt.shape.w, false);
    epoch = 0;
  }
  std::vector<io::SampleGeometry> geom(static_cast<std::size_t>(b.count));
  for (std::int64_t i = 0; i < b.count; ++i) {
    const std::int64_t p = b.first_position + i;
    const std::int64_t key = positions ? (*positions)[static_cast<std::size_t>(p)] : p;
    geom[static_cast<std::size_t>(i)] =
        io::sample_geometry(spec, seed, epoch, key, b.encoded->heights[static_cast<std::size_t>(i)],
                            b.encoded->widths[static_cast<std::size_t>(i)]);
  }
  GpuJpegInput::Dest d;
  d.labels = ctx.ptr_at(s == 0 ? plan.baseline.labels_a : plan.baseline.labels_b);
  d.data = ctx.ptr_at(s == 0 ? plan.baseline.data_a : plan.baseline.data_b);
  d.dtype = dt.dtype;
  d.channels = dt.shape.c;
  d.out_h = dt.shape.h;
  d.out_w = dt.shape.w;
  session->transfer(env, s, [&] {
    if (jpeg->ahead())  // b is the batch jpeg->next() returned, decoded ahead
      jpeg->render_current(geom, d, data.mean().data(), data.stddev().data(), s, env.stream);
    else
      jpeg->decode_render(*b.encoded, split, b.indices, geom, d, data.mean().data(), data.stddev().data(), s,
                          env.stream);
  });
}

}  // namespace renaissance::runtime
