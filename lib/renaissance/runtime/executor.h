// Executing a ComputationGraph, one header per idea: exec_env.h (ResolvedNode, ExecEnv, OpTimer, ComputeStreams),
// kernel_table.h (KernelTable, the built-in tables), captured_graph.h (CapturedGraph, GraphAtlas),
// backend_session.h (BackendSession, open_backend). This header includes all four.
#pragma once

#include <renaissance/runtime/backend_session.h>
#include <renaissance/runtime/captured_graph.h>
#include <renaissance/runtime/exec_env.h>
#include <renaissance/runtime/kernel_table.h>
