// `renaissance plan`: compile a model and show the fused layer table, the region map and the totals.
#include "cli_errors.h"
#include "commands.h"
#include "json_writer.h"
#include "model_options.h"
#include "stdout_print.h"

#include <renaissance/core/error.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/plan/fusion.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>

namespace renaissance::app {

namespace {

struct PlanOptions {
  ModelOptions model;
  plan::TrainConfig cfg;
  std::string optimizer = "momentum";
  bool no_fuse = false;
  bool no_reuse = false;
  bool pool = false;
  bool graph = false;
  bool nodes = false;
  std::string fused_kernels = "on";
  std::string recompute = "off";
  std::int64_t recompute_budget = 0;
  std::string relu_mask = "on";
  bool yaml = false;
  bool json = false;
};

std::string human_bytes(std::int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

void print_text(const plan::CompiledPlan& p) {
  const plan::ArchPlan& a = p.arch;
  print_stdout("Model {}: input {} ({} channels{}), {} classes, amp {}, fuse {}\n", a.model_name, a.input.str_hwc(),
               a.input_channels, a.input.c != a.input_channels ? fmt::format(", padded to {}", a.input.c) : "",
               a.num_classes, a.amp ? "on" : "off", a.fuse ? "on" : "off");
  print_stdout("\n{:<4} {:<28} {:<22} {:<13}    {:<13} {:>12} {:>14}\n", "#", "layer", "kind", "input", "output",
               "parameters", "MACs");
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const plan::ArchLayer& l = a.layers[i];
    print_stdout("{:<4} {:<28} {:<22} {:<13} -> {:<13} {:>12} {:>14}{}\n", i, l.name, plan::layer_kind_name(l.kind),
                 l.in_shape.str_hwc(), l.out_shape.str_hwc(), plan::layer_parameter_count(l),
                 plan::layer_forward_macs(l), l.is_first_layer ? "  (first)" : "");
  }
  print_stdout("\nRegion map (tensors, bytes per variant; empty regions omitted)\n{:<22} {:>7}", "region", "tensors");
  for (const auto& m : p.memory) print_stdout(" {:>17}", m.variant());
  print_stdout("\n");
  for (int r = 0; r < kNamedRegions; ++r) {
    const Region reg = region_at(r);
    if (p.memory[0].region_range(reg).bytes == 0 && p.memory[0].region_tensor_count(reg) == 0) continue;
    print_stdout("{:<22} {:>7}", region_name(reg), p.memory[0].region_tensor_count(reg));
    for (const auto& m : p.memory) print_stdout(" {:>17}", m.region_range(reg).bytes);
    print_stdout("\n");
  }
  print_stdout("{:<22} {:>7}", "arena total", p.memory[0].tensors().size());
  for (const auto& m : p.memory) print_stdout(" {:>17}", m.total_bytes());
  print_stdout("\n\nParameters: {}   Forward: {:.3f} GMACs/image at {}x{}   Arena: {} ({} bytes, largest variant)\n",
               a.parameter_count(), static_cast<double>(a.forward_macs()) / 1e9, a.input.h, a.input.w,
               human_bytes(p.arena_bytes()), p.arena_bytes());
  const plan::MemoryPlan& m = p.memory[0];
  print_stdout("Activation pool (F_*): {} ({} bytes); its tensors' slots sum to {}; most live at once {}; reuse {}\n",
               human_bytes(m.pool_range().bytes), m.pool_range().bytes, human_bytes(m.pool_slot_bytes()),
               human_bytes(m.pool_peak_live_bytes()), m.reuses_memory() ? "on" : "off");
  if (p.config.recompute_bn_relu)
    print_stdout("Recomputed: {} BN -> ReLU outputs{}\n", p.config.recompute_limit,
                 p.config.recompute_budget_bytes > 0
                     ? p.arena_bytes() <= p.config.recompute_budget_bytes
                           ? fmt::format(" (the fewest that keep the arena within --recompute-budget {})",
                                         human_bytes(p.config.recompute_budget_bytes))
                           : fmt::format(" (all of them: the arena stays above --recompute-budget {})",
                                         human_bytes(p.config.recompute_budget_bytes))
                     : std::string());
  print_stdout("Graphs: train {} nodes, inference {} nodes   Plan hash: {:016x}\n", p.train.node_count(),
               p.inference.node_count(), p.hash);
}

/// The activation pool tensor by tensor (largest first), and what is live where the most is live.
void print_pool(const plan::CompiledPlan& p) {
  const plan::MemoryPlan& m = p.memory[0];
  std::vector<const DTensor*> owners;
  for (const DTensor& t : m.tensors())
    if (plan::is_pool_region(t.region) && !m.aliases().count(t.id)) owners.push_back(&t);
  std::stable_sort(owners.begin(), owners.end(), [](const DTensor* a, const DTensor* b) { return a->slot_bytes > b->slot_bytes; });
  auto life = [&](const DTensor* t) {
    auto it = m.lifetimes().find(t->id);
    if (it == m.lifetimes().end()) return std::string("-");
    std::string s;
    for (const plan::LiveInterval& i : it->second) s += fmt::format("{}[{},{}]", s.empty() ? "" : " ", i.first, i.last);
    return s;
  };
  // the program point with the most live bytes
  std::map<std::int32_t, std::int64_t> at;
  for (const auto& [id, l] : m.lifetimes())
    for (const plan::LiveInterval& i : l)
      for (std::int32_t q = i.first; q <= i.last && q - i.first < 100000; ++q) at[q] += m.tensor(id).slot_bytes;
  std::int32_t peak = -1;
  std::int64_t most = -1;
  for (auto [q, b] : at)
    if (b > most) most = b, peak = q;
  print_stdout("\nActivation pool: {} tensors owning bytes; the most live at once, {}, at program point {}\n",
               owners.size(), human_bytes(std::max<std::int64_t>(most, 0)), peak);
  print_stdout("{:<48} {:<17} {:>12} {:>14}  {:<5} {}\n", "tensor", "region", "bytes", "offset", "peak", "lifetime");
  for (const DTensor* t : owners) {
    bool live_at_peak = false;
    if (auto it = m.lifetimes().find(t->id); it != m.lifetimes().end())
      for (const plan::LiveInterval& i : it->second) live_at_peak |= i.first <= peak && peak <= i.last;
    print_stdout("{:<48} {:<17} {:>12} {:>14}  {:<5} {}\n", t->name, region_name(t->region), t->slot_bytes, t->offset,
                 live_at_peak ? "yes" : "", life(t));
  }
}

/// The step as the runtime replays it: the plan's step schedule phase by phase, each bucket's nodes in order with
/// their tensors (name, region, byte offset, shape and dtype of the variant that replays it) and region ranges.
void print_graph(const plan::CompiledPlan& p) {
  print_stdout(
      "\nStep schedule (plan/step_schedule.h): {} entries; tensors as name:region@offset[shape dtype] of "
      "train_base (train phases) or val_base (validation phases)\n",
      p.schedule.entries.size());
  auto tensor = [](const plan::MemoryPlan& m, TensorId id) {
    if (id == kNoTensor) return std::string("-");
    const DTensor& t = m.tensor(id);
    return fmt::format("{}:{}@{}[{} {}]", t.name, region_name(t.region), t.offset, t.shape.str(), dtype_name(t.dtype));
  };
  auto tensors = [&](const plan::MemoryPlan& m, const std::vector<TensorId>& ids) {
    std::string s;
    for (TensorId id : ids) s += (s.empty() ? "" : ", ") + tensor(m, id);
    return s.empty() ? std::string("-") : s;
  };
  auto ranges = [](const plan::MemoryPlan& m, const std::vector<RegionRange>& rs) {
    std::string s;
    for (RegionRange r : rs) {
      const plan::ByteRange b = m.resolve_region_bounds(r);
      s += fmt::format("{}{}..{}@{}+{}", s.empty() ? "" : ", ", region_name(r.first), region_name(r.last), b.offset,
                       b.bytes);
    }
    return s.empty() ? std::string("-") : s;
  };
  std::function<void(const plan::MemoryPlan&, const plan::Node&, int)> node = [&](const plan::MemoryPlan& m,
                                                                                  const plan::Node& n, int depth) {
    const std::string indent(static_cast<std::size_t>(4 + 2 * depth), ' ');
    const std::string layer = n.layer_index >= 0 && static_cast<std::size_t>(n.layer_index) < p.arch.layers.size()
                                  ? p.arch.layers[static_cast<std::size_t>(n.layer_index)].name
                                  : std::string();
    if (n.type == plan::NodeType::RANGE) {
      print_stdout("{}{} in {} -> out {}\n", indent, range_op_name(n.range_op), ranges(m, n.input_ranges),
                   ranges(m, n.output_ranges));
      return;
    }
    if (!n.sub.empty()) {  // a fused node: its parts carry the operands
      print_stdout("{}{}{}: {} parts\n", indent, op_kind_name(n.op), layer.empty() ? "" : " " + layer, n.sub.size());
    } else {
      print_stdout("{}{}{}{} in {} -> out {}\n", indent, op_kind_name(n.op), layer.empty() ? "" : " " + layer,
                   n.accumulate ? " (+=)" : "", tensors(m, n.inputs), tensors(m, n.outputs));
    }
    for (const plan::Node& s : n.sub) node(m, s, depth + 1);
  };
  const plan::StepPhase none = static_cast<plan::StepPhase>(255);
  plan::StepPhase phase = none;
  for (const plan::ScheduleEntry& e : p.schedule.entries) {
    const bool inference = plan::is_inference_phase(e.phase);
    const plan::MemoryPlan& m = p.plan(inference ? plan::Variant::VAL_BASE : plan::Variant::TRAIN_BASE);
    const std::vector<plan::Node>& bucket = (inference ? p.inference : p.train).bucket(e.graph);
    if (e.phase != phase) print_stdout("\n[{}]\n", step_phase_name(e.phase));
    phase = e.phase;
    print_stdout("  {} on the {} stream{}{}: {}\n", graph_id_name(e.graph), stream_name(e.stream),
                 e.slot < 0 ? "" : (e.slot == 0 ? ", input buffer A" : ", input buffer B"),
                 e.joins == plan::Stream::SIDE ? ", after joining the side stream" : "",
                 bucket.empty() ? std::string("empty") : fmt::format("{} node(s)", bucket.size()));
    for (const plan::Node& n : bucket) node(m, n, 0);
  }
}

/// Every fused node of the train and inference graphs as the backends run it (plan::Node::fusions): one line per
/// step, a fused pass with its named operands (tensor names of train_base) or a plain part the node keeps.
void print_nodes(const plan::CompiledPlan& p) {
  const plan::MemoryPlan& m = p.memory[0];
  auto name = [&](TensorId id) { return id == kNoTensor ? std::string("-") : m.tensor(id).name; };
  auto operands = [&](const std::vector<plan::FusedOperand>& v) {
    std::string s;
    for (const plan::FusedOperand& o : v) s += fmt::format("{}{}={}", s.empty() ? "" : ", ", o.name, name(o.id));
    return s.empty() ? std::string("-") : s;
  };
  std::map<ops::FusedKind, int> counts;
  int fused_nodes = 0, plain_parts = 0;
  print_stdout("\nFused nodes (plan/fusion.cpp; --fused-kernels {}): each step as it runs\n",
               p.config.fuse_kernels ? "on" : "off");
  for (bool inference : {false, true}) {
    const plan::ComputationGraph& g = inference ? p.inference : p.train;
    for (int gi = 0; gi < plan::kGraphIds; ++gi) {
      const plan::GraphId gid = static_cast<plan::GraphId>(gi);
      for (const plan::Node& n : g.bucket(gid)) {
        if (n.sub.empty()) continue;
        ++fused_nodes;
        const std::string layer = n.layer_index >= 0 && static_cast<std::size_t>(n.layer_index) < p.arch.layers.size()
                                      ? p.arch.layers[static_cast<std::size_t>(n.layer_index)].name
                                      : std::string("?");
        print_stdout("  {} {} {} ({}): {} parts, {} fused passes\n", inference ? "inference" : "train",
                     graph_id_name(gid), op_kind_name(n.op), layer, n.sub.size(), n.fusions.size());
        const std::vector<int> step = plan::fused_step_of(n);
        for (std::size_t k = 0; k < n.sub.size(); ++k) {
          if (step[k] == -2) continue;
          if (step[k] == -1) {
            const plan::Node& s = n.sub[k];
            ++plain_parts;
            print_stdout(
                "    [{}] {}{} in {} -> out {}\n", k, op_kind_name(s.op), s.accumulate ? " (+=)" : "",
                [&] {
                  std::string t;
                  for (TensorId id : s.inputs) t += (t.empty() ? "" : ", ") + name(id);
                  return t;
                }(),
                [&] {
                  std::string t;
                  for (TensorId id : s.outputs) t += (t.empty() ? "" : ", ") + name(id);
                  return t;
                }());
            continue;
          }
          const plan::FusedPass& f = n.fusions[static_cast<std::size_t>(step[k])];
          ++counts[f.kind];
          std::string parts;
          for (std::int32_t q : f.parts) parts += fmt::format("{}{}", parts.empty() ? "" : ",", q);
          print_stdout("    [{}] {} (parts {}) in {} -> out {}; saved {}{}\n", k, ops::fused_kind_name(f.kind), parts,
                       operands(f.inputs), operands(f.outputs), operands(f.saved),
                       f.fallback_only ? " (for the plain parts only: not run with the passes)" : "");
        }
      }
    }
  }
  std::string summary;
  for (auto [k, c] : counts) summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", c, ops::fused_kind_name(k));
  print_stdout("Fused nodes: {}; fused passes: {}; plain parts kept: {}\n", fused_nodes,
               summary.empty() ? std::string("none") : summary, plain_parts);
}

void print_json(const plan::CompiledPlan& p, double build_s, double compile_s) {
  const plan::ArchPlan& a = p.arch;
  JsonWriter j;
  j.begin_object();
  j.kv("model", a.model_name).kv("parameters", a.parameter_count());
  j.kv("gmacs", static_cast<double>(a.forward_macs()) / 1e9).kv("macs", a.forward_macs());
  j.kv("arena_bytes", p.arena_bytes()).kv("amp", a.amp).kv("fuse", a.fuse).kv("num_classes", a.num_classes);
  j.kv("recomputed", p.config.recompute_bn_relu ? p.config.recompute_limit : 0)
      .kv("recompute_budget_bytes", p.config.recompute_budget_bytes);
  j.kv("optimizer", plan::optimizer_name(p.config.optimizer)).kv("ema", p.config.ema);
  j.kv("hash", fmt::format("{:016x}", p.hash));
  const plan::MemoryPlan& m = p.memory[0];
  j.key("pool").begin_object().kv("reuse", m.reuses_memory()).kv("bytes", m.pool_range().bytes);
  j.kv("slot_bytes", m.pool_slot_bytes()).kv("peak_live_bytes", m.pool_peak_live_bytes()).end_object();
  j.key("input").begin_array().value(a.input.h).value(a.input.w).value(a.input.c).end_array();
  j.key("layers").begin_array();
  for (const plan::ArchLayer& l : a.layers) {
    j.begin_object().kv("name", l.name).kv("kind", plan::layer_kind_name(l.kind));
    j.key("in").begin_array().value(l.in_shape.h).value(l.in_shape.w).value(l.in_shape.c).end_array();
    j.key("out").begin_array().value(l.out_shape.h).value(l.out_shape.w).value(l.out_shape.c).end_array();
    j.kv("parameters", plan::layer_parameter_count(l)).kv("macs", plan::layer_forward_macs(l));
    j.kv("first", l.is_first_layer).end_object();
  }
  j.end_array();
  j.key("variants").begin_array();
  for (std::size_t v = 0; v < p.memory.size(); ++v) {
    const auto& s = p.specs[v];
    j.begin_object().kv("name", p.memory[v].variant()).kv("batch", s.batch_size);
    j.kv("resolution", s.actual_resolution).kv("arena_bytes", p.memory[v].total_bytes()).end_object();
  }
  j.end_array();
  j.key("regions").begin_array();
  for (int r = 0; r < kNamedRegions; ++r) {
    const Region reg = region_at(r);
    j.begin_object().kv("region", region_name(reg)).kv("tensors", p.memory[0].region_tensor_count(reg));
    j.key("bytes").begin_object();
    for (const auto& m : p.memory) j.kv(m.variant(), m.region_range(reg).bytes);
    j.end_object().end_object();
  }
  j.end_array();
  j.key("graphs").begin_object().kv("train_nodes", static_cast<std::int64_t>(p.train.node_count()));
  j.kv("inference_nodes", static_cast<std::int64_t>(p.inference.node_count())).end_object();
  j.key("startup").begin_object().kv("archplan_s", build_s).kv("compile_s", compile_s).end_object();
  j.end_object();
  std::puts(j.str().c_str());
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto opt = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "Compile a model and print its layer table, region map and totals");
  opt->model.add_to(*cmd);
  cmd->add_option("--batch", opt->cfg.batch, "Batch size")->capture_default_str();
  cmd->add_flag("--amp", opt->cfg.amp, "Mixed precision (FP16 activations, fused layers)");
  cmd->add_flag("--no-fuse", opt->no_fuse, "Keep residual blocks as plain layers (Conv+BN+ReLU stays one CBR layer)");
  cmd->add_option("--optimizer", opt->optimizer, "sgd|momentum|nesterov|adam|adamw|lars")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam", "adamw", "lars"}));
  cmd->add_flag("--ema", opt->cfg.ema, "Keep an exponential moving average of the weights");
  cmd->add_option("--dataset-size", opt->cfg.dataset_size, "Training samples (sizes the last partial batch)")
      ->capture_default_str();
  cmd->add_option("--val-size", opt->cfg.val_size, "Validation samples")->capture_default_str();
  cmd->add_option("--start-resolution", opt->cfg.start_resolution, "Progressive resize: first resolution")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));  // train's range (a negative one planned)
  cmd->add_flag("--no-reuse", opt->no_reuse, "Give every feature and gradient bytes of its own (no liveness-based reuse)");
  CLI::Option* pool =
      cmd->add_flag("--pool", opt->pool, "Also list the activation pool tensor by tensor with offsets and lifetimes");
  CLI::Option* graph =
      cmd->add_flag("--graph", opt->graph,
                    "Also print the step schedule: each bucket's nodes in replay order with tensor names, regions and "
                    "offsets");
  CLI::Option* nodes = cmd->add_flag(
      "--nodes", opt->nodes,
      "Also print every fused node as it runs: the compiler's fused passes with their named operands, and "
      "the plain parts it keeps");
  cmd->add_option("--fused-kernels", opt->fused_kernels,
                  "on: plan fused passes; off: fused layers keep their plain parts")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--recompute", opt->recompute,
                  "bn-relu: form each BN -> ReLU output the backward reads again there instead of keeping it (less "
                  "memory, one more element-wise pass each); off: keep them")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "bn-relu"}));
  add_recompute_budget_option(*cmd, opt->recompute_budget);
  add_relu_mask_option(*cmd, opt->relu_mask);
  CLI::Option* yaml = cmd->add_flag("--yaml", opt->yaml, "Print the ArchPlan as YAML (alone: no report)");
  CLI::Option* json = cmd->add_flag("--json", opt->json, "Print the report as JSON");
  // --yaml prints only the ArchPlan: the report's options beside it were dropped without a word.
  for (CLI::Option* o : {json, pool, graph, nodes}) yaml->excludes(o);
  for (CLI::Option* o : {pool, graph, nodes}) json->excludes(o);  // the JSON report has none of them
  cmd->callback([opt] {
    const blueprint::BluePrint bp = opt->model.load();
    plan::BuildOptions bo;
    bo.amp = opt->cfg.amp;
    bo.fuse = !opt->no_fuse;
    bo.num_classes = opt->model.classes;
    bo.resolution = opt->model.resolution;
    plan::ArchPlan arch;
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    try {
      arch = plan::ArchPlan::build(bp, bo);
    } catch (const Error& e) {
      if (opt->model.model_file.empty()) throw;
      throw e.with_context(opt->model.model_file);  // shape errors name the file as well as the layer
    }
    opt->cfg.optimizer = plan::optimizer_from_name(opt->optimizer);
    opt->cfg.reuse_memory = !opt->no_reuse;
    opt->cfg.fuse_kernels = opt->fused_kernels == "on";
    opt->cfg.recompute_bn_relu = opt->recompute == "bn-relu";
    opt->cfg.recompute_budget_bytes = opt->recompute_budget;
    opt->cfg.relu_masks = opt->relu_mask == "on";
    const auto t1 = Clock::now();
    // Compiled with --yaml too: the options beside it (--batch -5, --start-resolution 7, ...) are checked as without
    // it, not dropped with a zero exit.
    const plan::CompiledPlan compiled = plan::Compiler::compile(arch, opt->cfg);
    if (opt->yaml) {
      std::fputs(arch.to_yaml().c_str(), stdout);
      return;
    }
    const double build_s = std::chrono::duration<double>(t1 - t0).count();
    const double compile_s = std::chrono::duration<double>(Clock::now() - t1).count();
    if (opt->json) {
      print_json(compiled, build_s, compile_s);
    } else {
      print_text(compiled);
      // On the device `train` and `bench` add engine choice and capture to this (they report their own start-up).
      print_stdout("Start-up on the host: ArchPlan {:.1f} ms, Compiler {:.1f} ms\n", 1e3 * build_s, 1e3 * compile_s);
    }
    if (opt->pool && !opt->json) print_pool(compiled);
    if (opt->graph && !opt->json) print_graph(compiled);
    if (opt->nodes && !opt->json) print_nodes(compiled);
  });
}

}  // namespace renaissance::app
