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
void register_checkpoint_command(CLI::App& app);
/// An exit code other than 0/1 a command asks main() for (75: `train` was preempted and wrote a checkpoint).
void set_exit_code(int code);
int exit_code();
void register_predict_command(CLI::App& app);
}  // namespace renaissance::app
