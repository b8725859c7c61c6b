// renaissance: one SPMD executable; every subcommand is registered from app/cmd_*.cpp.
#include "commands.h"

#include <renaissance/core/error.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"Renaissance: planned, graph-captured training of convolutional image classifiers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "renaissance 0.1.0");
  renaissance::app::register_plan_command(app);
  renaissance::app::register_data_command(app);
  renaissance::app::register_train_command(app);
  renaissance::app::register_eval_command(app);
  renaissance::app::register_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const renaissance::Error& e) {
    std::fprintf(stderr, "renaissance: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "renaissance: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
