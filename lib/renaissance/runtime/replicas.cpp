#include <renaissance/core/error.h>
#include <renaissance/runtime/replicas.h>

#include <fmt/format.h>

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

std::string describe_plan_config(const plan::CompiledPlan& p) {
  const plan::TrainConfig& c = p.config;
  return fmt::format(
      "model={}\nper-rank batch={}\nper-rank train samples={}\nval batch={}\nval samples={}\noptimizer={}\n"
      "ema={}\namp={}\nstart resolution={}\nend resolution={}\nlayers={}\nparameters={}\n",
      p.arch.model_name, c.batch, c.dataset_size, c.val_batch, c.val_size, plan::optimizer_name(c.optimizer), c.ema,
      c.amp, c.start_resolution, c.end_resolution, p.arch.layers.size(), p.arch.parameter_count());
}

}  // namespace

std::string describe_run_options(const TrainOptions& o) {
  return fmt::format(
      "backend={}\nepochs={}\nglobal batch={}\nval batch={}\nlr={}\nmomentum={}\nbeta1={}\nbeta2={}\neps={}\n"
      "weight decay={}\nlars eta={}\nschedule={}\nwarmup epochs={}\nstep epochs={}\nstep gamma={}\n"
      "label smoothing={}\nema decay={}\nseed={}\nmax steps={}\ncrop padding={}\nflip={}\ncrop={} scale {},{} ratio {},{} "
      "val resize {}\nshuffle={}\n"
      "lowres epochs={}\nbn momentum={}\nbn eps={}\nloss scale={}\nloss scale interval={}\nvalidate={}\nfuse={}\n"
      "sync bn={}\n",
      backend_name(o.backend), o.epochs, o.batch, o.val_batch, o.lr, o.momentum, o.beta1, o.beta2, o.eps,
      o.weight_decay, o.lars_eta, schedule_name(o.schedule), o.warmup_epochs, o.step_epochs, o.step_gamma,
      o.label_smoothing, o.ema_decay, o.seed, o.max_steps, o.augmentation.crop_padding, o.augmentation.horizontal_flip,
      io::crop_mode_name(o.augmentation.crop), o.augmentation.scale_min, o.augmentation.scale_max,
      o.augmentation.ratio_min, o.augmentation.ratio_max, o.augmentation.val_resize, o.shuffle, o.lowres_epochs, o.bn_momentum, o.bn_eps, o.loss_scale, o.loss_scale_interval, o.validate, o.fuse,
      o.sync_bn);
}

void check_replicas(Communicator& comm, const plan::CompiledPlan& plan, const std::string& run_options) {
  if (comm.world_size() == 1) return;
  const int rank = comm.rank();
  const std::uint64_t mine = plan::content_hash(plan);
  std::vector<std::uint8_t> root_plan;
  if (rank == 0) root_plan = plan::serialize(plan);
  comm.broadcast(root_plan, 0);
  std::vector<std::uint8_t> root_opts(run_options.begin(), run_options.end());
  comm.broadcast(root_opts, 0);

  std::vector<std::string> diffs;
  if (rank != 0) {
    const plan::CompiledPlan theirs = plan::deserialize(root_plan);  // checks rank 0's hash over the bytes
    if (theirs.hash != mine) {
      diffs = diff_lines(describe_plan_config(theirs), describe_plan_config(plan));
      if (diffs.empty())
        diffs.push_back(
            "the compiled plans differ (same model name and sizes: a different model "
            "file or layer options?)");
      diffs.push_back(fmt::format("plan hash {:016x} on rank 0 but {:016x} here", theirs.hash, mine));
    }
    for (std::string& d : diff_lines(std::string(root_opts.begin(), root_opts.end()), run_options))
      diffs.push_back(std::move(d));
  }
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

}  // namespace renaissance::runtime
