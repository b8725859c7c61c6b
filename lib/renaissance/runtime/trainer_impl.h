// Internal to the trainer's sources (trainer.cpp: the loop and evaluation; trainer_bench.cpp: bench and profile;
// trainer_weights.cpp: weights files; trainer_checkpoint.cpp: checkpoints and resume): Trainer::Impl, the state
// and step machinery they share. Not installed, not for other modules.
#pragma once

#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/error.h>
#include <renaissance/core/philox.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/engine_cache_file.h>
#include <renaissance/runtime/memory_guard.h>
#include <renaissance/runtime/replicas.h>
#include <renaissance/runtime/sharding.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cpu/half.h>

#include <fmt/format.h>
#include <renaissance/core/log.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

namespace renaissance::runtime {

using plan::GraphId;
using plan::Variant;

namespace trainer_detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr std::uint32_t kPurposeInit = 0x494e4954;  // "INIT"

/// `order` and its augmentation keys without the first `count` entries (a run resumed mid-epoch).
inline std::vector<std::int64_t> drop_batches(std::vector<std::int64_t> order, std::vector<std::int64_t>* positions,
                                              std::int64_t count) {
  count = std::min<std::int64_t>(count, static_cast<std::int64_t>(order.size()));
  order.erase(order.begin(), order.begin() + count);
  positions->erase(positions->begin(),
                   positions->begin() + std::min<std::int64_t>(count, static_cast<std::int64_t>(positions->size())));
  return order;
}

/// The batches of a pass over the device cache: counts and numbers as BatchLoader would deliver them (no pixels).
class CachedBatches {
 public:
  CachedBatches(std::size_t samples, std::int64_t batch)
      : m_samples(static_cast<std::int64_t>(samples)), m_batch(batch) {}
  std::optional<io::Batch> next() {
    if (m_next >= m_samples) return std::nullopt;
    io::Batch b;
    b.count = std::min(m_batch, m_samples - m_next);
    b.index = m_next / m_batch;
    b.first_position = m_next;
    m_next += b.count;
    return b;
  }

 private:
  std::int64_t m_samples, m_batch, m_next = 0;
};

/// A pass over a JPEG store decoded ahead on the GPU (GpuJpegInput::begin..end) while it is in scope; inactive
/// (false) without GPU decode or without a loader (the device cache). Declared after the loader: ends before it.
class JpegAhead {
 public:
  JpegAhead(GpuJpegInput* in, io::BatchLoader* loader, io::Split split, int decoders)
      : m_in(in && loader ? in : nullptr) {
    if (m_in) m_in->begin(*loader, split, decoders);
  }
  ~JpegAhead() { end(); }
  /// Ends the pass now (before a validation pass begins its own); the object stays true.
  void end() noexcept {
    if (m_in) m_in->end();
  }
  JpegAhead(const JpegAhead&) = delete;
  JpegAhead& operator=(const JpegAhead&) = delete;
  explicit operator bool() const { return m_in != nullptr; }

 private:
  GpuJpegInput* m_in;
};

/// `path` made absolute and normal (provenance attributes); unchanged when that fails.
inline std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

/// Trainer's constructor: `st` matched against the compiled plan as load_state will match it, and what a resume
/// cannot continue with (another --drop-last); throws the error load_state would throw, before any device work.
void check_initial_state(const plan::CompiledPlan& cp, const TrainOptions& o, const InitialState& st);

/// The weights file group of a tensor and its name there (EMA copies drop their ".ema" suffix).
inline bool weights_group(const DTensor& t, std::string* group, std::string* name) {
  const RegionFamily f = region_family(t.region);
  *name = t.name;
  if (f == RegionFamily::W && t.region != Region::W_EQ_BIAS && t.region != Region::W_EQ_SCALE) {
    *group = "params";
  } else if (t.region == Region::B_PREV_MEAN || t.region == Region::B_PREV_VAR) {
    *group = "bn";
  } else if (f == RegionFamily::E && t.dtype == DType::F32) {
    *group = "ema";
    name->erase(name->size() - 4);  // ".ema"
  } else {
    return false;
  }
  return true;
}

/// Before a checkpoint or weights file is written, and at the end of an AMP epoch whose loss was not finite: every
/// value finite, else the run diverged (AMP's loss scaling skips steps whose gradients overflow, but an update that
/// makes the weights overflow is not undone: the run went on to "done" with NaN weights, exit 0, and its checkpoints,
/// which no reader accepts, pushed the good ones out). Throws Error naming the first tensor; nothing is written.
inline void require_not_diverged(const std::vector<io::NamedTensor>& tensors, std::int64_t step) {
  for (const io::NamedTensor& nt : tensors)
    for (std::size_t i = 0; i < nt.values.size(); ++i)
      if (!std::isfinite(nt.values[i]))
        throw DivergedError(
            fmt::format("the run diverged by step {}: /{}/{} holds a non-finite value ({} at element {}); "
                        "nothing more is written (the files written before stay)",
                        step, nt.group, nt.name, nt.values[i], i),
            "training",
            "lower --lr (with --amp, the loss scaling skips overflowing steps but cannot undo an update that "
            "overflowed the weights)");
}

/// With --amp, before a checkpoint or weights file is written and at each epoch's end: the last step did not overflow
/// FP16 at the lowest loss scale (1; LOSS_SCALE_UPDATE marks that with a clean-step count of -1, which the next clean
/// step clears). No scale makes such a step fit: a run whose update had made the weights finite but too large for
/// FP16 skipped every step after it and ended "done", exit 0, saving those weights (with the BN running statistics
/// left alone by skipped steps, no tensor turns non-finite to tell). Only the step before the check counts: an
/// overflow at scale 1 that a clean step follows is not seen. Throws DivergedError.
inline void require_loss_scale_left(const std::array<float, plan::kLossScaleSlots>& ls, std::int64_t step) {
  if (ls[plan::kLossScaleCleanSteps] >= 0.0f) return;
  throw DivergedError(fmt::format("the run diverged by step {}: its last step overflowed FP16 at loss scale 1, the "
                                  "lowest (no scale makes such a step fit: the scale had halved at every overflow "
                                  "since it was last raised); nothing more is written (the files written before stay)",
                                  step),
                      "training",
                      "lower --lr (the loss scaling skips overflowing steps but cannot undo an update that made the "
                      "activations or gradients too large for FP16)");
}

/// This rank's part of an epoch of `train_samples` (sharding.h) under `opts`' batch, ranks and --drop-last.
inline ShardLayout shard_of(const TrainOptions& opts, std::int64_t train_samples) {
  return shard_layout(train_samples, opts.batch, opts.comm ? opts.comm->world_size() : 1,
                      opts.comm ? opts.comm->rank() : 0, opts.drop_last);
}

}  // namespace trainer_detail
using namespace trainer_detail;  // NOLINT: the trainer's own files share these

struct Trainer::Impl {
  TrainOptions opt;
  io::DatasetFile data;
  const plan::CompiledPlan& plan;
  ArenaKeeper arena;
  DeviceContext ctx;
  const KernelTable& table;
  GraphAtlas atlas;
  ExecEnv env;
  std::unique_ptr<BackendSession> session;
  std::byte* staging[2] = {nullptr, nullptr};
  std::byte* hyper_staging[2] = {nullptr, nullptr};  ///< per-slot pinned copies of the step scalars
  std::int64_t staging_bytes = 0;
  std::int64_t staging_labels_off = 0, staging_data_off = 0;
  std::int64_t img_h = 0, img_w = 0, img_c = 0;  ///< the images the training loader delivers at full resolution
  int world = 1, rank = 0;                       ///< data-parallel ranks (DESIGN §9)
  std::vector<std::uint8_t> resized;
  /// The input pipeline on the host (issue 12): loader threads that decode (JPEG stores) and render (crop, resize,
  /// flip) samples, and normalise batches into the staging buffers.
  std::unique_ptr<io::LoaderPool> pool;
  bool stored_is_model_size =
      true;  ///< a raw store of the model's H x W: validation copies, crop none trains as stored
  std::int64_t model_h = 0, model_w = 0;
  /// The device-resident dataset cache (gpu_input.h), when --data-cache lets the run use one: batches are gathered
  /// on the GPU instead of loaded, staged and copied.
  std::unique_ptr<GpuDataCache> cache;
  /// A raw store read whole on another thread while the engines are chosen and the step captured, for the cache
  /// (start_cache_prefetch; setup_cache takes it). Declared after `data`, which it reads: destroyed (joined) first.
  std::future<HostDataset> cache_prefetch;
  /// Starts cache_prefetch when the cache may take the store: a GPU run, a raw store of at most kPrefetchMaxBytes
  /// (the host holds a second copy of it until the upload) with that much host memory to spare, --data-cache not off.
  void start_cache_prefetch();
  static constexpr std::int64_t kPrefetchMaxBytes = std::int64_t{1} << 30;
  /// Decides on the cache, uploads the dataset (a JPEG store: decodes it with `jpeg`, then drops the decoder) and
  /// captures its gathers (start-up); returns a line for the log.
  std::string setup_cache();
  /// Starts a pass of the cache over `split`; training passes get each position's shift and flip.
  void begin_cached_pass(io::Split split, const std::vector<std::int64_t>& order, std::int64_t epoch,
                         const std::vector<std::int64_t>* positions);
  /// The cache's gather of the pass's next batch into slot `s`, on the transfer stream (in place of stage + transfer).
  void transfer_cached(io::Split split, int s, std::int64_t count) {
    session->transfer(env, s, [&] { cache->launch(split, s, count, env.stream); });
  }

  /// JPEG stores decoded on the GPU (gpu_jpeg.h), when --decode lets the run: the loader delivers the JPEG bytes,
  /// nvJPEG decodes them and the device cache's render crops and normalises them into I_A / I_B.
  std::unique_ptr<GpuJpegInput> jpeg;
  /// Decides on the GPU decode and creates the decoder (start-up); returns a line for the log.
  std::string setup_jpeg();
  /// Decodes and renders loaded batch `b` (JPEG bytes) of `split` for variant `v` into slot `s`, on the transfer
  /// stream (in place of stage + transfer): the geometry the host loader's render would use, keyed alike.
  void transfer_jpeg(io::Split split, int s, const io::Batch& b, Variant v, std::int64_t epoch,
                     const std::vector<std::int64_t>* positions);
  std::int64_t jpeg_fallbacks_logged = 0;
  /// A warning when nvJPEG left images to the CPU since the last one.
  void log_jpeg_fallbacks();

  /// The loader options that render `split`'s samples for a variant of out_h x out_w (training: the run's
  /// augmentation keyed by positions; validation: a copy or the centre crop), or none where the stored images are
  /// delivered as they are.
  /// `host`: decoded on the host whatever --decode says (logits, bench: they stage host batches).
  io::LoaderOptions loader_options(io::Split split, std::int64_t out_h, std::int64_t out_w, std::int64_t epoch,
                                   const std::vector<std::int64_t>* positions, bool host = false) const {
    io::LoaderOptions lo;
    lo.pool = pool.get();
    if (this->jpeg && !host) {  // the GPU decodes and renders: the loader reads the bytes only
      lo.encoded = true;
      return lo;
    }
    const bool jpeg = data.storage() == io::Storage::jpeg;
    if (split == io::Split::train) {
      // crop none on a raw store: the stored size (progressive resize happens in stage()); otherwise rendered at the
      // variant's size directly (FFCV-style progressive resize). `center` is the validation transform, so on a raw
      // store of the model's size, which validation copies, it is none too.
      Augmentation aug = opt.augmentation;
      if (aug.crop == io::CropMode::center && stored_is_model_size) aug.crop = io::CropMode::none;
      const bool as_stored = aug.crop == io::CropMode::none && !jpeg;
      const std::int64_t h = as_stored ? img_h : out_h, w = as_stored ? img_w : out_w;
      io::AugmentSpec spec = train_spec(aug, h, w);
      if (jpeg && spec.crop == io::CropMode::none) spec.crop = io::CropMode::center;  // a size must come from somewhere
      if (!spec.random() && spec.crop == io::CropMode::none) return lo;               // delivered as stored
      lo.out_h = h;
      lo.out_w = w;
      lo.render = make_render(spec, opt.seed, epoch, positions);
      if (jpeg) lo.region = make_region(spec, opt.seed, epoch, positions);
      return lo;
    }
    const bool same = stored_is_model_size && out_h == img_h && out_w == img_w && !jpeg;
    if (same) return lo;
    lo.out_h = out_h;
    lo.out_w = out_w;
    lo.render = make_render(val_spec(opt.augmentation, out_h, out_w, false), 0, 0, nullptr);
    return lo;
  }

  // Checkpoint and resume (DESIGN §10): where run() stands, so a checkpoint records it and run() resumes there.
  // The definitions are in the checkpoint section at the end of this file.
  std::string model_yaml;         ///< the BluePrint, recorded in checkpoints
  std::int64_t cur_epoch = 0;     ///< the epoch the next step belongs to (0-based)
  std::int64_t cur_position = 0;  ///< batches (global steps) of cur_epoch already trained
  /// The partial epoch's metric sums of every rank ([world, 4], rank-major) when run() stopped mid-epoch or a
  /// checkpoint was loaded; each rank resumes its own (summing in the same order keeps the epoch's metrics exact).
  std::vector<float> stopped_metrics;
  bool preempted = false;
  std::string last_checkpoint;
  double last_lr = 0;  ///< the learning rate of the last step
  double last_momentum = 0;  ///< the momentum of the last step
  /// The validation metrics of the last finished epoch (epoch 0: none), recorded in the checkpoint written at its end.
  EpochMetrics last_epoch_metrics;
  /// --zero-init-residual: the names of the BN scales init_weights starts at 0 (found once, at construction).
  std::vector<std::string> zero_gamma;
  int comm_rank() const { return env.comm ? env.comm->rank() : 0; }
  int comm_world() const { return env.comm ? env.comm->world_size() : 1; }
  /// Collective: the preemption flag agreed over all ranks (MAX).
  bool stop_agreed() const;
  bool checkpoint_due(std::int64_t step) const {
    return !opt.checkpoint_dir.empty() && opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0;
  }
  /// Collective: every rank's partial-epoch metric sums, [world, 4] rank-major, on every rank.
  std::vector<float> gather_train_metrics();
  io::Checkpoint make_checkpoint(std::int64_t step, const std::vector<float>& metrics) const;
  /// Collective: rank 0 writes a checkpoint into opt.checkpoint_dir; every rank learns whether it succeeded.
  void write_checkpoint_in_dir(std::int64_t step, const std::vector<float>& metrics, const TrainObserver& observer);
  /// --keep-best, rank 0: the val_top1 of D/best.h5 as far as this run knows it (NaN: not read yet; -1: none).
  double best_top1 = std::numeric_limits<double>::quiet_NaN();
  /// Collective (--keep-best): at the end of a validated epoch that wrote no checkpoint (--checkpoint-every N off
  /// the epoch's end), rank 0 saves the epoch's checkpoint as D/best.h5 when its val_top1 beats the best so far;
  /// latest.h5 and the step files are left alone. Every rank learns whether it succeeded.
  void keep_best_in_dir(std::int64_t step);
  /// Collective: `write` runs on rank 0; every rank learns whether it succeeded (rank 0 rethrows its error, the others
  /// throw naming `what`).
  void on_rank0_agreed(const std::string& what, const std::function<void()>& write);
  double read_best_top1() const;  ///< best.h5's val_top1 (-1: none, or unreadable: said)
  /// Rank 0: `ck` as D/best.h5 when it beats the one there (logged), best_top1 updated.
  void save_best_in_dir(const io::Checkpoint& ck, std::int64_t step);
  /// The mean loss of the last training step's batch (this rank).
  double step_loss() const;
  /// Uploads this rank's row of stopped_metrics into the accumulators (another world size: rank 0 the total).
  void restore_partial_metrics();

  Impl(const TrainOptions& o, const plan::CompiledPlan& p, io::DatasetFile file)
      : opt(o),
        data(std::move(file)),
        plan(p),
        arena(o.backend, p.arena_bytes()),
        ctx(arena, p),
        table(KernelTable::for_backend(o.backend)),
        atlas(ctx, table),
        session(open_backend(o.backend, env, o.workspace_mib << 20, o.concurrent_streams)) {
    const plan::MemoryPlan& mp = p.plan(Variant::TRAIN_BASE);
    const plan::ByteRange range_a = mp.resolve_region_bounds({Region::I_A_LABEL, Region::I_A_DATA});
    const plan::ByteRange range_b = mp.resolve_region_bounds({Region::I_B_LABEL, Region::I_B_DATA});
    RN_CHECK(range_a.bytes == range_b.bytes, "internal: the A and B input ranges differ in size");
    staging_labels_off = mp.tensor(p.baseline.labels_a).offset - range_a.offset;
    staging_data_off = mp.tensor(p.baseline.data_a).offset - range_a.offset;
    RN_CHECK(mp.tensor(p.baseline.labels_b).offset - range_b.offset == staging_labels_off &&
                 mp.tensor(p.baseline.data_b).offset - range_b.offset == staging_data_off,
             "internal: the A and B input buffers are laid out differently");
    staging_bytes = range_a.bytes;
    for (auto& s : staging) s = session->host_alloc(staging_bytes);  // pinned on a GPU: capturable H2D copies
    for (auto& h : hyper_staging) h = session->host_alloc(static_cast<std::int64_t>(sizeof(float) * plan::kHyperSlots));
    env.host_input[0] = staging[0];
    env.host_input[1] = staging[1];
    env.comm = o.comm;
    env.sync_bn = o.sync_bn;
    env.fuse_kernels = o.fuse_kernels;
    env.deterministic = o.deterministic;
    env.conv_api = o.conv_api;
    env.own_kernels = o.own_kernels;
    env.conv_stats = o.conv_stats;
    world = o.comm ? o.comm->world_size() : 1;
    rank = o.comm ? o.comm->rank() : 0;
    const io::SplitInfo& tr = data.info(io::Split::train);
    const DTensor& input = mp.tensor(p.baseline.data_a);  // the model's input at full resolution
    model_h = input.shape.h;
    model_w = input.shape.w;
    img_c = data.channels();
    stored_is_model_size = data.storage() == io::Storage::raw && tr.height == model_h && tr.width == model_w;
    // The training loader delivers the stored size when it only copies or shifts/flips a raw store (progressive
    // resize then resizes in stage()); the model's size when it crops (random-resized, centre) or decodes JPEGs.
    const bool as_stored = (o.augmentation.crop == io::CropMode::none ||
                            (o.augmentation.crop == io::CropMode::center && stored_is_model_size)) &&
                           data.storage() == io::Storage::raw;
    img_h = as_stored ? tr.height : model_h;
    img_w = as_stored ? tr.width : model_w;
    const int threads = o.loader_threads > 0 ? o.loader_threads : io::available_cpus();
    pool = std::make_unique<io::LoaderPool>(std::max(0, threads - 1));  // the calling thread is one of them
  }

  ~Impl() {
    // Also on an error: with several GPU ranks the work in flight may wait for a peer that never comes.
    if (env.comm) env.comm->device_wait_begin("the device work in flight at shutdown (NCCL all-reduce)");
    session->synchronize();
    if (env.comm) env.comm->device_wait_end();
    for (std::byte* s : staging) session->host_free(s);
    for (std::byte* h : hyper_staging) session->host_free(h);
  }

  /// Waits until the step two batches back is done with slot `s`. With several GPU ranks that step holds NCCL
  /// collectives: the communicator's watchdog bounds the wait (a dead or stopped peer never completes them).
  void wait_slot(int s) {
    if (env.comm) env.comm->device_wait_begin("a step's device work (NCCL all-reduce)");
    session->wait_slot(s);
    if (env.comm) env.comm->device_wait_end();
  }

  void replay(Variant v, GraphId g, bool graphs = true) {
    const CapturedGraph& c = atlas.get(v, g, env);
    if (graphs)
      c.replay(env);
    else
      c.run_uncaptured(env);
  }

  /// Prepares and captures every subgraph a run can need (every bucket of the plan's step schedule, for every
  /// variant that replays it), so nothing is allocated or captured mid-training (cuDNN algorithm choice, LARS segment
  /// tables and CUDA graph instantiation all happen here).
  void capture_all() {
    const bool lowres = opt.start_resolution > 0 && opt.lowres_epochs > 0;
    for (Variant v : {Variant::TRAIN_BASE, Variant::TRAIN_LAST, Variant::TRAIN_LOWRES, Variant::TRAIN_LOWRES_LAST}) {
      if (!lowres && (v == Variant::TRAIN_LOWRES || v == Variant::TRAIN_LOWRES_LAST)) continue;
      for (const plan::ScheduleEntry& e : plan.schedule.entries)
        if (!plan::is_inference_phase(e.phase)) atlas.get(v, e.graph, env);
    }
    if (opt.validate || opt.ema)
      for (Variant v : {Variant::VAL_BASE, Variant::VAL_LAST})
        for (const plan::ScheduleEntry& e : plan.schedule.entries)
          if (e.phase == plan::StepPhase::TRANSFER || plan::is_inference_phase(e.phase)) atlas.get(v, e.graph, env);
    for (int s = 0; s < 2; ++s) step_entries[s] = plan.schedule.of(plan::StepPhase::TRAIN_STEP, s);
  }

  /// The TRAIN_STEP entries of the schedule for input buffer A (0) and B (1).
  std::array<std::vector<plan::ScheduleEntry>, 2> step_entries;

  /// Replays the entries of `phase` (for input buffer `slot`, or -1) on variant `v`, in schedule order.
  void replay_phase(Variant v, plan::StepPhase phase, int slot = -1) {
    for (const plan::ScheduleEntry& e : plan.schedule.of(phase, slot)) replay(v, e.graph);
  }

  /// One optimizer step on the batch in input buffer `s` (A = 0, B = 1), as the plan's step schedule orders it
  /// (plan/step_schedule.cpp): compute-stream entries in order; a run of SIDE or UPDATE entries forked off the compute
  /// stream (session->side / update), the side stream joined before the entry that reads its work, both at the end.
  /// Returns the NaN flag on the CPU (a GPU never reads it inside the step: AMP skips the update on the device, FP32
  /// checks the epoch loss).
  bool step(Variant v, int s, bool graphs) {
    const std::vector<plan::ScheduleEntry>& entries = step_entries[s];
    bool nan = false, side_open = false, update_open = false;
    for (std::size_t i = 0; i < entries.size();) {
      const plan::ScheduleEntry& e = entries[i];
      if (e.joins == plan::Stream::SIDE && side_open) {
        session->join_side(env);
        side_open = false;
      }
      if (e.stream == plan::Stream::SIDE || e.stream == plan::Stream::UPDATE) {
        std::size_t j = i;
        while (j < entries.size() && entries[j].stream == e.stream) ++j;
        const auto run = [&, i, j] {
          for (std::size_t k = i; k < j; ++k) replay(v, entries[k].graph, graphs);
        };
        if (e.stream == plan::Stream::SIDE) {
          session->side(env, run);
          side_open = true;
        } else {
          session->update(env, run);
          update_open = true;
        }
        i = j;
        continue;
      }
      replay(v, e.graph, graphs);
      if (e.graph == GraphId::NAN_CHECK_AND_GRAD_SCALING) nan = opt.backend == Backend::CPU && nan_flag() != 0;
      ++i;
    }
    if (side_open) session->join_side(env);
    if (update_open) session->join_update(env);
    return nan;
  }

  StartupTimes startup;

  /// benchmark() and profile(): one batch in both input buffers, the step scalars uploaded (definition below).
  std::int64_t stage_bench_batch();

  // Host mirrors of the device-resident scalars: written by the trainer, uploaded before the step.
  std::array<float, plan::kHyperSlots> hyper{};
  void push_hyper() const { ctx.upload(plan.baseline.hyper, hyper.data(), sizeof hyper); }
  /// The per-step upload: through slot `s`'s pinned copy, ordered with the compute work, no host wait.
  void push_hyper_async(int s) {
    std::memcpy(hyper_staging[s], hyper.data(), sizeof hyper);
    session->upload_async(ctx.ptr_at(plan.baseline.hyper), hyper_staging[s], sizeof hyper);
  }
  /// H2D of the batch staged in slot `s` (GPU: on the transfer stream, beside the step still running).
  void transfer(Variant v, int s) {
    session->transfer(env, s, [&] { replay(v, s == 0 ? GraphId::TRANSFER_A : GraphId::TRANSFER_B); });
  }
  std::array<float, plan::kLossScaleSlots> read_loss_scale() const {
    std::array<float, plan::kLossScaleSlots> v{};
    ctx.download(plan.baseline.loss_scale, v.data(), sizeof v);
    return v;
  }
  std::int32_t nan_flag() const {
    std::int32_t f = 0;
    ctx.download(plan.baseline.nan_flag, &f, sizeof f);
    return f;
  }
  std::array<float, plan::kResultSlots> accumulated() const {
    std::array<float, plan::kResultSlots> v{};
    ctx.download(plan.baseline.accumulated, v.data(), sizeof v);
    return v;
  }

  /// Deterministic initialisation keyed by (seed, the weight's ordinal among the plan's master weights):
  /// torchvision's choices. Not by tensor id: options that add tensors beside the weights (--ema, the optimizer's
  /// moments, AMP's FP16 copies) shift the ids, and the same seed must give the same initial weights whatever they are.
  void init_weights() {
    const plan::MemoryPlan& mp = plan.plan(Variant::TRAIN_BASE);
    std::uint64_t ordinal = 0;  // of the master weights (family W), in plan order
    // The whole arena starts at zero, whatever start-up left in it. On a GPU every subgraph ran once before its
    // capture (on whatever the arena held then: the softmax gradient of zero logits reaches the FC bias) and the
    // engine timing ran the convolutions on the layers' own tensors; a run whose engines came from the cache times
    // nothing. Without this, bytes a step reads before it writes (padding lanes, accumulators) would differ between
    // such runs (issue 11: two AMP trainings in one process differed from the first step's loss on).
    ctx.fill_at(arena.base(), 0, static_cast<std::int64_t>(arena.bytes()));
    // So do the workspaces, where the timing ran its candidates (and left other bytes than a cached start-up).
    session->fill_workspaces(opt.debug_workspace_fill >= 0 ? opt.debug_workspace_fill & 0xFF : 0);
    // The random tensors are drawn in pieces of kInitPiece values on the loader threads: each piece seeks its
    // weight's stream to its first value (PhiloxStream::seek), so the values are those of one sequential stream.
    // (One thread drew ResNet-18's 11 M values in ~0.45 s of a 2-3 s start-up on the H100.)
    constexpr std::int64_t kInitPiece = std::int64_t{1} << 16;  // a multiple of 4 values: pieces start on a block
    auto draw = [&](float* w, std::int64_t n, std::uint64_t stream, bool normal, float scale) {
      const std::int64_t pieces = (n + kInitPiece - 1) / kInitPiece;
      auto piece = [&](std::int64_t p) {
        const std::int64_t first = p * kInitPiece, last = std::min(n, first + kInitPiece);
        PhiloxStream rng(opt.seed, stream, kPurposeInit);
        rng.seek(static_cast<std::uint32_t>(normal ? first / 2 : first / 4));  // normal(): 2 values, uniform(): 1
        if (normal)
          for (std::int64_t i = first; i < last; ++i) w[i] = rng.normal() * scale;
        else
          for (std::int64_t i = first; i < last; ++i) w[i] = (2.0f * rng.uniform() - 1.0f) * scale;
      };
      if (pool && pieces > 1)
        pool->parallel_for(pieces, piece);
      else
        for (std::int64_t p = 0; p < pieces; ++p) piece(p);
    };
    for (const DTensor& t : mp.tensors()) {
      const RegionFamily f = region_family(t.region);
      if (f != RegionFamily::W && f != RegionFamily::B) continue;
      const std::int64_t n = t.shape.elems();
      std::vector<float> host(static_cast<std::size_t>(n));
      float* w = host.data();
      const std::uint64_t stream = f == RegionFamily::W ? ordinal++ : ~std::uint64_t{0};
      switch (t.region) {
        case Region::W_FIRST_CONV:
        case Region::W_DEEP_CONV: {
          // kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (out · kh · kw)).
          const float stddev = std::sqrt(2.0f / static_cast<float>(t.shape.n * t.shape.h * t.shape.w));
          draw(w, n, stream, true, stddev);
          break;
        }
        case Region::W_FC_WEIGHT:
        case Region::W_FC_BIAS: {
          // nn.Linear / nn.Conv2d default: U(−1/√fan_in, 1/√fan_in) for the weight and the bias.
          std::int64_t fan_in = t.shape.h * t.shape.w * t.shape.c;
          if (t.region == Region::W_FC_BIAS) {
            const std::string wname = t.name.substr(0, t.name.rfind('.')) + ".w";
            const DTensor& wt = mp.tensor(mp.at(wname));
            fan_in = wt.shape.h * wt.shape.w * wt.shape.c;
          }
          draw(w, n, stream, false, 1.0f / std::sqrt(static_cast<float>(fan_in)));
          break;
        }
        case Region::W_BN_WEIGHT: {
          const bool zero = std::find(zero_gamma.begin(), zero_gamma.end(), t.name) != zero_gamma.end();
          std::fill(w, w + n, zero ? 0.0f : 1.0f);
          break;
        }
        case Region::B_PREV_VAR: std::fill(w, w + n, 1.0f); break;
        default: std::fill(w, w + n, 0.0f);
      }
      ctx.upload(t.id, host.data(), n * static_cast<std::int64_t>(sizeof(float)));
    }
    // Optimizer state, gradients, features and scratch stay at the zero written above.
    // EMA starts at the initial weights.
    if (opt.ema) {
      const plan::ByteRange wr = mp.resolve_region_bounds({Region::W_BN_BIAS, Region::W_DEEP_CONV});
      const plan::ByteRange er = mp.resolve_region_bounds({Region::E_BN_BIAS, Region::E_DEEP_CONV});
      RN_CHECK(wr.bytes == er.bytes, "internal: EMA range differs from the master range");
      std::vector<std::byte> masters(static_cast<std::size_t>(wr.bytes));
      ctx.download_at(arena.base() + wr.offset, masters.data(), wr.bytes);
      ctx.upload_at(arena.base() + er.offset, masters.data(), er.bytes);
    }
    float* h = hyper.data();
    h[plan::kHyperMomentum] = static_cast<float>(opt.momentum);
    h[plan::kHyperBeta1] = static_cast<float>(opt.beta1);
    h[plan::kHyperBeta2] = static_cast<float>(opt.beta2);
    h[plan::kHyperEps] = static_cast<float>(opt.eps);
    h[plan::kHyperWeightDecay] = static_cast<float>(opt.weight_decay);
    h[plan::kHyperLarsEta] = static_cast<float>(opt.lars_eta);
    h[plan::kHyperEmaDecay] = static_cast<float>(opt.ema_decay);
    h[plan::kHyperLabelSmoothing] = static_cast<float>(opt.label_smoothing);
    h[plan::kHyperBnMomentum] = static_cast<float>(opt.bn_momentum);
    h[plan::kHyperBnEps] = static_cast<float>(opt.bn_eps);
    h[plan::kHyperWorldSize] = static_cast<float>(world);
    push_hyper();
    std::array<float, plan::kLossScaleSlots> ls{};
    ls[plan::kLossScale] = opt.amp ? static_cast<float>(opt.loss_scale) : 1.0f;
    ls[plan::kLossScaleCleanSteps] = 0.0f;
    ls[plan::kLossScaleInterval] = static_cast<float>(opt.loss_scale_interval);
    ls[plan::kLossScaleFactor] = 2.0f;
    ctx.upload(plan.baseline.loss_scale, ls.data(), sizeof ls);
    if (opt.amp) replay(Variant::TRAIN_BASE, GraphId::CAST_W_TO_A);
    replay(Variant::TRAIN_BASE, GraphId::CLEAR_METRICS);
    session->synchronize();
  }

  /// TrainOptions::debug_poison_families: 0xFF over every tensor of the listed region families.
  void poison_families(const std::string& list) {
    std::vector<std::string> want;
    for (std::size_t a = 0; a <= list.size();) {
      const std::size_t b = std::min(list.find(',', a), list.size());
      if (b > a) want.push_back(list.substr(a, b - a));
      a = b + 1;
    }
    for (const DTensor& t : plan.plan(Variant::TRAIN_BASE).tensors()) {
      const std::string f = region_family_name(region_family(t.region));
      if (std::find(want.begin(), want.end(), f) == want.end()) continue;
      ctx.fill_at(ctx.ptr_at(t.id), 0xFF, t.shape.elems() * static_cast<std::int64_t>(dtype_size(t.dtype)));
    }
  }

  /// Writes one loaded batch into staging buffer `s` in the arena's layout (labels, normalised data).
  void stage(int s, const io::Batch& b, Variant v) {
    const DTensor& dt = plan.plan(v).tensor(s == 0 ? plan.baseline.data_a : plan.baseline.data_b);
    std::memcpy(staging[s] + staging_labels_off, b.labels, static_cast<std::size_t>(b.count) * 4);
    const std::uint8_t* images = b.images;
    const std::int64_t bh = b.height > 0 ? b.height : img_h, bw = b.width > 0 ? b.width : img_w;
    if (dt.shape.h != bh || dt.shape.w != bw) {
      // Progressive resize of stored images: the low-resolution variants get bilinearly downscaled images.
      resized.resize(static_cast<std::size_t>(b.count * dt.shape.h * dt.shape.w * img_c));
      resize_images(b.images, b.count, bh, bw, img_c, resized.data(), dt.shape.h, dt.shape.w);
      images = resized.data();
    }
    normalize_images(pool.get(), images, b.count, dt.shape.h, dt.shape.w, img_c, data.mean().data(),
                     data.stddev().data(), staging[s] + staging_data_off, dt.dtype, dt.shape.c);
  }

  void check_labels(const io::Batch& b) const {
    const int classes = static_cast<int>(plan.arch.num_classes);
    for (std::int64_t i = 0; i < b.count; ++i)
      if (b.labels[i] < 0 || b.labels[i] >= classes)
        throw Error(fmt::format("label {} of batch {} sample {} is outside [0, {})", b.labels[i], b.index, i, classes),
                    data.path(), "the dataset's num_classes must match the model's classes");
  }
};

}  // namespace renaissance::runtime
