// `renaissance checkpoint inspect FILE`: what a checkpoint holds (attributes, tensors per group with shapes) and
// whether it is valid (every checksum verified); exit 1 for an invalid file.
#include "checkpoint_options.h"
#include "commands.h"
#include "json_writer.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/error.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/plan/arch_plan.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

namespace renaissance::app {

namespace {

int g_exit_code = 0;

struct InspectCli {
  std::string file;
  bool json = false;
  bool full = false;
};

bool is_long_attribute(const std::string& k) { return k == "model_yaml" || k == "arch_plan" || k == "run_config"; }

/// The arch plan and run config a checkpoint carries parse (bounded: a few KB of aliases could otherwise expand
/// without bound); throws naming the file and attribute. `checkpoint inspect` and `eval --checkpoint` alike.
void check_recorded_plan_and_config(const std::string& arch_plan, const std::string& run_config,
                                    const std::string& file) {
  (void)plan::ArchPlan::from_yaml(arch_plan, file + ": arch_plan");
  blueprint::check_yaml_limits(run_config, file + ": run_config");
}

/// The YAML a checkpoint carries must parse too: `eval --checkpoint` builds its model from model_yaml. The first
/// problem, or empty.
std::string check_recorded_yaml(const io::CheckpointReport& r, const std::string& file) {
  try {
    auto text = [&](const char* k) {
      const auto it = r.attributes.find(k);
      return it == r.attributes.end() ? std::string() : it->second;
    };
    if (!text("model_yaml").empty()) (void)blueprint::blueprint_from_yaml(text("model_yaml"), file + ": model_yaml");
    check_recorded_plan_and_config(text("arch_plan"), text("run_config"), file);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void run_inspect(const InspectCli& c) {
  io::CheckpointReport r = io::inspect_checkpoint(c.file);
  if (r.valid) {
    r.error = check_recorded_yaml(r, c.file);
    r.valid = r.error.empty();
  }
  std::map<std::string, std::vector<const io::CheckpointReport::Entry*>> groups;
  for (const auto& e : r.tensors) groups[e.group].push_back(&e);
  if (c.json) {
    JsonWriter j;
    j.begin_object().kv("file", c.file).kv("valid", r.valid);
    if (!r.valid) j.kv("error", r.error);
    j.key("attributes").begin_object();
    // Numbers as JSON numbers (integer and float attributes, one value or an array of them); a NaN or an infinity,
    // which JSON has no number for, stays text, and so does an integer beyond 2^53 (a --seed up to 2^64 - 1): jq and
    // JavaScript read numbers as doubles and would round it.
    const auto exact_in_a_double = [](const std::string& v) {  // every run of digits at most 2^53
      for (std::size_t at = v.find_first_of("0123456789"); at != std::string::npos;) {
        const std::size_t end = std::min(v.find_first_not_of("0123456789", at), v.size());
        if (end - at >= 16 && std::stod(v.substr(at, end - at)) > 9007199254740992.0) return false;
        at = v.find_first_of("0123456789", end);
      }
      return true;
    };
    for (const auto& [k, v] : r.attributes) {
      const bool finite = v.find("nan") == std::string::npos && v.find("inf") == std::string::npos;
      const bool integer = v.find_first_of(".eE") == std::string::npos;
      if (r.numeric.count(k) && finite && !v.empty() && (!integer || exact_in_a_double(v)))
        j.key(k).json_value(v);
      else
        j.kv(k, v);
    }
    j.end_object();
    j.key("groups").begin_object();
    for (const auto& [g, entries] : groups) {
      j.key(g).begin_array();
      for (const auto* e : entries) {
        j.begin_object().kv("name", e->name).key("shape").begin_array();
        for (std::int64_t d : e->dims) j.value(d);
        j.end_array().kv("ok", e->ok).end_object();
      }
      j.end_array();
    }
    j.end_object().end_object();
    std::puts(j.str().c_str());
  } else {
    // A format 1 file has no whole-file checksum: only each dataset's Fletcher32 was verified.
    const auto version = r.attributes.find("version");
    const bool format1 = version != r.attributes.end() && version->second == "1";
    std::printf("checkpoint %s: %s\n", terminal_text(c.file).c_str(),
                !r.valid  ? "INVALID"
                : format1 ? fmt::format("valid ({} datasets, each one's Fletcher32 verified; a format 1 file has no "
                                        "whole-file checksum)",
                                        r.tensors.size())
                                .c_str()
                          : fmt::format("valid ({} datasets, every checksum verified)", r.tensors.size()).c_str());
    for (const auto& [key, value] : r.attributes) {
      // Names and values come from the file: printed with their control characters escaped.
      const std::string k = terminal_text(key), v = terminal_text(value);
      if (is_long_attribute(k) && !c.full) {
        const auto lines = std::count(v.begin(), v.end(), '\n');
        std::printf("  %-13s (%lld lines of YAML; --full prints it)\n", k.c_str(), static_cast<long long>(lines));
      } else if (v.find('\n') != std::string::npos) {
        std::printf("  %s:\n%s\n", k.c_str(), v.c_str());
      } else {
        std::printf("  %-13s %s\n", k.c_str(), v.c_str());
      }
    }
    for (const char* g : {"state", "params", "bn", "optimizer", "ema"}) {
      const auto it = groups.find(g);
      if (it == groups.end()) continue;
      std::printf("/%s (%zu)\n", g, it->second.size());
      for (const auto* e : it->second)
        std::printf("  %-40s [%s]%s\n", terminal_text(e->name).c_str(),
                    fmt::format("{}", fmt::join(e->dims, ", ")).c_str(),
                    e->ok ? "" : "  BAD (checksum or read failure)");
    }
  }
  std::fflush(stdout);
  if (!r.valid) {
    std::fprintf(stderr, "renaissance: error: %s\n", terminal_text(r.error).c_str());
    set_exit_code(1);
  }
}

}  // namespace

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

std::optional<blueprint::BluePrint> checkpoint_model(const io::Checkpoint& ck, const std::string& path, bool required) {
  RN_CHECK_CTX(!required || !ck.state.model_yaml.empty(), path,
               "the checkpoint records no model YAML (pass --model or --model-file)");
  // What `checkpoint inspect` calls INVALID is refused here too: its arch plan and run config must parse as well.
  check_recorded_plan_and_config(ck.state.arch_plan, ck.state.run_config, path);
  if (ck.state.model_yaml.empty()) return std::nullopt;
  return blueprint::blueprint_from_yaml(ck.state.model_yaml, path + ": model_yaml");
}

void register_checkpoint_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "Checkpoint files (see docs/checkpoints.md)");
  cmd->require_subcommand(1);
  auto c = std::make_shared<InspectCli>();
  CLI::App* inspect = cmd->add_subcommand("inspect", "Show a checkpoint's attributes and tensors and verify it");
  inspect->add_option("file", c->file, "Checkpoint file (e.g. checkpoints/latest.h5)")->required();
  inspect->add_flag("--json", c->json, "Print the report as JSON");
  inspect->add_flag("--full", c->full, "Print the model YAML, the arch plan and the run config in full");
  inspect->callback([c] { run_inspect(*c); });
}

}  // namespace renaissance::app
