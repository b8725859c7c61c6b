#include "commands.h"

#include <CLI/CLI.hpp>

namespace renaissance::app {
void register_plan_command(CLI::App& app) { (void)app; }
}  // namespace renaissance::app
