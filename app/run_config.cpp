#include "run_config.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace renaissance::app {

namespace {

/// Options that exclude each other on the command line (CLI11's excludes): one of a group on the command line
/// overrides every key of the group in the file; two of a group in the file are an error.
const std::vector<std::vector<std::string>> kExclusiveGroups = {
    {"model", "model-file"}, {"weights", "checkpoint"}, {"validate", "no-validate"}};

/// A relative model file belongs to the configuration: looked up beside the file first (a recipe names
/// `../models/x.yaml` and works from any directory, in the source tree and installed), else where the command runs.
std::string model_file_beside(const std::string& config, const std::string& value) {
  namespace fs = std::filesystem;
  if (value.empty() || fs::path(value).is_absolute()) return value;
  const fs::path beside = fs::path(config).parent_path() / value;
  std::error_code ec;
  return fs::is_regular_file(beside, ec) ? beside.string() : value;
}

}  // namespace

std::map<std::string, int> apply_run_config(CLI::App& cmd, const std::string& path) {
  const std::string text = blueprint::read_yaml_file(path, "--config");
  blueprint::check_yaml_limits(text, path);
  YAML::Node root;
  try {
    // yaml-cpp's Load reads the first document: a second one (after '---', or garbage after '...') was ignored.
    if (const int second = blueprint::second_yaml_document_line(text))
      RN_FAIL_CTX(fmt::format("{}:{}", path, second),
                  "a run configuration holds one YAML document, found a second one");
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    RN_FAIL_CTX(fmt::format("{}:{}", path, e.mark.line + 1), "malformed YAML: {}", blueprint::printable(e.msg));
  }
  std::map<std::string, int> applied;
  if (root.IsNull()) return applied;
  RN_CHECK_CTX(root.IsMap(), path, "a run configuration must be a YAML map of option: value");
  // Every key first: names, duplicates and exclusive pairs are errors before any value is applied.
  std::map<std::string, int> line_of;
  std::vector<std::pair<std::string, YAML::Node>> entries;
  for (const auto& kv : root) {
    const int line = kv.first.Mark().line + 1;
    const std::string where = fmt::format("{}:{}", path, line);
    // A key like [a, b] or {a: 1} is valid YAML but no option name (found by tests/fuzz/fuzz_run_config).
    RN_CHECK_CTX(kv.first.IsScalar(), where, "option names must be plain words, not a list or a map");
    const std::string key = kv.first.Scalar();
    // A NUL ("\0" in a quoted key) cut the name short in messages, and escape sequences reached the terminal.
    RN_CHECK_CTX(std::none_of(key.begin(), key.end(),
                              [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == '\x7f'; }),
                 where, "option names must be plain words, got '{}'", blueprint::printable(key));
    const auto seen = line_of.find(key);
    RN_CHECK_CTX(seen == line_of.end(), where, "option '{}' is set twice (lines {} and {})", key,
                 seen == line_of.end() ? 0 : seen->second, line);
    line_of[key] = line;
    RN_CHECK_CTX(key != "config" && key != "help", where, "'{}' cannot be set from a configuration file", key);
    RN_CHECK_CTX(cmd.get_option_no_throw("--" + key) != nullptr, where, "unknown option '{}' (see `renaissance {} --help`)",
                 key, cmd.get_name());
    entries.emplace_back(key, kv.second);
  }
  std::map<std::string, bool> overridden;  // keys the command line decides, directly or through its group
  for (const auto& group : kExclusiveGroups) {
    std::vector<std::string> in_file;
    bool on_cli = false;
    for (const std::string& k : group) {
      CLI::Option* o = cmd.get_option_no_throw("--" + k);
      if (!o) continue;
      on_cli = on_cli || o->count() > 0;
      if (line_of.count(k)) in_file.push_back(k);
    }
    if (in_file.size() > 1)
      RN_FAIL_CTX(fmt::format("{}:{}", path, line_of[in_file[1]]), "'{}' (line {}) and '{}' cannot both be set",
                  in_file[0], line_of[in_file[0]], in_file[1]);
    if (on_cli)
      for (const std::string& k : group) overridden[k] = true;
  }
  for (const auto& [key, value] : entries) {
    const std::string where = fmt::format("{}:{}", path, line_of[key]);
    CLI::Option* opt = cmd.get_option_no_throw("--" + key);
    if (opt->count() > 0 || overridden[key]) continue;  // the command line wins
    RN_CHECK_CTX(value.IsScalar(), where, "option '{}' needs a single value", key);
    // A NUL ("\0" in a quoted value) cut every path at it without a word (`save: "w.h5\0.bak"` replaced w.h5).
    RN_CHECK_CTX(value.Scalar().find('\0') == std::string::npos, where,
                 "option '{}': the value '{}' holds a NUL character, which no option takes", key,
                 blueprint::printable(value.Scalar()));
    // A flag: CLI11 would read -1 as off and 5 as on without a word.
    RN_CHECK_CTX(opt->get_expected_max() != 0 || is_flag_word(value.Scalar(), /*digits=*/false), where,
                 "option '{}' is a flag: true or false (yes/no, on/off, y/n), got '{}'", key,
                 blueprint::printable(value.Scalar()));
    try {
      opt->add_result(key == "model-file" ? model_file_beside(path, value.Scalar()) : value.Scalar());
      opt->run_callback();
    } catch (const CLI::Error& e) {
      RN_FAIL_CTX(where, "option '{}': {}", key, blueprint::printable(e.what()));
    }
    applied[key] = line_of[key];
  }
  return applied;
}

}  // namespace renaissance::app
