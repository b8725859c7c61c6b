// Checkpoints and resume (DESIGN §10, docs/checkpoints.md).
#include <renaissance/io/hdf5_util.h>
#include <renaissance/runtime/devices.h>
#include <renaissance/runtime/trainer_impl.h>

#include <cctype>

namespace renaissance::runtime {

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

/// `--onecycle-momentum` as the option takes it: "off" or "BASE,MAX".
std::string onecycle_momentum_name(const TrainOptions& o) {
  return o.onecycle_momentum ? fmt::format("{},{}", o.onecycle_base_momentum, o.onecycle_max_momentum) : "off";
}

/// --conv-stats as it acts: a no-op off the GPU.
const char* conv_stats_name(const TrainOptions& o) {
  return o.conv_stats && o.backend == Backend::CUDA ? "on" : "off";
}

/// A YAML double-quoted scalar: a path with a newline or a quote in it broke its "key: value" line, and a resume
/// with the same --data warned that it had changed.
std::string yaml_quoted(const std::string& v) {
  std::string q = "\"";
  for (const char ch : v) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      q += '\\';
      q += ch;
    } else if (ch == '\n') {
      q += "\\n";
    } else if (ch == '\t') {
      q += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      q += fmt::format("\\x{:02x}", u);
    } else {
      q += ch;
    }
  }
  return q + "\"";
}

/// The value of a yaml_quoted scalar (a backslash before anything else stays as written, as older files have it).
std::string yaml_unquoted(const std::string& q) {
  std::string v;
  for (std::size_t i = 1; i + 1 < q.size(); ++i) {
    const char ch = q[i];
    if (ch != '\\' || i + 2 >= q.size()) {
      v += ch;
      continue;
    }
    const char e = q[i + 1];
    if (e == '"' || e == '\\') {
      v += e;
      ++i;
    } else if (e == 'n') {
      v += '\n';
      ++i;
    } else if (e == 't') {
      v += '\t';
      ++i;
    } else if (e == 'x' && i + 3 < q.size() - 1 && std::isxdigit(static_cast<unsigned char>(q[i + 2])) &&
               std::isxdigit(static_cast<unsigned char>(q[i + 3]))) {
      v += static_cast<char>(std::stoi(q.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      v += ch;
    }
  }
  return v;
}

/// The CPU's Winograd convolutions as they run: "on", "off", or "n/a" on a GPU.
const char* cpu_winograd_name(const TrainOptions& o) {
  return o.backend != Backend::CPU ? "n/a" : cpu_winograd() ? "on" : "off";
}

/// The training options as YAML (keys named like the `train` options), recorded in checkpoints.
std::string options_yaml(const TrainOptions& o) {
  std::string y;
  auto kv = [&](const char* k, const auto& v) { y += fmt::format("{}: {}\n", k, v); };
  kv("data", yaml_quoted(absolute_path(o.data_path)));  // provenance: where, whatever the working dir
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
  kv("onecycle-pct", o.onecycle_pct);
  kv("onecycle-div", o.onecycle_div);
  kv("onecycle-momentum", onecycle_momentum_name(o));
  kv("drop-last", o.drop_last);
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
  kv("conv-stats", std::string(conv_stats_name(o)));
  kv("recompute", std::string(o.recompute_bn_relu ? "bn-relu" : "off"));
  kv("sync-bn", o.sync_bn);
  // The CPU convolutions as they run (Winograd rounds otherwise: resumed with it off, a run changed without a word).
  kv("cpu-winograd", std::string(cpu_winograd_name(o)));
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
    if (r == comm_rank())
      bytes.assign(reinterpret_cast<const std::uint8_t*>(local.data()),
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
  if (opt.amp) require_loss_scale_left(ls, step);
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
  require_not_diverged(ck.tensors, step);
  return ck;
}

void Trainer::Impl::on_rank0_agreed(const std::string& what, const std::function<void()>& write) {
  std::exception_ptr error;
  bool diverged = false;
  if (comm_rank() == 0) {
    try {
      write();
    } catch (const DivergedError&) {
      error = std::current_exception();
      diverged = true;
    } catch (...) {
      error = std::current_exception();
    }
  }
  // Every rank waits for the write and learns its outcome: none trains on or exits while rank 0 writes. A diverged
  // run is one on every rank (exit 1 everywhere: the other ranks' "could not write" became 75 at a preemption, and
  // the launcher's highest code requeued a run that had diverged).
  const std::int64_t mine = diverged ? 2 : (error ? 1 : 0);
  const std::int64_t outcome = env.comm ? env.comm->agree_max(mine) : mine;
  if (error) std::rethrow_exception(error);
  if (outcome == 2)
    throw DivergedError(fmt::format("rank 0 found the run diverged while writing {} (see its error)", what), "training",
                        "lower --lr");
  if (outcome != 0) throw Error(fmt::format("rank 0 could not write {} (see its error)", what), opt.checkpoint_dir);
}

double Trainer::Impl::read_best_top1() const {
  std::string why;
  const double top1 = io::best_checkpoint_top1(opt.checkpoint_dir, &why);
  // A damaged best.h5 was replaced by the run's next best without a word.
  if (!why.empty())
    spdlog::warn("{}: the best checkpoint cannot be read ({}): this run's best replaces it", opt.checkpoint_dir, why);
  return top1;
}

void Trainer::Impl::save_best_in_dir(const io::Checkpoint& ck, std::int64_t step) {
  // best.h5 is read once a run (its val_top1), not at every checkpoint: this run is the directory's only writer.
  if (std::isnan(best_top1)) best_top1 = read_best_top1();
  const std::string best = io::save_best_checkpoint(opt.checkpoint_dir, ck, best_top1);
  if (best.empty()) return;
  best_top1 = ck.state.val_top1;
  spdlog::info("best val_top1 so far ({:.4f}, step {}): {}", ck.state.val_top1, step, best);
}

void Trainer::Impl::keep_best_in_dir(std::int64_t step) {
  on_rank0_agreed(fmt::format("the best checkpoint of step {}", step), [&] {
    if (std::isnan(best_top1)) best_top1 = read_best_top1();
    if (last_epoch_metrics.val_top1 > best_top1)
      save_best_in_dir(make_checkpoint(step, std::vector<float>(plan::kResultSlots * comm_world(), 0.0f)), step);
  });
}

void Trainer::Impl::write_checkpoint_in_dir(std::int64_t step, const std::vector<float>& metrics,
                                            const TrainObserver& observer) {
  on_rank0_agreed(fmt::format("the checkpoint of step {}", step), [&] {
    const io::Checkpoint ck = make_checkpoint(step, metrics);
    last_checkpoint = io::save_checkpoint_in_dir(opt.checkpoint_dir, ck, opt.checkpoint_keep);
    if (opt.checkpoint_keep_best) save_best_in_dir(ck, step);
  });
  if (comm_rank() == 0 && observer.on_checkpoint) observer.on_checkpoint(last_checkpoint, step);
}

void Trainer::save_checkpoint(const std::string& path) const {
  const Impl& I = *m_impl;
  // Between runs the partial epoch's sums are the snapshot taken when run() stopped mid-epoch (or loaded).
  std::vector<float> metrics(static_cast<std::size_t>(plan::kResultSlots * I.comm_world()), 0.0f);
  if (I.cur_position > 0 && I.stopped_metrics.size() == metrics.size()) metrics = I.stopped_metrics;
  io::write_checkpoint(path, I.make_checkpoint(m_step, metrics));
}

std::int64_t Trainer::file_tensor_bytes(bool checkpoint) const {
  std::int64_t bytes = 0;
  std::string group, name;
  for (const DTensor& t : m_plan->plan(Variant::TRAIN_BASE).tensors())
    if (checkpoint ? checkpoint_group(t, &group, &name) : weights_group(t, &group, &name))
      bytes += t.shape.elems() * static_cast<std::int64_t>(sizeof(float));  // both files hold FP32 values
  return bytes;
}

bool Trainer::preempted() const { return m_impl->preempted; }
double Trainer::last_lr() const { return m_impl->last_lr; }
double Trainer::last_cycled_momentum() const { return m_impl->opt.onecycle_momentum ? m_impl->last_momentum : -1.0; }
std::string Trainer::last_checkpoint() const { return m_impl->last_checkpoint; }

namespace {

struct Load {
  const DTensor* t;
  const io::NamedTensor* src;
};

/// How the file's tensors map onto the plan's (load_state's step 1).
struct Matched {
  std::vector<Load> loads;
  bool ema_from_params = false;  ///< a checkpoint without EMA: the EMA starts at the weights
  bool same_optimizer = false;   ///< the optimizer moments are loaded
  std::string by_position;       ///< non-empty: names differed (fused layers) and tensors matched by position
};

/// Matches every tensor of `st` to the plan before anything touches the arena (a failed load changes nothing); the
/// first mismatch, in plan order, is the error. By name; where fused layers have other names (cbr1.conv.w for
/// conv1.w: across AMP settings or fusion), by position within each group when the file keeps the writer's plan
/// order (checkpoints) and that fits exactly.
Matched match_state(const plan::CompiledPlan& cp, const TrainOptions& o, const InitialState& st) {
  const plan::MemoryPlan& mp = cp.plan(Variant::TRAIN_BASE);
  const std::string& model = cp.arch.model_name;
  const io::CheckpointState& s = st.state;
  const bool weights_only = st.weights_only;
  const std::string& path = st.path;
  const char* noun = st.noun();
  Matched m;
  m.same_optimizer = !weights_only && s.optimizer == plan::optimizer_name(o.optimizer);
  std::map<std::string, std::vector<const io::NamedTensor*>> file_groups;
  for (const io::NamedTensor& nt : st.tensors) file_groups[nt.group].push_back(&nt);
  // A file whose model reads images of other channels (its recorded arch plan says so): under AMP both first convs
  // are padded to 8 channels, so 3-channel weights fitted a 1-channel model shape for shape and loaded.
  RN_CHECK_CTX(st.input_channels == 0 || st.input_channels == cp.arch.input_channels, path,
               "{} was written for a model of {}-channel images; model '{}' reads {}-channel images", noun,
               st.input_channels, model, cp.arch.input_channels);
  // Evaluating the EMA of a run that kept none would score the plain weights under the EMA's name.
  RN_CHECK_CTX(!weights_only || !o.ema || !file_groups["ema"].empty(), path,
               "--ema: {} has no EMA weights (its run was without --ema); score it without --ema", noun);
  auto resolve = [&](bool by_position) -> std::string {
    m.loads.clear();
    m.ema_from_params = false;
    std::set<std::string> wanted;
    std::map<std::string, std::size_t> next;  // by position: the next file tensor of each group
    for (const DTensor& t : mp.tensors()) {
      std::string group, name;
      if (!checkpoint_group(t, &group, &name)) continue;
      wanted.insert(group + "/" + name);
      if (group == "optimizer" && !m.same_optimizer) continue;
      std::string from = group;
      if (group == "ema" && file_groups["ema"].empty()) {
        from = "params";  // a checkpoint without EMA: the EMA starts at the weights
        m.ema_from_params = true;
      }
      const io::NamedTensor* src = nullptr;
      if (!by_position) {
        src = io::find_tensor(st.tensors, from, name);
      } else {
        const auto& list = file_groups[from];
        const std::size_t i = from == group ? next[group]++ : next["ema-from-params"]++;
        if (i < list.size()) src = list[i];
      }
      if (src && by_position && tensor_leaf(src->name, group) != tensor_leaf(name, group))
        src = nullptr;  // e.g. a BN's gamma against a beta: not the same tensor
      if (!src)
        return fmt::format(
            "tensor /{}/{} of model '{}' is missing from {}, which was written for model '{}' (a different "
            "architecture?)",
            group, name, model, noun, s.model);
      // The first conv across AMP settings (an AMP plan pads its input channels to 8): each side's channels are the
      // data's or their AMP padding, nothing else (weights of a 3-channel model were cut to the first channel of a
      // 1-channel one, or zero-padded the other way, and scored with exit 0; a file that records its model's
      // channels is checked whole above).
      const std::int64_t data_c = cp.arch.input_channels;
      const auto amp_channels = [&](std::int64_t c) {
        return c == data_c || c == align_up(data_c, kAmpInputChannelAlign);
      };
      const bool pad_channels = src->shape != t.shape && is_first_conv(t.region) && (s.amp != o.amp || weights_only) &&
                                src->shape.n == t.shape.n && src->shape.h == t.shape.h && src->shape.w == t.shape.w &&
                                amp_channels(src->shape.c) && amp_channels(t.shape.c);
      if (src->shape != t.shape && !pad_channels)
        return fmt::format(
            "tensor /{}/{} has shape {} in {}{} (model '{}') but model '{}' needs {} (a different architecture?)",
            group, name, src->shape.str(), noun, by_position ? fmt::format(" (as /{}/{})", from, src->name) : "",
            s.model, model, t.shape.str());
      RN_CHECK(t.dtype == DType::F32, "internal: checkpoint tensor '{}' is {}, not F32", t.name, dtype_name(t.dtype));
      m.loads.push_back({&t, src});
    }
    for (const char* g : {"params", "bn"}) {
      const auto& list = file_groups[g];
      if (by_position) {
        if (next[g] != list.size())
          return fmt::format("{} has {} tensors in /{} but model '{}' has {}", noun, list.size(), g, model, next[g]);
      } else {
        for (const io::NamedTensor* nt : list)
          if (!wanted.count(nt->group + "/" + nt->name))
            return fmt::format(
                "tensor /{}/{} of {} (model '{}') is not in model '{}' (a different architecture?)", nt->group,
                nt->name, noun, s.model, model);
      }
    }
    return {};
  };
  const std::string by_name = resolve(false);
  if (!by_name.empty()) {
    // Fused layers rename their tensors (cbr1.conv.w for conv1.w): across AMP settings (an AMP plan pads the first
    // conv), and for the same model written with other fusion (a file from before FP32 plans fused Conv+BN+ReLU).
    // Elsewhere a name mismatch is another model.
    const bool fused_names = s.amp || o.amp || s.model == model;
    // By position only where the file keeps the writer's plan order (checkpoints); a weights file lists its tensors
    // by name, and same-shaped tensors in another order would load into the wrong layers.
    RN_CHECK_CTX(st.in_plan_order() && fused_names && resolve(true).empty(), path, "{}", by_name);
    if (!m.loads.empty())
      m.by_position = fmt::format(
          "tensor names differ (fused layers): matched by position within each group, e.g. /{}/{} as {}",
          m.loads.front().src->group, m.loads.front().src->name, m.loads.front().t->name);
  }
  return m;
}

/// Options a resume with other values warns about in one line (lr, schedule, epochs, data and the others with
/// consequences of their own are warned about apart): options_yaml's keys.
// clang-format off
constexpr const char* kResumeWarnedOptions[] = {
    "momentum", "beta1", "beta2", "eps", "weight-decay", "lars-eta", "warmup-epochs", "step-epochs", "step-gamma",
    "label-smoothing", "ema-decay", "crop-padding", "flip", "crop", "crop-scale", "crop-ratio", "val-resize",
    "shuffle", "start-resolution", "lowres-epochs", "bn-momentum", "bn-eps"};
// clang-format on

/// The options a checkpoint's run_config records (options_yaml: "key: value" lines).
std::map<std::string, std::string> recorded_options(const std::string& run_config) {
  std::map<std::string, std::string> was;
  std::istringstream in(run_config);
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 2);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = yaml_unquoted(v);
    was[line.substr(0, colon)] = v;
  }
  return was;
}

/// What a resume cannot continue with (the rest only warns).
void check_resumable(const InitialState& st, const TrainOptions& o) {
  if (st.weights_only) return;
  std::map<std::string, std::string> was = recorded_options(st.state.run_config);
  // The epoch's batches (and a mid-epoch checkpoint's position among them) depend on it.
  RN_CHECK(!was.count("drop-last") || was["drop-last"] == fmt::format("{}", o.drop_last),
           "{}: written with --drop-last {}, resumed with {}: an epoch's batches differ (hint: resume with the "
           "setting it was written with)",
           st.path, was["drop-last"], o.drop_last);
}

/// A recorded value that is a whole decimal number (a run_config or arch plan line's), else -1.
std::int64_t whole_number(const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  return !v.empty() && end && *end == '\0' ? static_cast<std::int64_t>(x) : -1;
}

/// A recorded --val-resize (a run_config line's or a weights file's attribute), -1 when it is not one.
std::int64_t recorded_val_resize(const std::string& v) {
  const std::int64_t x = whole_number(v);
  return x >= 0 && x <= 65535 ? x : -1;
}

/// The top-level `input_channels: N` of a recorded arch plan (ArchPlan::to_yaml), read by line rather than parsed:
/// the attribute is the writer's, checked elsewhere. 0 where it has none.
std::int64_t recorded_input_channels(const std::string& arch_plan) {
  std::istringstream in(arch_plan);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("input_channels: ", 0) != 0) continue;
    const std::int64_t c = whole_number(line.substr(16));
    return c > 0 && c <= (1LL << 20) ? c : 0;
  }
  return 0;
}

}  // namespace

InitialState InitialState::of_checkpoint(io::Checkpoint ck, std::string path, bool weights_only) {
  InitialState st;
  st.tensors = std::move(ck.tensors);
  st.state = std::move(ck.state);
  st.path = std::move(path);
  st.weights_only = weights_only;
  st.checkpoint = true;
  st.input_channels = recorded_input_channels(st.state.arch_plan);
  std::map<std::string, std::string> was = recorded_options(st.state.run_config);
  if (was.count("val-resize")) st.val_resize = recorded_val_resize(was["val-resize"]);
  return st;
}

InitialState InitialState::of_weights(io::WeightsFile wf, std::string path) {
  // Of the run state only the model name (for messages) matters with weights only.
  InitialState st;
  if (const auto it = wf.attributes.find("model"); it != wf.attributes.end()) st.state.model = it->second;
  if (const auto it = wf.attributes.find("arch_plan"); it != wf.attributes.end())
    st.input_channels = recorded_input_channels(it->second);
  if (const auto it = wf.attributes.find("val_resize"); it != wf.attributes.end())
    st.val_resize = recorded_val_resize(it->second);
  st.tensors = std::move(wf.tensors);
  st.path = std::move(path);
  st.weights_only = true;
  st.checkpoint = false;
  return st;
}

void trainer_detail::check_initial_state(const plan::CompiledPlan& cp, const TrainOptions& o, const InitialState& st) {
  // Files are checked for NaNs and infinities as they are read (io::read_checkpoint, io::read_weights); a state built
  // otherwise is checked here, once, as the loads will take it.
  for (const Load& l : match_state(cp, o, st).loads)
    io::require_finite(l.src->values, fmt::format("{}: tensor /{}/{}", st.path, l.src->group, l.src->name));
  check_resumable(st, o);
}

std::vector<std::string> Trainer::load_checkpoint(const std::string& path, bool weights_only) {
  return load_state(InitialState::of_checkpoint(io::read_checkpoint(path), path, weights_only));
}

std::vector<std::string> Trainer::load_state(const InitialState& st) {
  Impl& I = *m_impl;
  const TrainOptions& o = I.opt;
  const io::CheckpointState& s = st.state;
  const bool weights_only = st.weights_only;
  const std::string& path = st.path;
  std::vector<std::string> warnings;
  auto warn = [&](std::string w) {
    if (I.comm_rank() == 0) spdlog::warn("{}: {}", path, w);
    warnings.push_back(std::move(w));
  };
  const plan::MemoryPlan& mp = m_plan->plan(Variant::TRAIN_BASE);

  // 1. Every tensor matched before the arena is touched (a failed load changes nothing).
  const Matched matched = match_state(*m_plan, o, st);
  const std::vector<Load>& loads = matched.loads;
  const bool same_optimizer = matched.same_optimizer;
  const bool ema_from_params = matched.ema_from_params;
  if (!weights_only && !matched.by_position.empty()) warn(matched.by_position);
  check_resumable(st, o);

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
    warn(
        fmt::format("written with batch {}, resumed with batch {}: epoch {} continues at sample {} of its order "
                    "({} done; the schedule, a function of the step, and the results differ from an uninterrupted "
                    "run)",
                    s.batch, o.batch, s.epoch + 1, position * o.batch, s.samples_done));
  }
  {
    // Another dataset (or batch) whose epoch is shorter than the checkpoint's place in its epoch: the epoch had no
    // batches left, the run's end came one batch early and a later epoch was cut short, without a word.
    const std::int64_t batches = shard_layout(I.data.size(io::Split::train), o.batch, I.comm_world(), I.comm_rank(),
                                              o.drop_last)
                                     .batches();
    RN_CHECK_CTX(position < batches, path,
                 "written {} batch(es) into epoch {}, but an epoch of {} has {} batch(es) at --batch {}: the "
                 "checkpoint's place is past this epoch's end (hint: resume with the dataset and batch it was written "
                 "with)",
                 position, s.epoch + 1, o.data_path, batches, o.batch);
  }
  {
    // Another model whose tensors have the same names and shapes (a pool's window, an activation, a stride: nothing
    // a tensor shape shows) loaded and trained on without a word.
    const auto layers = [](const std::string& yaml) {  // the model YAML without its name line
      return yaml.rfind("name: ", 0) == 0 && yaml.find('\n') != std::string::npos ? yaml.substr(yaml.find('\n')) : yaml;
    };
    const std::string& model = m_plan->arch.model_name;
    if (!s.model_yaml.empty() && !I.model_yaml.empty() && layers(s.model_yaml) != layers(I.model_yaml))
      warn(
          fmt::format("written for model '{}', resumed with model '{}' whose layers differ from the ones it records "
                      "(its tensors have the same names and shapes): the rest of the run trains another network",
                      s.model, model));
    else if (s.model != model)
      warn(fmt::format("written for model '{}', resumed as model '{}'", s.model, model));
  }
  if (!o.ema &&
      std::any_of(st.tensors.begin(), st.tensors.end(), [](const io::NamedTensor& t) { return t.group == "ema"; }))
    warn(
        "the checkpoint's EMA weights are dropped: this run is without --ema, so neither it nor its checkpoints "
        "keep an average (resume with --ema to continue it)");
  if (s.amp != o.amp)
    warn(fmt::format("written {} AMP, resumed {}: the loss scale starts afresh and results differ",
                     s.amp ? "with" : "without", o.amp ? "with it" : "without it"));
  if (s.world_size != I.comm_world())
    warn(
        fmt::format("written by {} rank(s), resumed on {}: sums are reduced in another order, so results are not "
                    "bit-identical to an uninterrupted run",
                    s.world_size, I.comm_world()));
  if (s.seed != o.seed)
    warn(
        fmt::format("written with seed {}, resumed with seed {}: the data order and augmentation of the rest of "
                    "the run follow the new seed",
                    s.seed, o.seed));
  if (const std::string key = "\ndeterministic: "; s.run_config.find(key) != std::string::npos) {
    const bool was = s.run_config.compare(s.run_config.find(key) + key.size(), 4, "true") == 0;
    if (was != o.deterministic)
      warn(
          fmt::format("written with --deterministic {}, resumed with --deterministic {}: the resumed steps {} "
                      "bit-identical to an uninterrupted run",
                      was ? "on" : "off", o.deterministic ? "on" : "off",
                      o.deterministic && !was ? "are deterministic from here on, but not" : "are not"));
  }
  if (!same_optimizer)
    warn(fmt::format("written with optimizer '{}', resumed with '{}': the optimizer state starts at zero", s.optimizer,
                     plan::optimizer_name(o.optimizer)));
  if (ema_from_params) warn("the checkpoint has no EMA weights: the EMA starts at the loaded weights");
  {  // The options the checkpoint's run_config records against this run's.
    std::map<std::string, std::string> was = recorded_options(s.run_config);
    // Every checkpoint of ours records them (options_yaml); an edited or foreign run_config was compared key by key
    // and, holding none, not at all, without a word.
    if (!was.count("lr") || !was.count("epochs"))
      warn(
          "its run_config records no --lr or --epochs: the resumed run's options are not compared with the ones it "
          "was written with");
    auto differs = [&](const char* key, const std::string& now) { return was.count(key) && was[key] != now; };
    if (differs("epochs", fmt::format("{}", o.epochs)))
      warn(
          fmt::format("written with --epochs {}, resumed with --epochs {}: the learning-rate schedule, a function of "
                      "the run's total steps, differs from the run that wrote it",
                      was["epochs"], o.epochs));
    // --max-steps bounds the schedule's length too, min(--max-steps, --epochs x batches): a resume that changes it
    // under a schedule whose lr depends on it (onecycle, cosine) changed step 11's lr without a word. (Another
    // --epochs has its warning above.)
    if (differs("max-steps", fmt::format("{}", o.max_steps)) && was.count("epochs") &&
        (o.schedule == ScheduleKind::ONE_CYCLE || o.schedule == ScheduleKind::COSINE)) {
      const std::int64_t batches = shard_of(o, m_impl->data.size(io::Split::train)).batches();
      const auto total = [&](std::int64_t max_steps, std::int64_t epochs) {
        return max_steps > 0 ? std::min(max_steps, batches * epochs) : batches * epochs;
      };
      const std::int64_t before = total(whole_number(was["max-steps"]), whole_number(was["epochs"]));
      const std::int64_t now = total(o.max_steps, o.epochs);
      const auto shown = [](std::int64_t v) { return v > 0 ? fmt::format("{}", v) : std::string("(none)"); };
      if (before != now)
        warn(
            fmt::format("written with --max-steps {}, resumed with --max-steps {}: the learning-rate schedule spans "
                        "{} steps, not the {} of the run that wrote it",
                        shown(whole_number(was["max-steps"])), shown(o.max_steps), now, before));
    }
    if (o.max_steps > 0 && s.step > o.max_steps)
      warn(fmt::format("the checkpoint is at step {}, past --max-steps {}: no step is trained", s.step, o.max_steps));
    if (differs("lr", fmt::format("{}", o.lr)) || differs("schedule", schedule_name(o.schedule)))
      warn(
          fmt::format("written with --lr {} --schedule {}, resumed with --lr {} --schedule {}: the rest of the run "
                      "follows the new learning rate",
                      was["lr"], was["schedule"], o.lr, schedule_name(o.schedule)));
    else if (o.schedule == ScheduleKind::ONE_CYCLE && (differs("onecycle-pct", fmt::format("{}", o.onecycle_pct)) ||
                                                         differs("onecycle-div", fmt::format("{}", o.onecycle_div))))
      warn(
          fmt::format("written with --onecycle-pct {} --onecycle-div {}, resumed with {} and {}: the rest of the run "
                      "follows the new learning rate",
                      was["onecycle-pct"], was["onecycle-div"], o.onecycle_pct, o.onecycle_div));
    if (differs("conv-stats", conv_stats_name(o)))
      warn(fmt::format("written with --conv-stats {}, resumed with --conv-stats {}: the batch-norm statistics are "
                       "summed otherwise, so the resumed steps are not bit-identical to an uninterrupted run",
                       was["conv-stats"], conv_stats_name(o)));
    if (differs("cpu-winograd", cpu_winograd_name(o)) && was["cpu-winograd"] != "n/a" && o.backend == Backend::CPU)
      warn(
          fmt::format("written with the CPU's Winograd convolutions {}, resumed with them {} (--cpu-winograd, "
                      "RENAISSANCE_CPU_WINOGRAD): they round otherwise, so the resumed steps are not bit-identical "
                      "to an uninterrupted run",
                      was["cpu-winograd"], cpu_winograd_name(o)));
    if (differs("sync-bn", fmt::format("{}", o.sync_bn)) && (s.world_size > 1 || I.comm_world() > 1))
      warn(
          fmt::format("written {} --sync-bn, resumed {}: the batch-norm statistics are now taken over {}, so the "
                      "rest of the run differs",
                      o.sync_bn ? "without" : "with", o.sync_bn ? "with it" : "without it",
                      o.sync_bn ? "every rank's batch" : "each rank's own batch"));
    if (differs("onecycle-momentum", onecycle_momentum_name(o)))
      warn(fmt::format("written with --onecycle-momentum {}, resumed with {}: the rest of the run follows the new "
                       "momentum",
                       was["onecycle-momentum"], onecycle_momentum_name(o)));
    {  // The other hyper-parameters and augmentations, said in one warning (they changed without a word).
      std::map<std::string, std::string> now = recorded_options(options_yaml(o));
      // Only what this run uses (train warns of the others: "has no effect"): another --warmup-epochs under
      // --schedule onecycle was called a change of the run.
      const bool adam = o.optimizer == plan::OptimizerKind::ADAM || o.optimizer == plan::OptimizerKind::ADAMW;
      const auto applies = [&](const std::string& key) {
        if (key == "warmup-epochs") return o.schedule != ScheduleKind::ONE_CYCLE;
        if (key == "step-epochs" || key == "step-gamma") return o.schedule == ScheduleKind::STEP;
        if (key == "momentum") return o.optimizer != plan::OptimizerKind::SGD && !adam;
        if (key == "beta1" || key == "beta2" || key == "eps") return adam;
        if (key == "lars-eta") return o.optimizer == plan::OptimizerKind::LARS;
        if (key == "ema-decay") return o.ema;
        if (key == "crop-scale" || key == "crop-ratio") return o.augmentation.crop == io::CropMode::random_resized;
        if (key == "start-resolution") return o.lowres_epochs > 0;
        return true;
      };
      std::string before, after;
      for (const char* key : kResumeWarnedOptions)
        if (was.count(key) && now.count(key) && was[key] != now[key] && applies(key)) {
          before += fmt::format("{}--{} {}", before.empty() ? "" : " ", key, was[key]);
          after += fmt::format("{}--{} {}", after.empty() ? "" : " ", key, now[key]);
        }
      if (!before.empty())
        warn(fmt::format("written with {}, resumed with {}: the rest of the run trains with the new values", before,
                         after));
    }
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

}  // namespace renaissance::runtime
