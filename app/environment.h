// The RENAISSANCE_* environment variables a run reads (README "Environment variables"), checked before any work.
#pragma once

#include <string>
#include <vector>

namespace renaissance::app {

/// One variable: its name, what it takes (for the message) and whether a value is one it takes.
struct EnvVariable {
  const char* name;
  const char* takes;
  bool (*valid)(const std::string& value);
};

/// Every variable the library, the kernels and the CLI read at run time (the test hooks RENAISSANCE_TEST_* apart).
const std::vector<EnvVariable>& environment_variables();

/// Throws Error naming the first set variable whose value is not one it takes: the readers fell back to their default
/// without a word (RENAISSANCE_CPU_WINOGRAD=false left Winograd on, RENAISSANCE_COMM_TIMEOUT=10s gave 300 s). Unset
/// and empty variables are not checked.
void check_environment();

/// The CPU kernels' settings asked for in the environment (RENAISSANCE_GEMM, RENAISSANCE_CPU_ISA,
/// RENAISSANCE_GEMM_ISA; "default" when unset) as `name=value` lines for the ranks' configuration check (Trainer's
/// command_settings): ranks asked for another GEMM backend or instruction-set cap rounded their gradients otherwise
/// (weights 1e-6 apart after 6 steps). What each CPU has is not compared: nodes may differ.
std::string cpu_kernel_env_settings();

}  // namespace renaissance::app
