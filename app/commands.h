// Each subcommand of the `renaissance` CLI registers itself on the CLI11 app.
#pragma once

namespace CLI {
class App;
}

namespace renaissance::app {
void register_plan_command(CLI::App& app);
void register_data_command(CLI::App& app);
void register_train_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_bench_command(CLI::App& app);
}  // namespace renaissance::app
