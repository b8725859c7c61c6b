#include "run_config.h"

#include <renaissance/core/error.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace renaissance::app {

void apply_run_config(CLI::App& cmd, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    RN_FAIL_CTX(path, "cannot read the run configuration");
  } catch (const YAML::ParserException& e) {
    RN_FAIL_CTX(fmt::format("{}:{}", path, e.mark.line + 1), "malformed YAML: {}", e.msg);
  }
  if (root.IsNull()) return;
  RN_CHECK_CTX(root.IsMap(), path, "a run configuration must be a YAML map of option: value");
  for (const auto& kv : root) {
    const std::string where = fmt::format("{}:{}", path, kv.first.Mark().line + 1);
    // A key like [a, b] or {a: 1} is valid YAML but no option name (found by tests/fuzz/fuzz_run_config).
    RN_CHECK_CTX(kv.first.IsScalar(), where, "option names must be plain words, not a list or a map");
    const std::string key = kv.first.as<std::string>();
    RN_CHECK_CTX(key != "config", where, "'config' cannot be set from a configuration file");
    CLI::Option* opt = cmd.get_option_no_throw("--" + key);
    RN_CHECK_CTX(opt != nullptr, where, "unknown option '{}' (see `renaissance {} --help`)", key, cmd.get_name());
    if (opt->count() > 0) continue;  // the command line wins
    RN_CHECK_CTX(kv.second.IsScalar(), where, "option '{}' needs a single value", key);
    std::string value = kv.second.as<std::string>();
    try {
      opt->add_result(value);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      RN_FAIL_CTX(where, "option '{}': {}", key, e.what());
    }
  }
}

}  // namespace renaissance::app
