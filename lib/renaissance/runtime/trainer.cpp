#include <renaissance/core/error.h>
#include <renaissance/core/philox.h>
#include <renaissance/blueprint/yaml.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/engine_cache_file.h>
#include <renaissance/runtime/replicas.h>
#include <renaissance/runtime/sharding.h>
#include <renaissance/runtime/memory_guard.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cpu/half.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

namespace renaissance::runtime {

using plan::GraphId;
using plan::Variant;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr std::uint32_t kPurposeInit = 0x494e4954;  // "INIT"

/// `order` and its augmentation keys without the first `count` entries (a run resumed mid-epoch).
std::vector<std::int64_t> drop_batches(std::vector<std::int64_t> order, std::vector<std::int64_t>* positions,
                                       std::int64_t count) {
  count = std::min<std::int64_t>(count, static_cast<std::int64_t>(order.size()));
  order.erase(order.begin(), order.begin() + count);
  positions->erase(positions->begin(), positions->begin() + std::min<std::int64_t>(count, static_cast<std::int64_t>(positions->size())));
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

}  // namespace

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
  int world = 1, rank = 0;  ///< data-parallel ranks (DESIGN §9)
  std::vector<std::uint8_t> resized;
  /// The input pipeline on the host (issue 12): loader threads that decode (JPEG stores) and render (crop, resize,
  /// flip) samples, and normalise batches into the staging buffers.
  std::unique_ptr<io::LoaderPool> pool;
  bool stored_is_model_size = true;  ///< a raw store of the model's H x W: validation copies, crop none trains as stored
  std::int64_t model_h = 0, model_w = 0;
  /// The device-resident dataset cache (gpu_input.h), when --data-cache lets the run use one: batches are gathered
  /// on the GPU instead of loaded, staged and copied.
  std::unique_ptr<GpuDataCache> cache;
  /// Decides on the cache, uploads the dataset and captures its gathers (start-up); returns a line for the log.
  std::string setup_cache();
  /// Starts a pass of the cache over `split`; training passes get each position's shift and flip.
  void begin_cached_pass(io::Split split, const std::vector<std::int64_t>& order, std::int64_t epoch,
                         const std::vector<std::int64_t>* positions);
  std::int64_t img_h_stored() const { return data.info(io::Split::train).height; }
  std::int64_t img_w_stored() const { return data.info(io::Split::train).width; }
  /// The cache's gather of the pass's next batch into slot `s`, on the transfer stream (in place of stage + transfer).
  void transfer_cached(io::Split split, int s, std::int64_t count) {
    session->transfer(env, s, [&] { cache->launch(split, s, count, env.stream); });
  }

  /// The loader options that render `split`'s samples for a variant of out_h x out_w (training: the run's
  /// augmentation keyed by positions; validation: a copy or the centre crop), or none where the stored images are
  /// delivered as they are.
  io::LoaderOptions loader_options(io::Split split, std::int64_t out_h, std::int64_t out_w, std::int64_t epoch,
                                   const std::vector<std::int64_t>* positions) const {
    io::LoaderOptions lo;
    lo.pool = pool.get();
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
      if (!spec.random() && spec.crop == io::CropMode::none) return lo;  // delivered as stored
      lo.out_h = h;
      lo.out_w = w;
      lo.render = make_render(spec, opt.seed, epoch, positions);
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
  /// The validation metrics of the last finished epoch (epoch 0: none), recorded in the checkpoint written at its end.
  EpochMetrics last_epoch_metrics;
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

  /// Deterministic initialisation keyed by (seed, tensor id): torchvision's choices.
  void init_weights() {
    const plan::MemoryPlan& mp = plan.plan(Variant::TRAIN_BASE);
    for (const DTensor& t : mp.tensors()) {
      const RegionFamily f = region_family(t.region);
      if (f != RegionFamily::W && f != RegionFamily::B) continue;
      const std::int64_t n = t.shape.elems();
      std::vector<float> host(static_cast<std::size_t>(n));
      float* w = host.data();
      PhiloxStream rng(opt.seed, static_cast<std::uint64_t>(t.id), kPurposeInit);
      switch (t.region) {
        case Region::W_FIRST_CONV:
        case Region::W_DEEP_CONV: {
          // kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (out · kh · kw)).
          const float stddev = std::sqrt(2.0f / static_cast<float>(t.shape.n * t.shape.h * t.shape.w));
          for (std::int64_t i = 0; i < n; ++i) w[i] = rng.normal() * stddev;
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
          const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
          for (std::int64_t i = 0; i < n; ++i) w[i] = (2.0f * rng.uniform() - 1.0f) * bound;
          break;
        }
        case Region::W_BN_WEIGHT:
        case Region::B_PREV_VAR: std::fill(w, w + n, 1.0f); break;
        default: std::fill(w, w + n, 0.0f);
      }
      ctx.upload(t.id, host.data(), n * static_cast<std::int64_t>(sizeof(float)));
    }
    // Optimizer state and gradients start at zero. The arena was zeroed at creation, but on a GPU every subgraph ran
    // once at start-up (the warm-up before its capture, on whatever the arena held then: the softmax gradient of zero
    // logits reaches the FC bias), so the moments are reset here, not assumed.
    {
      std::vector<std::byte> zeros;
      for (const DTensor& t : mp.tensors()) {
        const RegionFamily f = region_family(t.region);
        if (f != RegionFamily::M && f != RegionFamily::V && f != RegionFamily::N && f != RegionFamily::G &&
            f != RegionFamily::G16)
          continue;
        const auto bytes = static_cast<std::size_t>(t.shape.elems()) * dtype_size(t.dtype);
        if (zeros.size() < bytes) zeros.assign(bytes, std::byte{0});
        ctx.upload(t.id, zeros.data(), static_cast<std::int64_t>(bytes));
      }
    }
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

Trainer::Trainer(const blueprint::BluePrint& model, TrainOptions opts) {
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
  const bool renders = opts.augmentation.crop != io::CropMode::none || probe.storage() == io::Storage::jpeg;
  if (!renders)
    RN_CHECK_CTX(bp.in_h == tr.height && bp.in_w == tr.width, opts.data_path,
                 "images are {}x{} but model '{}' expects {}x{} (hint: --crop random-resized or --crop center renders "
                 "them at the model's size)",
                 tr.height, tr.width, bp.name, bp.in_h, bp.in_w);
  if (probe.storage() == io::Storage::jpeg && opts.augmentation.crop == io::CropMode::none &&
      (!opts.comm || opts.comm->rank() == 0))
    spdlog::info("{}: a JPEG store: training images are resized and centre-cropped to {}x{} (--crop random-resized "
                 "for random crops)",
                 opts.data_path, bp.in_h, bp.in_w);
  const double t_start = now_s();
  plan::BuildOptions bo;
  bo.amp = opts.amp;
  bo.fuse = opts.amp && opts.fuse;
  plan::TrainConfig cfg;
  // Data-parallel: each rank's plan is compiled for its share of every global batch (sharding.h).
  const int world = opts.comm ? opts.comm->world_size() : 1;
  const ShardLayout shard = shard_layout(tr.count, opts.batch, world, opts.comm ? opts.comm->rank() : 0);
  cfg.dataset_size = shard.rank_samples();
  cfg.batch = shard.rank_batch;
  cfg.val_size = std::max<std::int64_t>(va.count, 1);
  cfg.val_batch = opts.val_batch > 0 ? std::max<std::int64_t>(1, opts.val_batch / world) : 0;
  cfg.optimizer = opts.optimizer;
  cfg.ema = opts.ema;
  cfg.amp = opts.amp;
  cfg.start_resolution = opts.start_resolution;
  cfg.reuse_memory = opts.reuse_memory;
  // DESIGN §9: rank 0 alone builds and compiles the plan and broadcasts it; each rank's inputs and options are
  // checked against rank 0's first (a difference is the same error on every rank, before any capture).
  m_plan = distribute_plan(opts.comm, bp, bo, cfg, describe_run_options(opts));
  RN_CHECK_CTX(m_plan->arch.num_classes == probe.num_classes(), opts.data_path,
               "the dataset has {} classes but model '{}' predicts {}", probe.num_classes(), bp.name,
               m_plan->arch.num_classes);
  if (opts.backend == Backend::CUDA)  // before the arena and the workspace exist: a clear error, not a cudaMalloc one
    guard_device_memory({fmt::format("model '{}' (batch {}, {})", bp.name, opts.batch, opts.amp ? "amp" : "fp32"),
                         m_plan->arena_bytes(), opts.workspace_mib << 20, 0});
  const double t_compiled = now_s();
  m_impl = std::make_unique<Impl>(opts, *m_plan, std::move(probe));  // the file opened once
  Impl& I = *m_impl;
  I.startup.compile_s = t_compiled - t_start;
  auto log0 = [&](const std::string& line) {
    if (line.empty() || I.rank != 0) return;
    if (line.rfind("warning: ", 0) == 0)
      spdlog::warn("{}", line.substr(9));
    else
      spdlog::info("{}", line);
  };
  const bool gpu = opts.backend == Backend::CUDA;
  if (gpu && !opts.deterministic)
    log0("--deterministic off: non-deterministic cuDNN engines and cuBLASLt reductions are admitted where they are "
         "faster; runs with the same seed are not bit-identical");
  if (gpu) log0(load_engine_cache(opts.engine_cache));
  const EngineStats e0 = engine_stats();
  const double t_capture = now_s();
  I.capture_all();
  const EngineStats e1 = engine_stats();
  I.startup.engines_s = e1.seconds - e0.seconds;
  I.startup.capture_s = now_s() - t_capture - I.startup.engines_s;
  I.startup.engines_cached = static_cast<std::int64_t>(e1.cached - e0.cached);
  I.startup.engines_chosen = static_cast<std::int64_t>(e1.chosen - e0.chosen);
  for (const std::string& d : conv_engines())
    if (d.find("[legacy") != std::string::npos) ++I.startup.engines_legacy;
  if (gpu) {
    if (e1.rejected > e0.rejected)
      log0(fmt::format("warning: {} cached engine choice(s) could not be used again and were chosen afresh (first: {})",
                       e1.rejected - e0.rejected, e1.first_rejection));
    log0(save_engine_cache(opts.engine_cache));
    if (I.startup.engines_cached + I.startup.engines_chosen > 0)
      log0(fmt::format("convolution engines: {} from the cache, {} chosen in {:.1f} s, {} on the legacy API",
                       I.startup.engines_cached, I.startup.engines_chosen, I.startup.engines_s,
                       I.startup.engines_legacy));
  }
  log0(I.setup_cache());
  const double t_init = now_s();
  I.init_weights();
  I.startup.init_s = now_s() - t_init;
  try {
    m_impl->model_yaml = blueprint::blueprint_to_yaml(model);  // recorded in checkpoints
  } catch (const std::exception&) {
    m_impl->model_yaml.clear();  // a model the YAML form cannot express: checkpoints then need --model
  }
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
  const ShardLayout shard = shard_layout(n, o.batch, I.world, I.rank);
  const std::int64_t batches = shard.batches();
  if (I.rank == 0 && shard.epoch_samples < n)
    spdlog::info("{} ranks: the last {} sample(s) of each epoch's order are not trained (the partial global batch "
                 "of {} is split evenly over the ranks)", I.world, n - shard.epoch_samples, n % o.batch);
  const std::int64_t total_steps = o.max_steps > 0 ? std::min(o.max_steps, batches * o.epochs) : batches * o.epochs;
  Schedule sched;
  sched.kind = o.schedule;
  sched.base_lr = o.lr;
  sched.total_steps = total_steps;
  sched.warmup_steps = static_cast<std::int64_t>(o.warmup_epochs * static_cast<double>(batches));
  sched.step_size = o.step_epochs * batches;
  sched.gamma = o.step_gamma;
  const std::uint64_t seed = o.seed;
  std::vector<EpochMetrics> history;
  I.preempted = false;
  if (I.cur_position > 0) I.restore_partial_metrics();  // resuming mid-epoch: the epoch's sums so far
  for (std::int64_t epoch = I.cur_epoch; epoch < o.epochs && m_step < total_steps; ++epoch) {
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
    std::int64_t samples = 0;
    double lr = 0;
    while (auto b = loader ? loader->next() : cached.next()) {
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
      } else {
        I.check_labels(*b);
        I.stage(s, *b, v);
        I.transfer(v, s);
      }
      lr = sched.lr(m_step);
      I.last_lr = lr;
      I.hyper[plan::kHyperLr] = static_cast<float>(lr);
      I.hyper[plan::kHyperStep] = static_cast<float>(m_step + 1);
      I.push_hyper_async(s);
      if (o.comm) o.comm->set_step(m_step + 1);
      if (I.step(v, s, true) && !o.amp && o.backend == Backend::CPU)
        throw Error(fmt::format("NaN or inf in the gradients at step {} (epoch {}, batch {})", m_step + 1, epoch + 1,
                                b->index),
                    "training", "the loss diverged: lower --lr, or use --amp for dynamic loss scaling");
      I.session->release_slot(s);
      ++m_step;
      samples += b->count * I.world;  // every rank trains the same count: the global batch
      if (observer.on_step)
        observer.on_step(epoch + 1, first_batch + b->index + 1, batches, static_cast<double>(samples) / (now_s() - t0));
      // Step boundary: checkpoint and preemption policy (collective; an epoch's last step is handled at its end).
      I.cur_position = first_batch + b->index + 1;
      if (observer.on_step_loss && (!observer.wants_step_loss || observer.wants_step_loss(m_step)))
        observer.on_step_loss(m_step, epoch + 1, I.step_loss());
      const bool stop = I.stop_agreed();
      if (stop) I.preempted = true;  // before the checkpoint: a failed write is still a preemption (exit 75)
      if (I.cur_position < batches && (stop || m_step >= total_steps || I.checkpoint_due(m_step))) {
        const std::vector<float> partial = I.gather_train_metrics();
        if (stop || m_step >= total_steps) I.stopped_metrics = partial;
        if (!o.checkpoint_dir.empty()) I.write_checkpoint_in_dir(m_step, partial, observer);
      }
      if (stop) {
        I.preempted = true;
        if (I.cur_position < batches) return history;  // the resumed run reports this epoch whole
        break;
      }
      if (m_step >= total_steps) break;
    }
    const double train_s = now_s() - t0;
    EpochMetrics m;
    m.epoch = epoch + 1;
    m.step = m_step;
    m.train_samples = samples;
    m.seconds = train_s;
    m.images_per_s = static_cast<double>(samples) / train_s;
    m.lr = lr;
    m.loss_scale = I.read_loss_scale()[plan::kLossScale];
    I.replay_phase(Variant::TRAIN_BASE, plan::StepPhase::TRAIN_RESULT);
    const auto acc = I.accumulated();
    const double count = std::max(1.0f, acc[plan::kResultCount]);
    m.train_loss = acc[plan::kResultLoss] / count;
    if (!o.amp && !std::isfinite(m.train_loss))
      throw Error(fmt::format("NaN or inf in the training loss of epoch {} (step {})", epoch + 1, m_step), "training",
                  "the loss diverged: lower --lr, or use --amp for dynamic loss scaling");
    m.train_top1 = acc[plan::kResultTop1] / count;
    I.replay_phase(Variant::TRAIN_BASE, plan::StepPhase::TRAIN_EPOCH_END);
    if (o.validate) {
      const EpochMetrics val = evaluate(false);
      m.val_loss = val.val_loss;
      m.val_top1 = val.val_top1;
      m.val_top5 = val.val_top5;
      if (o.ema) m.ema_val_top1 = evaluate(true).val_top1;
    }
    m.seconds = now_s() - t0;
    history.push_back(m);
    if (observer.on_epoch) observer.on_epoch(m);
    if (o.validate) I.last_epoch_metrics = m;
    if (I.cur_position >= batches) {  // the epoch is complete: a checkpoint from here resumes at the next one
      I.cur_epoch = epoch + 1;
      I.cur_position = 0;
      I.stopped_metrics.clear();
      if (!o.checkpoint_dir.empty() &&
          (I.preempted || m_step >= total_steps || o.checkpoint_each_epoch || I.checkpoint_due(m_step)))
        I.write_checkpoint_in_dir(m_step, std::vector<float>(plan::kResultSlots * I.comm_world(), 0.0f), observer);
      if (I.preempted) return history;
    }
  }
  return history;
}

/// benchmark() and profile(): the first training batch staged into both input buffers (they time the step, not the
/// loader), the learning rate and step scalars uploaded. Returns the batch of a step on this rank.
std::int64_t Trainer::Impl::stage_bench_batch() {
  const std::int64_t b = plan.specs[static_cast<std::size_t>(Variant::TRAIN_BASE)].batch_size;
  RN_CHECK_CTX(data.size(io::Split::train) >= b, data.path(), "the train split has fewer than {} samples", b);
  // The first b training samples as validation renders them (a copy of a raw store of the model's size).
  std::vector<std::int64_t> first(static_cast<std::size_t>(b));
  std::iota(first.begin(), first.end(), std::int64_t(0));
  io::BatchLoader loader(data, io::Split::train, b, std::move(first), {}, std::nullopt,
                         loader_options(io::Split::val, model_h, model_w, 0, nullptr));
  const io::Batch batch = *loader.next();
  for (int s = 0; s < 2; ++s) {
    stage(s, batch, Variant::TRAIN_BASE);
    replay(Variant::TRAIN_BASE, s == 0 ? GraphId::TRANSFER_A : GraphId::TRANSFER_B);
  }
  hyper[plan::kHyperLr] = static_cast<float>(opt.lr);
  hyper[plan::kHyperStep] = 1.0f;
  push_hyper();
  return b;
}

BenchResult Trainer::benchmark(std::int64_t warmup, std::int64_t steps, bool graphs) {
  Impl& I = *m_impl;
  RN_CHECK(steps >= 1 && warmup >= 0, "benchmark needs steps >= 1 and warmup >= 0");
  const std::int64_t b = I.stage_bench_batch();
  for (std::int64_t i = 0; i < warmup; ++i) I.step(Variant::TRAIN_BASE, static_cast<int>(i % 2), graphs);
  I.session->synchronize();
  if (I.env.comm) I.env.comm->agree_max(0);  // data-parallel: every rank starts the clock together
  const double t0 = now_s();
  for (std::int64_t i = 0; i < steps; ++i) I.step(Variant::TRAIN_BASE, static_cast<int>(i % 2), graphs);
  I.session->synchronize();
  double dt = now_s() - t0;
  if (I.env.comm) dt = static_cast<double>(I.env.comm->agree_max(static_cast<std::int64_t>(dt * 1e9))) * 1e-9;  // the slowest
  BenchResult r;
  r.steps = steps;
  r.ranks = I.world;
  r.batch = b * I.world;
  r.ms_per_step = 1e3 * dt / static_cast<double>(steps);
  r.images_per_s = static_cast<double>(r.batch * steps) / dt;
  r.arena_bytes = I.arena.bytes();
  r.captures = static_cast<std::int64_t>(I.atlas.captures());
  m_step += warmup + steps;
  I.replay(Variant::TRAIN_BASE, GraphId::CLEAR_METRICS);
  return r;
}

ProfileResult Trainer::profile(std::int64_t warmup, std::int64_t steps) {
  Impl& I = *m_impl;
  RN_CHECK(steps >= 1 && warmup >= 0, "profile needs steps >= 1 and warmup >= 0");
  const std::int64_t b = I.stage_bench_batch();
  for (std::int64_t i = 0; i < warmup; ++i) I.step(Variant::TRAIN_BASE, static_cast<int>(i % 2), true);
  I.session->synchronize();
  // The profiled steps run node by node (every capture was made at start-up, so no capture sees the timer); the
  // timer is off again when this returns or throws.
  StepProfiler profiler(I.opt.backend);
  struct TimerOff {
    ExecEnv& env;
    ~TimerOff() { env.timer = nullptr; }
  } timer_off{I.env};
  double wall = 0;
  for (std::int64_t i = 0; i < steps; ++i) {
    const double t0 = now_s();
    I.env.timer = &profiler;
    I.step(Variant::TRAIN_BASE, static_cast<int>(i % 2), false);
    I.env.timer = nullptr;
    I.session->synchronize();
    wall += now_s() - t0;
    profiler.finish_step();
  }
  ProfileResult r = profiler.result(steps);
  r.batch = b * I.world;
  r.wall_ms_per_step = 1e3 * wall / static_cast<double>(steps);
  m_step += warmup + steps;
  I.replay(Variant::TRAIN_BASE, GraphId::CLEAR_METRICS);
  return r;
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
  while (auto b = loader ? loader->next() : cached.next()) {
    const int s = static_cast<int>(b->index % 2);
    const Variant v = b->count < vb ? Variant::VAL_LAST : Variant::VAL_BASE;
    I.wait_slot(s);  // the batch two back is done with slot s
    if (I.cache) {
      I.transfer_cached(io::Split::val, s, b->count);
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

namespace {
/// `path` made absolute and normal (provenance attributes); unchanged when that fails.
std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

/// The weights file group of a tensor and its name there (EMA copies drop their ".ema" suffix).
bool weights_group(const DTensor& t, std::string* group, std::string* name) {
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
}  // namespace

void Trainer::save_weights(const std::string& path) const {
  std::vector<io::NamedTensor> out;
  for (const DTensor& t : m_plan->plan(Variant::TRAIN_BASE).tensors()) {
    io::NamedTensor nt;
    if (!weights_group(t, &nt.group, &nt.name)) continue;
    nt.shape = t.shape;
    nt.values = tensor_values(t.name);
    out.push_back(std::move(nt));
  }
  io::WeightsMeta meta;
  meta.strings = {{"model", m_plan->arch.model_name},
                  {"arch_plan", m_plan->arch.to_yaml()},
                  {"plan_hash", fmt::format("{:016x}", m_plan->hash)}};
  meta.ints = {{"step", m_step}};
  // The dataset's normalisation and class names travel with the weights (predict and other frameworks need them);
  // its path as an absolute one (provenance).
  const io::DatasetFile& data = m_impl->data;
  if (!data.path().empty()) meta.strings["data"] = absolute_path(data.path());
  meta.mean = data.mean();
  meta.std = data.stddev();
  meta.class_names = data.class_names();
  io::write_weights(path, out, meta);
}

void Trainer::load_weights(const std::string& path) {
  const io::WeightsFile wf = io::read_weights(path);
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);
  for (const DTensor& t : mp.tensors()) {
    std::string group, name;
    if (!weights_group(t, &group, &name)) continue;
    const io::NamedTensor* src = wf.find(group, name);
    if (!src && group == "ema") {
      src = wf.find("params", name);  // a file without EMA: start the EMA at the weights
    }
    RN_CHECK_CTX(src != nullptr, path, "tensor /{}/{} of model '{}' is missing (a different architecture?)", group,
                 name, m_plan->arch.model_name);
    RN_CHECK_CTX(src->shape == t.shape, path, "tensor /{}/{} has shape {} but the model needs {}", group, name,
                 src->shape.str(), t.shape.str());
    m_impl->ctx.upload(t.id, src->values.data(), static_cast<std::int64_t>(src->values.size() * sizeof(float)));
  }
  if (m_impl->opt.amp) m_impl->replay(Variant::TRAIN_BASE, GraphId::CAST_W_TO_A);
}

// ---- Checkpoints and resume (DESIGN §10, docs/checkpoints.md) -------------------------------------------------

namespace {

/// The checkpoint group of a tensor and its name there: masters /params, BN running statistics /bn, optimizer
/// moments /optimizer ("<layer>.<tensor>.m" momentum or Adam's first moment, ".v" Adam's second moment), EMA
/// weights /ema. Everything else is derived from these (FP16 copies, LARS norms) or rewritten every step.
bool checkpoint_group(const DTensor& t, std::string* group, std::string* name) {
  const RegionFamily f = region_family(t.region);
  if (f == RegionFamily::M || f == RegionFamily::V) {
    *group = "optimizer";
    *name = t.name;
    return true;
  }
  return weights_group(t, group, name);
}

/// The tensor's own name without its layer ("w", "gamma", "running_mean"; optimizer moments: "w.m").
std::string tensor_leaf(const std::string& name, const std::string& group) {
  std::size_t cut = name.rfind('.');
  if (group == "optimizer" && cut != std::string::npos && cut > 0) cut = name.rfind('.', cut - 1);
  return cut == std::string::npos ? name : name.substr(cut + 1);
}

bool is_first_conv(Region r) {
  return r == Region::W_FIRST_CONV || r == Region::E_FIRST_CONV || r == Region::M_FIRST_CONV ||
         r == Region::V_FIRST_CONV;
}

/// The training options as YAML (keys named like the `train` options), recorded in checkpoints.
std::string options_yaml(const TrainOptions& o) {
  std::string y;
  auto kv = [&](const char* k, const auto& v) { y += fmt::format("{}: {}\n", k, v); };
  kv("data", fmt::format("\"{}\"", absolute_path(o.data_path)));  // provenance: where, whatever the working dir
  kv("epochs", o.epochs);
  kv("batch", o.batch);
  kv("val-batch", o.val_batch);
  kv("optimizer", plan::optimizer_name(o.optimizer));
  kv("lr", o.lr);
  kv("momentum", o.momentum);
  kv("beta1", o.beta1);
  kv("beta2", o.beta2);
  kv("eps", o.eps);
  kv("weight-decay", o.weight_decay);
  kv("lars-eta", o.lars_eta);
  kv("schedule", schedule_name(o.schedule));
  kv("warmup-epochs", o.warmup_epochs);
  kv("step-epochs", o.step_epochs);
  kv("step-gamma", o.step_gamma);
  kv("label-smoothing", o.label_smoothing);
  kv("ema", o.ema);
  kv("ema-decay", o.ema_decay);
  kv("amp", o.amp);
  kv("fuse", o.fuse);
  kv("seed", o.seed);
  kv("max-steps", o.max_steps);
  kv("crop-padding", o.augmentation.crop_padding);
  kv("flip", o.augmentation.horizontal_flip);
  kv("crop", std::string(io::crop_mode_name(o.augmentation.crop)));
  kv("crop-scale", fmt::format("{},{}", o.augmentation.scale_min, o.augmentation.scale_max));
  kv("crop-ratio", fmt::format("{},{}", o.augmentation.ratio_min, o.augmentation.ratio_max));
  kv("val-resize", o.augmentation.val_resize);
  kv("shuffle", o.shuffle);
  kv("start-resolution", o.start_resolution);
  kv("lowres-epochs", o.lowres_epochs);
  kv("bn-momentum", o.bn_momentum);
  kv("bn-eps", o.bn_eps);
  kv("loss-scale", o.loss_scale);
  kv("loss-scale-interval", o.loss_scale_interval);
  kv("validate", o.validate);
  kv("deterministic", o.deterministic);
  kv("checkpoint-every", o.checkpoint_every);
  kv("checkpoint-each-epoch", o.checkpoint_each_epoch);
  kv("keep", o.checkpoint_keep);
  return y;
}

}  // namespace

bool Trainer::Impl::stop_agreed() const {
  if (!opt.stop_request) return false;  // the same on every rank: no collective
  const std::int64_t local = opt.stop_request->load() != 0 ? 1 : 0;
  return (env.comm ? env.comm->agree_max(local) : local) != 0;
}

std::vector<float> Trainer::Impl::gather_train_metrics() {
  session->synchronize();
  const auto local = accumulated();
  const int world = comm_world();
  std::vector<float> all(local.begin(), local.end());
  if (world <= 1) return all;
  all.assign(static_cast<std::size_t>(plan::kResultSlots * world), 0.0f);
  for (int r = 0; r < world; ++r) {  // a host gather through the broadcasts every communicator has
    std::vector<std::uint8_t> bytes;
    if (r == comm_rank()) bytes.assign(reinterpret_cast<const std::uint8_t*>(local.data()),
                                       reinterpret_cast<const std::uint8_t*>(local.data()) + sizeof local);
    env.comm->broadcast(bytes, r);
    RN_CHECK(bytes.size() == sizeof local, "internal: rank {} sent {} bytes of metric sums", r, bytes.size());
    std::memcpy(all.data() + r * plan::kResultSlots, bytes.data(), sizeof local);
  }
  return all;
}

void Trainer::Impl::restore_partial_metrics() {
  std::array<float, plan::kResultSlots> mine{};
  const std::size_t rows = stopped_metrics.size() / plan::kResultSlots;
  if (rows == static_cast<std::size_t>(comm_world())) {
    std::copy_n(stopped_metrics.begin() + comm_rank() * plan::kResultSlots, plan::kResultSlots, mine.begin());
  } else if (comm_rank() == 0) {  // written by another number of ranks: rank 0 holds the total
    for (std::size_t r = 0; r < rows; ++r)
      for (int k = 0; k < plan::kResultSlots; ++k) mine[k] += stopped_metrics[r * plan::kResultSlots + k];
  }
  ctx.upload(plan.baseline.accumulated, mine.data(), sizeof mine);
}

double Trainer::Impl::step_loss() const {
  session->synchronize();
  std::array<float, plan::kResultSlots> r{};
  ctx.download(plan.baseline.result, r.data(), sizeof r);
  return static_cast<double>(r[plan::kResultLoss] / std::max(1.0f, r[plan::kResultCount]));
}

io::Checkpoint Trainer::Impl::make_checkpoint(std::int64_t step, const std::vector<float>& metrics) const {
  session->synchronize();
  io::Checkpoint ck;
  io::CheckpointState& s = ck.state;
  s.step = step;
  s.epoch = cur_epoch;
  s.position = cur_position;
  s.samples_done = cur_position * opt.batch;
  s.batch = opt.batch;
  s.world_size = comm_world();
  s.seed = opt.seed;
  s.amp = opt.amp;
  s.optimizer = plan::optimizer_name(opt.optimizer);
  s.model = plan.arch.model_name;
  s.model_yaml = model_yaml;
  s.arch_plan = plan.arch.to_yaml();
  s.run_config = options_yaml(opt);
  s.plan_hash = fmt::format("{:016x}", plan.hash);
  const auto ls = read_loss_scale();
  s.loss_scale.assign(ls.begin(), ls.end());
  s.train_metrics.assign(metrics.begin(), metrics.end());
  if (cur_position == 0 && last_epoch_metrics.epoch > 0 && last_epoch_metrics.epoch == cur_epoch) {
    s.val_loss = last_epoch_metrics.val_loss;  // the epoch this checkpoint ends
    s.val_top1 = last_epoch_metrics.val_top1;
    s.val_top5 = last_epoch_metrics.val_top5;
    s.ema_val_top1 = last_epoch_metrics.ema_val_top1;
  }
  for (const DTensor& t : plan.plan(Variant::TRAIN_BASE).tensors()) {
    io::NamedTensor nt;
    if (!checkpoint_group(t, &nt.group, &nt.name)) continue;
    RN_CHECK(t.dtype == DType::F32, "internal: checkpoint tensor '{}' is {}, not F32", t.name, dtype_name(t.dtype));
    nt.shape = t.shape;
    nt.values.resize(static_cast<std::size_t>(t.shape.elems()));
    ctx.download(t.id, nt.values.data(), static_cast<std::int64_t>(nt.values.size() * sizeof(float)));
    ck.tensors.push_back(std::move(nt));
  }
  return ck;
}

void Trainer::Impl::write_checkpoint_in_dir(std::int64_t step, const std::vector<float>& metrics,
                                            const TrainObserver& observer) {
  std::exception_ptr error;
  if (comm_rank() == 0) {
    try {
      const io::Checkpoint ck = make_checkpoint(step, metrics);
      last_checkpoint = io::save_checkpoint_in_dir(opt.checkpoint_dir, ck, opt.checkpoint_keep);
      if (opt.checkpoint_keep_best) {
        const std::string best = io::save_best_checkpoint(opt.checkpoint_dir, ck);
        if (!best.empty()) spdlog::info("best val_top1 so far ({:.4f}, step {}): {}", ck.state.val_top1, step, best);
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  // Every rank waits for the write and learns its outcome: none trains on or exits while rank 0 writes.
  const std::int64_t failed = env.comm ? env.comm->agree_max(error ? 1 : 0) : (error ? 1 : 0);
  if (error) std::rethrow_exception(error);
  if (failed)
    throw Error(fmt::format("rank 0 could not write the checkpoint of step {} (see its error)", step),
                opt.checkpoint_dir);
  if (comm_rank() == 0 && observer.on_checkpoint) observer.on_checkpoint(last_checkpoint, step);
}

void Trainer::save_checkpoint(const std::string& path) const {
  const Impl& I = *m_impl;
  // Between runs the partial epoch's sums are the snapshot taken when run() stopped mid-epoch (or loaded).
  std::vector<float> metrics(static_cast<std::size_t>(plan::kResultSlots * I.comm_world()), 0.0f);
  if (I.cur_position > 0 && I.stopped_metrics.size() == metrics.size()) metrics = I.stopped_metrics;
  io::write_checkpoint(path, I.make_checkpoint(m_step, metrics));
}

bool Trainer::preempted() const { return m_impl->preempted; }
double Trainer::last_lr() const { return m_impl->last_lr; }
std::string Trainer::last_checkpoint() const { return m_impl->last_checkpoint; }

std::vector<std::string> Trainer::load_checkpoint(const std::string& path, bool weights_only) {
  Impl& I = *m_impl;
  const TrainOptions& o = I.opt;
  const io::Checkpoint ck = io::read_checkpoint(path);
  const io::CheckpointState& s = ck.state;
  std::vector<std::string> warnings;
  auto warn = [&](std::string w) {
    if (I.comm_rank() == 0) spdlog::warn("{}: {}", path, w);
    warnings.push_back(std::move(w));
  };
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);
  const std::string& model = m_plan->arch.model_name;
  const bool same_optimizer = !weights_only && s.optimizer == plan::optimizer_name(o.optimizer);

  // 1. Match every tensor before touching the arena (a failed load changes nothing); the first mismatch, in plan
  //    order, is named. By name; across AMP settings, whose fused layers have other names (cbr1.conv.w for
  //    conv1.w), by position within each group (the file keeps the writer's plan order) when that fits exactly.
  struct Load {
    const DTensor* t;
    const io::NamedTensor* src;
  };
  std::vector<Load> loads;
  bool ema_from_params = false;
  std::map<std::string, std::vector<const io::NamedTensor*>> file_groups;
  for (const io::NamedTensor& nt : ck.tensors) file_groups[nt.group].push_back(&nt);
  auto resolve = [&](bool by_position) -> std::string {
    loads.clear();
    ema_from_params = false;
    std::set<std::string> wanted;
    std::map<std::string, std::size_t> next;  // by position: the next file tensor of each group
    for (const DTensor& t : mp.tensors()) {
      std::string group, name;
      if (!checkpoint_group(t, &group, &name)) continue;
      wanted.insert(group + "/" + name);
      if (group == "optimizer" && !same_optimizer) continue;
      std::string from = group;
      if (group == "ema" && file_groups["ema"].empty()) {
        from = "params";  // a checkpoint without EMA: the EMA starts at the weights
        ema_from_params = true;
      }
      const io::NamedTensor* src = nullptr;
      if (!by_position) {
        src = ck.find(from, name);
      } else {
        const auto& list = file_groups[from];
        const std::size_t i = from == group ? next[group]++ : next["ema-from-params"]++;
        if (i < list.size()) src = list[i];
      }
      if (src && by_position && tensor_leaf(src->name, group) != tensor_leaf(name, group))
        src = nullptr;  // e.g. a BN's gamma against a beta: not the same tensor
      if (!src)
        return fmt::format("tensor /{}/{} of model '{}' is missing from the checkpoint, which was written for model "
                           "'{}' (a different architecture?)",
                           group, name, model, s.model);
      const bool pad_channels = src->shape != t.shape && is_first_conv(t.region) &&
                                (s.amp != o.amp || weights_only) && src->shape.n == t.shape.n &&
                                src->shape.h == t.shape.h && src->shape.w == t.shape.w;
      if (src->shape != t.shape && !pad_channels)
        return fmt::format("tensor /{}/{} has shape {} in the checkpoint{} (model '{}') but model '{}' needs {} (a "
                           "different architecture?)",
                           group, name, src->shape.str(), by_position ? fmt::format(" (as /{}/{})", from, src->name) : "",
                           s.model, model, t.shape.str());
      RN_CHECK(t.dtype == DType::F32, "internal: checkpoint tensor '{}' is {}, not F32", t.name, dtype_name(t.dtype));
      loads.push_back({&t, src});
    }
    for (const char* g : {"params", "bn"}) {
      const auto& list = file_groups[g];
      if (by_position) {
        if (next[g] != list.size())
          return fmt::format("the checkpoint has {} tensors in /{} but model '{}' has {}", list.size(), g, model,
                             next[g]);
      } else {
        for (const io::NamedTensor* nt : list)
          if (!wanted.count(nt->group + "/" + nt->name))
            return fmt::format("tensor /{}/{} of the checkpoint (model '{}') is not in model '{}' (a different "
                               "architecture?)",
                               nt->group, nt->name, s.model, model);
      }
    }
    return {};
  };
  const std::string by_name = resolve(false);
  if (!by_name.empty()) {
    // Only an AMP plan fuses layers (and renames their tensors): elsewhere a name mismatch is another model.
    const bool fused_names = s.amp || o.amp;
    RN_CHECK_CTX(fused_names && resolve(true).empty(), path, "{}", by_name);
    if (!weights_only && !loads.empty())
      warn(fmt::format("tensor names differ (AMP fuses layers): matched by position within each group, e.g. /{}/{} "
                       "as {}",
                       loads.front().src->group, loads.front().src->name, loads.front().t->name));
  }

  auto upload_tensors = [&] {
    for (const Load& l : loads) {
      const DTensor& t = *l.t;
      if (l.src->shape == t.shape) {
        I.ctx.upload(t.id, l.src->values.data(), static_cast<std::int64_t>(l.src->values.size() * sizeof(float)));
        continue;
      }
      // The first conv's input channels: AMP pads them to 8 (zero input), so pad with zeros or drop the padding.
      std::vector<float> v(static_cast<std::size_t>(t.shape.elems()), 0.0f);
      const std::int64_t cs = l.src->shape.c, ct = t.shape.c, rows = t.shape.n * t.shape.h * t.shape.w;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < std::min(cs, ct); ++c)
          v[static_cast<std::size_t>(r * ct + c)] = l.src->values[static_cast<std::size_t>(r * cs + c)];
      I.ctx.upload(t.id, v.data(), static_cast<std::int64_t>(v.size() * sizeof(float)));
    }
  };
  if (weights_only) {  // evaluation: the weights alone
    upload_tensors();
    if (o.amp) I.replay(Variant::TRAIN_BASE, GraphId::CAST_W_TO_A);
    I.session->synchronize();
    return warnings;
  }

  // 2. What differs from the run that wrote it: loads, with a warning where results will differ.
  std::int64_t position = s.position;
  if (s.batch != o.batch) {
    position = s.samples_done / o.batch;
    warn(fmt::format("written with batch {}, resumed with batch {}: epoch {} continues at sample {} of its order "
                     "({} done; the schedule, a function of the step, and the results differ from an uninterrupted "
                     "run)",
                     s.batch, o.batch, s.epoch + 1, position * o.batch, s.samples_done));
  }
  if (s.amp != o.amp)
    warn(fmt::format("written {} AMP, resumed {}: the loss scale starts afresh and results differ",
                     s.amp ? "with" : "without", o.amp ? "with it" : "without it"));
  if (s.world_size != I.comm_world())
    warn(fmt::format("written by {} rank(s), resumed on {}: sums are reduced in another order, so results are not "
                     "bit-identical to an uninterrupted run",
                     s.world_size, I.comm_world()));
  if (s.seed != o.seed)
    warn(fmt::format("written with seed {}, resumed with seed {}: the data order and augmentation of the rest of "
                     "the run follow the new seed",
                     s.seed, o.seed));
  if (const std::string key = "\ndeterministic: "; s.run_config.find(key) != std::string::npos) {
    const bool was = s.run_config.compare(s.run_config.find(key) + key.size(), 4, "true") == 0;
    if (was != o.deterministic)
      warn(fmt::format("written with --deterministic {}, resumed with --deterministic {}: the resumed steps {} "
                       "bit-identical to an uninterrupted run",
                       was ? "on" : "off", o.deterministic ? "on" : "off",
                       o.deterministic && !was ? "are deterministic from here on, but not" : "are not"));
  }
  if (!same_optimizer)
    warn(fmt::format("written with optimizer '{}', resumed with '{}': the optimizer state starts at zero", s.optimizer,
                     plan::optimizer_name(o.optimizer)));
  if (ema_from_params) warn("the checkpoint has no EMA weights: the EMA starts at the loaded weights");
  {  // The options the checkpoint's run_config records (options_yaml: "key: value" lines) against this run's.
    std::map<std::string, std::string> was;
    std::istringstream in(s.run_config);
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(": ");
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 2);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      was[line.substr(0, colon)] = v;
    }
    auto differs = [&](const char* key, const std::string& now) { return was.count(key) && was[key] != now; };
    if (differs("epochs", fmt::format("{}", o.epochs)))
      warn(fmt::format("written with --epochs {}, resumed with --epochs {}: the learning-rate schedule, a function of "
                       "the run's total steps, differs from the run that wrote it",
                       was["epochs"], o.epochs));
    if (differs("lr", fmt::format("{}", o.lr)) || differs("schedule", schedule_name(o.schedule)))
      warn(fmt::format("written with --lr {} --schedule {}, resumed with --lr {} --schedule {}: the rest of the run "
                       "follows the new learning rate",
                       was["lr"], was["schedule"], o.lr, schedule_name(o.schedule)));
    std::error_code ec;
    if (was.count("data") && was["data"] != o.data_path && !std::filesystem::equivalent(was["data"], o.data_path, ec))
      warn(fmt::format("written with --data {}, resumed with --data {}: the rest of the run trains on another dataset",
                       was["data"], o.data_path));
  }

  // 3. Into the arena.
  upload_tensors();
  if (!same_optimizer)
    for (const DTensor& t : mp.tensors()) {
      const RegionFamily f = region_family(t.region);
      if (f != RegionFamily::M && f != RegionFamily::V) continue;
      const std::vector<float> zeros(static_cast<std::size_t>(t.shape.elems()), 0.0f);
      I.ctx.upload(t.id, zeros.data(), static_cast<std::int64_t>(zeros.size() * sizeof(float)));
    }
  auto ls = I.read_loss_scale();
  if (s.amp && o.amp) {
    ls[plan::kLossScale] = s.loss_scale[plan::kLossScale];
    ls[plan::kLossScaleCleanSteps] = s.loss_scale[plan::kLossScaleCleanSteps];
  } else {
    ls[plan::kLossScale] = o.amp ? static_cast<float>(o.loss_scale) : 1.0f;
    ls[plan::kLossScaleCleanSteps] = 0.0f;
  }
  I.ctx.upload(m_plan->baseline.loss_scale, ls.data(), sizeof ls);
  I.stopped_metrics = s.train_metrics;
  if (position == 0) I.stopped_metrics.assign(s.train_metrics.size(), 0.0f);
  I.restore_partial_metrics();
  I.cur_epoch = s.epoch;
  I.cur_position = position;
  I.preempted = false;
  m_step = s.step;
  if (o.amp) I.replay(Variant::TRAIN_BASE, GraphId::CAST_W_TO_A);
  I.session->synchronize();
  return warnings;
}

// ---- logits for interoperability checks (renaissance predict) -------------------------------------------------

std::vector<float> Trainer::logits(io::Split split, std::int64_t first, std::int64_t count, bool ema) {
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
                         I.loader_options(io::Split::val, vin.shape.h, vin.shape.w, 0, nullptr));
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

std::string Trainer::Impl::setup_cache() {
  const io::SplitInfo& tr = data.info(io::Split::train);
  const io::SplitInfo& va = data.info(io::Split::val);
  const std::int64_t train_batch = plan.specs[static_cast<std::size_t>(Variant::TRAIN_BASE)].batch_size;
  const std::int64_t val_batch = plan.specs[static_cast<std::size_t>(Variant::VAL_BASE)].batch_size;
  DataCacheRequest r;
  r.mode = opt.data_cache;
  r.gpu = opt.backend == Backend::CUDA;
  r.raw_store = data.storage() == io::Storage::raw;
  r.progressive = opt.start_resolution > 0 && opt.lowres_epochs > 0;
  r.bytes = (tr.count + va.count) * (tr.height * tr.width * tr.channels + 52) +
            std::max(train_batch, val_batch) * tr.height * model_w * tr.channels;
  if (r.gpu) device_memory_now(&r.free_bytes, &r.total_bytes);
  const DataCacheDecision d = decide_data_cache(r);
  if (!d.use)
    return opt.data_cache == DataCacheMode::off || !r.gpu ? std::string() : "data cache: off (" + d.reason + ")";
  const double t0 = now_s();
  cache = std::make_unique<GpuDataCache>(data, static_cast<int>(plan.arch.num_classes));
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
  return fmt::format(
      "data cache: {} + {} images ({}x{}x{}, {}) on the device in {:.2f} s; batches are gathered{}, "
      "shifted, flipped and normalised there",
      tr.count, va.count, tr.height, tr.width, tr.channels, gib(cache->bytes()), startup.data_cache_s,
      train_resamples ? ", cropped, resampled" : "");
}

void Trainer::Impl::begin_cached_pass(io::Split split, const std::vector<std::int64_t>& order, std::int64_t epoch,
                                      const std::vector<std::int64_t>* positions) {
  // The geometry the host loader's render would use (loader_options).
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
                                  img_h_stored(), img_w_stored());
  cache->begin_pass(split, order, &geom);
}

}  // namespace renaissance::runtime
