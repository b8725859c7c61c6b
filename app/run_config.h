// run.yaml: every option of a subcommand settable as a YAML key; the command line wins.
#pragma once

#include <set>
#include <string>

namespace CLI {
class App;
}

namespace renaissance::app {
/// Sets each `key: value` of the YAML map in `path` on the option `--key` of `cmd`, unless the command line
/// gave that option. Unknown keys, non-scalar values and malformed YAML are errors naming the file and key. Returns
/// the keys it set (a recipe's key that another --schedule or --optimizer on the command line leaves without effect
/// is a warning, where the same option typed on the command line is an error).
std::set<std::string> apply_run_config(CLI::App& cmd, const std::string& path);
}  // namespace renaissance::app
