#include <renaissance/core/error.h>
#include <renaissance/core/philox.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cpu/half.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>

namespace renaissance::runtime {

using plan::GraphId;
using plan::Variant;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr std::uint32_t kPurposeInit = 0x494e4954;  // "INIT"

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
  std::int64_t staging_bytes = 0;
  std::int64_t staging_labels_off = 0, staging_data_off = 0;
  std::int64_t img_h = 0, img_w = 0, img_c = 0;
  std::vector<std::uint8_t> resized;

  Impl(const TrainOptions& o, const plan::CompiledPlan& p, io::DatasetFile file)
      : opt(o),
        data(std::move(file)),
        plan(p),
        arena(o.backend, p.arena_bytes()),
        ctx(arena, p),
        table(KernelTable::for_backend(o.backend)),
        atlas(ctx, table),
        session(open_backend(o.backend, env, o.workspace_mib << 20)) {
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
    env.host_input[0] = staging[0];
    env.host_input[1] = staging[1];
    const io::SplitInfo& tr = data.info(io::Split::train);
    img_h = tr.height;
    img_w = tr.width;
    img_c = tr.channels;
  }

  ~Impl() {
    session->synchronize();
    for (std::byte* s : staging) session->host_free(s);
  }

  void replay(Variant v, GraphId g, bool graphs = true) {
    const CapturedGraph& c = atlas.get(v, g, env);
    if (graphs)
      c.replay(env);
    else
      c.run_uncaptured(env);
  }

  /// Prepares and captures every subgraph a run can need, so nothing is allocated or captured mid-training
  /// (cuDNN algorithm choice, LARS segment tables and CUDA graph instantiation all happen here).
  void capture_all() {
    const GraphId train_ids[] = {GraphId::TRANSFER_A,      GraphId::TRANSFER_B,        GraphId::ZERO_GRAD,
                                 GraphId::FIRST_LAYER_FWD_A, GraphId::FIRST_LAYER_FWD_B, GraphId::DEEP_FWD_BWD,
                                 GraphId::FIRST_LAYER_BWD_A, GraphId::FIRST_LAYER_BWD_B, GraphId::CAST_G16_TO_G,
                                 GraphId::DEEP_COMM,       GraphId::FIRST_COMM,        GraphId::NAN_CHECK_AND_GRAD_SCALING,
                                 GraphId::STATS_COMM,      GraphId::UPDATE_STATS,      GraphId::OPTIMIZER,
                                 GraphId::LARS_NORM_OPT,   GraphId::LARS_BIAS_OPT,     GraphId::LARS_WEIGHT_OPT,
                                 GraphId::CAST_W_TO_A,     GraphId::EMA_UPDATE,        GraphId::ACCUM_METRICS_TRAIN,
                                 GraphId::TRAIN_RESULT_COMM, GraphId::CLEAR_METRICS};
    const GraphId val_ids[] = {GraphId::TRANSFER_A,          GraphId::TRANSFER_B,      GraphId::INF_MAIN_A,
                               GraphId::INF_MAIN_B,          GraphId::INF_EMA_A,       GraphId::INF_EMA_B,
                               GraphId::CAST_E_TO_E16,       GraphId::ACCUM_METRICS_VAL_A, GraphId::ACCUM_METRICS_VAL_B,
                               GraphId::VAL_RESULT_COMM,     GraphId::CLEAR_METRICS};
    const bool lowres = opt.start_resolution > 0 && opt.lowres_epochs > 0;
    for (Variant v : {Variant::TRAIN_BASE, Variant::TRAIN_LAST, Variant::TRAIN_LOWRES, Variant::TRAIN_LOWRES_LAST}) {
      if (!lowres && (v == Variant::TRAIN_LOWRES || v == Variant::TRAIN_LOWRES_LAST)) continue;
      for (GraphId g : train_ids) atlas.get(v, g, env);
    }
    if (opt.validate || opt.ema)
      for (Variant v : {Variant::VAL_BASE, Variant::VAL_LAST})
        for (GraphId g : val_ids) atlas.get(v, g, env);
  }

  /// One optimizer step on the batch in input buffer `s` (A = 0, B = 1). Returns the NaN flag on the CPU
  /// (a GPU never reads it inside the step: AMP skips the update on the device, FP32 checks the epoch loss).
  bool step(Variant v, int s, bool graphs) {
    // forward, backward
    replay(v, GraphId::ZERO_GRAD, graphs);
    replay(v, s == 0 ? GraphId::FIRST_LAYER_FWD_A : GraphId::FIRST_LAYER_FWD_B, graphs);
    replay(v, GraphId::DEEP_FWD_BWD, graphs);
    replay(v, s == 0 ? GraphId::FIRST_LAYER_BWD_A : GraphId::FIRST_LAYER_BWD_B, graphs);
    // reduce
    replay(v, GraphId::CAST_G16_TO_G, graphs);
    replay(v, GraphId::DEEP_COMM, graphs);
    replay(v, GraphId::FIRST_COMM, graphs);
    replay(v, GraphId::NAN_CHECK_AND_GRAD_SCALING, graphs);
    const bool nan = opt.backend == Backend::CPU && nan_flag() != 0;
    replay(v, GraphId::STATS_COMM, graphs);
    replay(v, GraphId::UPDATE_STATS, graphs);
    // update
    replay(v, GraphId::OPTIMIZER, graphs);
    replay(v, GraphId::LARS_NORM_OPT, graphs);
    replay(v, GraphId::LARS_BIAS_OPT, graphs);
    replay(v, GraphId::LARS_WEIGHT_OPT, graphs);
    replay(v, GraphId::CAST_W_TO_A, graphs);
    replay(v, GraphId::EMA_UPDATE, graphs);
    // log
    replay(v, GraphId::ACCUM_METRICS_TRAIN, graphs);
    return nan;
  }

  // Host mirrors of the device-resident scalars: written by the trainer, uploaded before the step.
  std::array<float, plan::kHyperSlots> hyper{};
  void push_hyper() const { ctx.upload(plan.baseline.hyper, hyper.data(), sizeof hyper); }
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
    h[plan::kHyperWorldSize] = 1.0f;
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
    if (dt.shape.h != img_h || dt.shape.w != img_w) {
      // Progressive resize: the low-resolution variants get bilinearly downscaled images.
      resized.resize(static_cast<std::size_t>(b.count * dt.shape.h * dt.shape.w * img_c));
      resize_images(b.images, b.count, img_h, img_w, img_c, resized.data(), dt.shape.h, dt.shape.w);
      images = resized.data();
    }
    normalize_images(images, b.count, dt.shape.h, dt.shape.w, img_c, data.mean().data(), data.stddev().data(),
                     staging[s] + staging_data_off, dt.dtype, dt.shape.c);
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
  RN_CHECK_CTX(bp.in_h == tr.height && bp.in_w == tr.width, opts.data_path,
               "images are {}x{} but model '{}' expects {}x{}", tr.height, tr.width, bp.name, bp.in_h, bp.in_w);
  plan::BuildOptions bo;
  bo.amp = opts.amp;
  bo.fuse = opts.amp && opts.fuse;
  const plan::ArchPlan arch = plan::ArchPlan::build(bp, bo);
  RN_CHECK_CTX(arch.num_classes == probe.num_classes(), opts.data_path,
               "the dataset has {} classes but model '{}' predicts {}", probe.num_classes(), bp.name, arch.num_classes);
  plan::TrainConfig cfg;
  cfg.dataset_size = tr.count;
  cfg.batch = opts.batch;
  cfg.val_size = std::max<std::int64_t>(va.count, 1);
  cfg.val_batch = opts.val_batch;
  cfg.optimizer = opts.optimizer;
  cfg.ema = opts.ema;
  cfg.amp = opts.amp;
  cfg.start_resolution = opts.start_resolution;
  m_plan = std::make_unique<plan::CompiledPlan>(plan::Compiler::compile(arch, cfg));
  m_impl = std::make_unique<Impl>(opts, *m_plan, std::move(probe));  // the file opened once
  m_impl->capture_all();
  m_impl->init_weights();
}

Trainer::~Trainer() = default;

std::vector<EpochMetrics> Trainer::run(const TrainObserver& observer) {
  Impl& I = *m_impl;
  const TrainOptions& o = I.opt;
  const std::int64_t n = I.data.size(io::Split::train);
  const std::int64_t batches = (n + o.batch - 1) / o.batch;
  const std::int64_t total_steps = o.max_steps > 0 ? std::min(o.max_steps, batches * o.epochs) : batches * o.epochs;
  Schedule sched;
  sched.kind = o.schedule;
  sched.base_lr = o.lr;
  sched.total_steps = total_steps;
  sched.warmup_steps = static_cast<std::int64_t>(o.warmup_epochs * static_cast<double>(batches));
  sched.step_size = o.step_epochs * batches;
  sched.gamma = o.step_gamma;
  const Augmentation aug = o.augmentation;
  const std::uint64_t seed = o.seed;
  std::vector<EpochMetrics> history;
  for (std::int64_t epoch = 0; epoch < o.epochs && m_step < total_steps; ++epoch) {
    const bool lowres = epoch < o.lowres_epochs && o.start_resolution > 0;
    const double t0 = now_s();
    io::BatchLoader loader(
        I.data, io::Split::train, o.batch, epoch_order(seed, epoch, n, o.shuffle),
        [&](std::uint8_t* images, std::int32_t*, std::int64_t count, std::int64_t first) {
          std::vector<std::uint8_t> scratch;
          const std::int64_t bytes = I.img_h * I.img_w * I.img_c;
          for (std::int64_t i = 0; i < count; ++i)
            augment_image(images + i * bytes, I.img_h, I.img_w, I.img_c, aug, seed, epoch, first + i, scratch);
        });
    std::int64_t samples = 0;
    double lr = 0;
    while (auto b = loader.next()) {
      const int s = static_cast<int>(b->index % 2);
      const bool last = b->count < o.batch;
      const Variant v = lowres ? (last ? Variant::TRAIN_LOWRES_LAST : Variant::TRAIN_LOWRES)
                               : (last ? Variant::TRAIN_LAST : Variant::TRAIN_BASE);
      RN_CHECK(b->count == I.plan.specs[static_cast<std::size_t>(v)].batch_size,
               "internal: batch of {} samples for variant '{}'", b->count, plan::variant_name(v));
      I.check_labels(*b);
      // data
      I.stage(s, *b, v);
      I.replay(v, s == 0 ? GraphId::TRANSFER_A : GraphId::TRANSFER_B);
      lr = sched.lr(m_step);
      I.hyper[plan::kHyperLr] = static_cast<float>(lr);
      I.hyper[plan::kHyperStep] = static_cast<float>(m_step + 1);
      I.push_hyper();
      if (I.step(v, s, true) && !o.amp && o.backend == Backend::CPU)
        throw Error(fmt::format("NaN or inf in the gradients at step {} (epoch {}, batch {})", m_step + 1, epoch + 1,
                                b->index),
                    "training", "the loss diverged: lower --lr, or use --amp for dynamic loss scaling");
      // The staging buffer of this batch is refilled two batches later; on a GPU the step must be done by then.
      I.session->synchronize();
      ++m_step;
      samples += b->count;
      if (observer.on_step)
        observer.on_step(epoch + 1, b->index + 1, loader.num_batches(), static_cast<double>(samples) / (now_s() - t0));
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
    I.replay(Variant::TRAIN_BASE, GraphId::TRAIN_RESULT_COMM);
    const auto acc = I.accumulated();
    const double count = std::max(1.0f, acc[plan::kResultCount]);
    m.train_loss = acc[plan::kResultLoss] / count;
    if (!o.amp && !std::isfinite(m.train_loss))
      throw Error(fmt::format("NaN or inf in the training loss of epoch {} (step {})", epoch + 1, m_step), "training",
                  "the loss diverged: lower --lr, or use --amp for dynamic loss scaling");
    m.train_top1 = acc[plan::kResultTop1] / count;
    I.replay(Variant::TRAIN_BASE, GraphId::CLEAR_METRICS);
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
  }
  return history;
}

BenchResult Trainer::benchmark(std::int64_t warmup, std::int64_t steps, bool graphs) {
  Impl& I = *m_impl;
  RN_CHECK(steps >= 1 && warmup >= 0, "benchmark needs steps >= 1 and warmup >= 0");
  const std::int64_t b = I.plan.specs[static_cast<std::size_t>(Variant::TRAIN_BASE)].batch_size;
  RN_CHECK_CTX(I.data.size(io::Split::train) >= b, I.data.path(), "the train split has fewer than {} samples", b);
  // One batch staged into both input buffers: the benchmark times the step, not the loader.
  std::vector<std::uint8_t> images(static_cast<std::size_t>(b * I.data.sample_bytes()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(b));
  I.data.read(io::Split::train, 0, b, images.data(), labels.data());
  io::Batch batch{images.data(), labels.data(), b, 0, 0};
  for (int s = 0; s < 2; ++s) {
    I.stage(s, batch, Variant::TRAIN_BASE);
    I.replay(Variant::TRAIN_BASE, s == 0 ? GraphId::TRANSFER_A : GraphId::TRANSFER_B);
  }
  I.hyper[plan::kHyperLr] = static_cast<float>(I.opt.lr);
  I.hyper[plan::kHyperStep] = 1.0f;
  I.push_hyper();
  for (std::int64_t i = 0; i < warmup; ++i) I.step(Variant::TRAIN_BASE, static_cast<int>(i % 2), graphs);
  I.session->synchronize();
  const double t0 = now_s();
  for (std::int64_t i = 0; i < steps; ++i) I.step(Variant::TRAIN_BASE, static_cast<int>(i % 2), graphs);
  I.session->synchronize();
  const double dt = now_s() - t0;
  BenchResult r;
  r.steps = steps;
  r.batch = b;
  r.ms_per_step = 1e3 * dt / static_cast<double>(steps);
  r.images_per_s = static_cast<double>(b * steps) / dt;
  r.arena_bytes = I.arena.bytes();
  r.captures = static_cast<std::int64_t>(I.atlas.captures());
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
  I.replay(Variant::VAL_BASE, GraphId::CLEAR_METRICS);
  if (ema && I.opt.amp) I.replay(Variant::VAL_BASE, GraphId::CAST_E_TO_E16);
  io::BatchLoader loader(I.data, io::Split::val, vb, epoch_order(0, 0, n, false));
  while (auto b = loader.next()) {
    const int s = static_cast<int>(b->index % 2);
    const Variant v = b->count < vb ? Variant::VAL_LAST : Variant::VAL_BASE;
    I.check_labels(*b);
    I.stage(s, *b, v);
    I.replay(v, s == 0 ? GraphId::TRANSFER_A : GraphId::TRANSFER_B);
    I.replay(v, ema ? (s == 0 ? GraphId::INF_EMA_A : GraphId::INF_EMA_B) : (s == 0 ? GraphId::INF_MAIN_A : GraphId::INF_MAIN_B));
    I.replay(v, s == 0 ? GraphId::ACCUM_METRICS_VAL_A : GraphId::ACCUM_METRICS_VAL_B);
    I.session->synchronize();  // the staging buffer of this batch is refilled two batches later
  }
  I.replay(Variant::VAL_BASE, GraphId::VAL_RESULT_COMM);
  const auto acc = I.accumulated();
  const double count = std::max(1.0f, acc[plan::kResultCount]);
  EpochMetrics m;
  m.val_loss = acc[plan::kResultLoss] / count;
  m.val_top1 = acc[plan::kResultTop1] / count;
  m.val_top5 = acc[plan::kResultTop5] / count;
  I.replay(Variant::VAL_BASE, GraphId::CLEAR_METRICS);
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
  io::write_weights(path, out,
                    {{"model", m_plan->arch.model_name},
                     {"arch_plan", m_plan->arch.to_yaml()},
                     {"step", std::to_string(m_step)},
                     {"plan_hash", fmt::format("{:016x}", m_plan->hash)}});
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

}  // namespace renaissance::runtime
