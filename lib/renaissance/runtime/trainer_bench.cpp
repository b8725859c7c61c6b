// Trainer::benchmark and Trainer::profile: timed steps on one staged batch.
#include <renaissance/runtime/trainer_impl.h>

namespace renaissance::runtime {

/// benchmark() and profile(): the first training batch staged into both input buffers (they time the step, not the
/// loader), the learning rate and step scalars uploaded. Returns the batch of a step on this rank.
std::int64_t Trainer::Impl::stage_bench_batch() {
  const std::int64_t b = plan.specs[static_cast<std::size_t>(Variant::TRAIN_BASE)].batch_size;
  RN_CHECK_CTX(data.size(io::Split::train) >= b, data.path(), "the train split has fewer than {} samples", b);
  // The first b training samples as validation renders them (a copy of a raw store of the model's size).
  std::vector<std::int64_t> first(static_cast<std::size_t>(b));
  std::iota(first.begin(), first.end(), std::int64_t(0));
  io::BatchLoader loader(data, io::Split::train, b, std::move(first), {}, std::nullopt,
                         loader_options(io::Split::val, model_h, model_w, 0, nullptr, true));
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
  if (I.env.comm)
    dt = static_cast<double>(I.env.comm->agree_max(static_cast<std::int64_t>(dt * 1e9))) * 1e-9;  // the slowest
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

}  // namespace renaissance::runtime
