// run.yaml: every option of a subcommand settable as a YAML key; the command line wins.
#pragma once

#include <cctype>
#include <map>
#include <set>
#include <string>

namespace CLI {
class App;
}

namespace renaissance::app {

/// Whether `text` is a flag's value, in any case: YAML's booleans as yaml-cpp reads them (true/false, yes/no, on/off,
/// y/n) and, with `digits`, 1/0 (the command line's: check_flags_and_paths).
inline bool is_flag_word(const std::string& text, bool digits) {
  std::string t;
  for (char ch : text) t.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  for (const char* w : {"true", "false", "yes", "no", "on", "off", "y", "n"})
    if (t == w) return true;
  return digits && (t == "1" || t == "0");
}

/// Sets each `key: value` of the YAML map in `path` on the option `--key` of `cmd`, unless the command line
/// gave that option. A relative `model-file` is taken beside `path` where such a file is, else as written (relative
/// to the current directory), like every other path. Unknown keys, non-scalar values and malformed YAML are errors
/// naming the file and key. Returns the keys it set, each with its line (a recipe's key that another --schedule or
/// --optimizer on the command line leaves without effect is a warning, where the same option typed on the command line,
/// or set beside that
/// --schedule or --optimizer in the same file, is an error).
std::map<std::string, int> apply_run_config(CLI::App& cmd, const std::string& path);
}  // namespace renaissance::app
