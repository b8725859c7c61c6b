// libFuzzer target: run.yaml (app/run_config.cpp apply_run_config) against a CLI11 command with the kinds of
// options `renaissance train` has (integers, floats, strings, flags, a checked choice, the --model/--model-file pair).
#include "fuzz_util.h"

#include "run_config.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

using namespace renaissance;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string path = fuzz::input_file(data, size, ".yaml");
  CLI::App app{"fuzz"};
  CLI::App* cmd = app.add_subcommand("train", "fuzz");
  std::int64_t epochs = 3, batch = 128;
  double lr = 0.1;
  std::string optimizer = "nesterov", config, model = "fmnist_cnn", model_file;
  bool amp = false;
  cmd->add_option("--epochs", epochs);
  cmd->add_option("--batch", batch)->check(CLI::PositiveNumber);
  cmd->add_option("--lr", lr);
  cmd->add_option("--optimizer", optimizer)->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam"}));
  cmd->add_flag("--amp", amp);
  auto* m = cmd->add_option("--model", model);  // the exclusive pair (the command line wins for both)
  auto* mf = cmd->add_option("--model-file", model_file);
  m->excludes(mf);
  mf->excludes(m);
  cmd->add_option("--config", config);
  fuzz::expect_clean([&] { app::apply_run_config(*cmd, path); }, "fuzz_run_config");
  return 0;
}
