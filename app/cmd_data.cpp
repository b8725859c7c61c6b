#include "commands.h"

#include <CLI/CLI.hpp>

namespace renaissance::app {
// `renaissance data ...` (issue 3) is registered here.
void register_data_command(CLI::App& app) { (void)app; }
}  // namespace renaissance::app
