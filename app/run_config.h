// run.yaml: every option of a subcommand settable as a YAML key; the command line wins.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace renaissance::app {
/// Sets each `key: value` of the YAML map in `path` on the option `--key` of `cmd`, unless the command line
/// gave that option. Unknown keys, non-scalar values and malformed YAML are errors naming the file and key.
void apply_run_config(CLI::App& cmd, const std::string& path);
}  // namespace renaissance::app
