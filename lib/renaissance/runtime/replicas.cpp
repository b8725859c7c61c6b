#include <renaissance/core/error.h>
#include <renaissance/core/hash.h>
#include <renaissance/runtime/replicas.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

namespace renaissance::runtime {

namespace {

std::map<std::string, std::string> parse_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

/// The differences between two "key=value" texts: "lr 0.1 on rank 0, 0.2 here; ...".
std::vector<std::string> diff_lines(const std::string& root, const std::string& mine) {
  const auto a = parse_lines(root), b = parse_lines(mine);
  std::vector<std::string> out;
  for (const auto& [k, v] : a) {
    const auto it = b.find(k);
    const std::string w = it == b.end() ? "<unset>" : it->second;
    if (w != v) out.push_back(fmt::format("{} is {} on rank 0 but {} here", k, v, w));
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) out.push_back(fmt::format("{} is <unset> on rank 0 but {} here", k, v));
  return out;
}

/// FNV-1a 64 over the fields of a layer tree: equal trees give equal hashes (the model content of the comparison).
struct TreeHash {
  std::uint64_t h = kFnv1aOffset;
  void bytes(const void* p, std::size_t n) { h = fnv1a(p, n, h); }
  void i64(std::int64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& v) {
    i64(static_cast<std::int64_t>(v.size()));
    bytes(v.data(), v.size());
  }
  void layer(const blueprint::Layer& l) {
    i64(static_cast<std::int64_t>(l.kind));
    str(l.name);
    for (std::int64_t v : {l.out_c, l.mid_c, l.k, l.stride, l.pad, l.groups, l.count, static_cast<std::int64_t>(l.bias),
                           static_cast<std::int64_t>(l.block)})
      i64(v);
    i64(static_cast<std::int64_t>(l.children.size()));
    for (const blueprint::Layer& c : l.children) layer(c);
  }
};

/// Rank 0's plan message: one status byte (1: the serialised plan follows; 0: the error rank 0 raised, as message,
/// context and hint separated by NUL bytes).
std::vector<std::uint8_t> error_message(const std::string& message, const std::string& context,
                                        const std::string& hint) {
  std::vector<std::uint8_t> out{0};
  for (const std::string* part : {&message, &context, &hint}) {
    out.insert(out.end(), part->begin(), part->end());
    out.push_back(0);
  }
  return out;
}

[[noreturn]] void throw_error_message(const std::vector<std::uint8_t>& msg) {
  std::string parts[3];
  std::size_t k = 0;
  for (std::size_t i = 1; i < msg.size() && k < 3; ++i) {
    if (msg[i] == 0)
      ++k;
    else
      parts[k].push_back(static_cast<char>(msg[i]));
  }
  throw Error(parts[0], parts[1], parts[2]);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

std::string describe_run_options(const TrainOptions& o) {
  return fmt::format(
      "backend={}\nepochs={}\nglobal batch={}\nval batch={}\nlr={}\nmomentum={}\nbeta1={}\nbeta2={}\neps={}\n"
      "weight decay={}\nlars eta={}\nschedule={}\nonecycle pct={}\nonecycle div={}\nwarmup epochs={}\n"
      "step epochs={}\nstep gamma={}\n"
      "label smoothing={}\nema decay={}\nseed={}\nmax steps={}\ncrop padding={}\nflip={}\ncrop={} scale {},{} ratio "
      "{},{} "
      "val resize {}\nshuffle={}\n"
      "lowres epochs={}\nbn momentum={}\nbn eps={}\nloss scale={}\nloss scale interval={}\nvalidate={}\n"
      "validate each epoch={}\ntta flip={}\nfuse={}\n"
      "sync bn={}\nzero-init residual={}\ndrop last={}\nonecycle momentum={} {},{}\n"
      // Where a run agrees on stopping and writes checkpoints: collectives every rank must call alike (rank 0 alone
      // writes, so the directory's path may differ: node-local scratch).
      "checkpoint dir={}\ncheckpoint every={}\ncheckpoint each epoch={}\nkeep best={}\npreemption handlers={}\n{}",
      backend_name(o.backend), o.epochs, o.batch, o.val_batch, o.lr, o.momentum, o.beta1, o.beta2, o.eps,
      o.weight_decay, o.lars_eta, schedule_name(o.schedule), o.onecycle_pct, o.onecycle_div, o.warmup_epochs,
      o.step_epochs, o.step_gamma, o.label_smoothing, o.ema_decay, o.seed, o.max_steps, o.augmentation.crop_padding,
      o.augmentation.horizontal_flip, io::crop_mode_name(o.augmentation.crop), o.augmentation.scale_min,
      o.augmentation.scale_max, o.augmentation.ratio_min, o.augmentation.ratio_max, o.augmentation.val_resize,
      o.shuffle, o.lowres_epochs, o.bn_momentum, o.bn_eps, o.loss_scale, o.loss_scale_interval, o.validate,
      o.validate_each_epoch, o.tta_flip, o.fuse, o.sync_bn, o.zero_init_residual, o.drop_last, o.onecycle_momentum,
      o.onecycle_base_momentum, o.onecycle_max_momentum, o.checkpoint_dir.empty() ? "none" : "given",
      o.checkpoint_every, o.checkpoint_each_epoch, o.checkpoint_keep_best, o.stop_request != nullptr,
      o.command_settings);
}

std::string describe_plan_inputs(const blueprint::BluePrint& model, const plan::BuildOptions& build,
                                 const plan::TrainConfig& c) {
  TreeHash t;
  t.layer(model.root);
  return fmt::format(
      "model={}\nmodel layers hash={:016x}\ninput={}x{}x{}\namp={}\nfuse={}\nclasses={}\nresolution={}\n"
      "per-rank batch={}\nper-rank train samples={}\nval batch={}\nval samples={}\noptimizer={}\nema={}\n"
      "start resolution={}\nend resolution={}\nfreeze first layer={}\nreuse memory={}\nfused kernels={}\nfold residual "
      "sums={}\nresidual bn backward={}\nshortcut bn backward={}\nrelu masks={}\nrecompute bn-relu={}\n",
      model.name, t.h, model.in_h, model.in_w, model.in_c, build.amp, build.fuse, build.num_classes, build.resolution,
      c.batch, c.dataset_size, c.val_batch, c.val_size, plan::optimizer_name(c.optimizer), c.ema, c.start_resolution,
      c.end_resolution, c.freeze_first_layer, c.reuse_memory, c.fuse_kernels, c.fold_residual_sums,
      c.fuse_residual_bn_backward, c.fuse_shortcut_bn_backward, c.relu_masks, c.recompute_bn_relu);
}

void check_replica_inputs(Communicator& comm, const std::string& description) {
  if (comm.world_size() == 1) return;
  const int rank = comm.rank();
  std::vector<std::uint8_t> root(description.begin(), description.end());
  comm.broadcast(root, 0);
  std::vector<std::string> diffs;
  if (rank != 0) diffs = diff_lines(std::string(root.begin(), root.end()), description);
  const std::int64_t bad = comm.agree_max(diffs.empty() ? -1 : rank);
  if (bad < 0) return;
  std::string text;
  for (std::string d : diffs) {
    const auto here = d.rfind(" here");
    if (here != std::string::npos) d.replace(here, 5, fmt::format(" on rank {}", rank));
    text += (text.empty() ? "" : "; ") + d;
  }
  std::vector<std::uint8_t> msg(text.begin(), text.end());
  comm.broadcast(msg, static_cast<int>(bad));
  throw Error(
      fmt::format("the configuration of rank {} differs from rank 0's: {}", bad, std::string(msg.begin(), msg.end())),
      "data-parallel run",
      "start every rank with the same options, model and dataset (the same command line under mpirun/srun)");
}

std::unique_ptr<plan::CompiledPlan> distribute_plan(Communicator* comm, const blueprint::BluePrint& model,
                                                    const plan::BuildOptions& build, const plan::TrainConfig& config,
                                                    const std::string& run_options, PlanOrigin* origin) {
  const double t0 = now_s();
  PlanOrigin o;
  std::unique_ptr<plan::CompiledPlan> out;
  const int world = comm ? comm->world_size() : 1;
  const int rank = comm ? comm->rank() : 0;
  if (world == 1) {
    out = std::make_unique<plan::CompiledPlan>(plan::Compiler::compile(plan::ArchPlan::build(model, build), config));
  } else {
    check_replica_inputs(*comm, describe_plan_inputs(model, build, config) + run_options);
    std::vector<std::uint8_t> msg;
    if (rank == 0) {
      // Rank 0 alone plans; an error it raises (a model that does not build, an arena too large) becomes every
      // rank's error, so all of them stop with the same message instead of waiting for a plan that never comes.
      try {
        out =
            std::make_unique<plan::CompiledPlan>(plan::Compiler::compile(plan::ArchPlan::build(model, build), config));
        std::vector<std::uint8_t> bytes = plan::serialize(*out);
        msg.reserve(bytes.size() + 1);
        msg.push_back(1);
        msg.insert(msg.end(), bytes.begin(), bytes.end());
      } catch (const Error& e) {
        msg = error_message(e.message(), e.context(), e.hint());
      } catch (const std::exception& e) {
        msg = error_message(e.what(), "", "");
      }
    }
    comm->broadcast(msg, 0);
    RN_CHECK(!msg.empty(), "internal: rank 0 broadcast an empty plan message");
    if (msg[0] == 0) throw_error_message(msg);
    o.bytes = static_cast<std::int64_t>(msg.size() - 1);
    if (rank != 0) {
      o.compiled_here = false;
      msg.erase(msg.begin());
      out = std::make_unique<plan::CompiledPlan>(plan::deserialize(msg));  // checks rank 0's hash over the bytes
      RN_CHECK(out->config == config,
               "internal: rank 0's plan was compiled for another training configuration than this rank's, although "
               "their descriptions matched");
    }
  }
  o.seconds = now_s() - t0;
  if (const char* r = std::getenv("RENAISSANCE_TEST_PLAN_REPORT"); r && *r) {
    std::fprintf(stderr,
                 "plan report: rank %d/%d: plan %s (%lld bytes, hash %016llx), %lld compilation(s) in this "
                 "process, %.3f s\n",
                 rank, world, o.compiled_here ? "compiled here" : "received from rank 0",
                 static_cast<long long>(o.bytes), static_cast<unsigned long long>(out->hash),
                 static_cast<long long>(plan::Compiler::compilations()), o.seconds);
    std::fflush(stderr);
  }
  if (origin) *origin = o;
  return out;
}

}  // namespace renaissance::runtime
