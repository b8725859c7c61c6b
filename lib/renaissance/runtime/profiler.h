// Kernel timing for `renaissance bench --profile` (DESIGN §11: "measure each lever separately"): an OpTimer that
// times every bracketed node of un-captured steps and sums the times per subgraph and per kernel label.
#pragma once

#include <renaissance/runtime/executor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::plan {
struct CompiledPlan;
}

namespace renaissance::runtime {

/// One row of a profile table. Times are per step: the sum over the profiled steps divided by their number.
struct ProfileRow {
  std::string label;  ///< subgraph ("train_base/DEEP_FWD_BWD") or kernel label ("CONV_FWD", "FUSED:bn+add+relu")
  std::string graph;  ///< per (subgraph, kernel) rows: the subgraph of `label`; empty in the other tables
  double calls_per_step = 0;
  double ms_per_step = 0;
  double percent = 0;  ///< of ProfileResult::total_ms_per_step
};

struct ProfileResult {
  std::int64_t steps = 0;             ///< profiled steps
  std::int64_t batch = 0;             ///< global batch of a step
  double total_ms_per_step = 0;       ///< every bracketed kernel time of a step, summed (the tables' 100 %)
  double wall_ms_per_step = 0;        ///< host clock of a profiled step, including host work between the kernels
  std::vector<ProfileRow> graphs;         ///< per subgraph, the slowest first
  std::vector<ProfileRow> kernels;        ///< per kernel label over all subgraphs, the slowest first
  std::vector<ProfileRow> graph_kernels;  ///< per (subgraph, kernel label), the slowest first
  /// Per node detail (ResolvedNode::detail: every GPU convolution pass with its layer and engine), `graph` holding
  /// the kernel label; the slowest first. These rows repeat time the other tables already count.
  std::vector<ProfileRow> details;
};

/// Sums bracketed times per (subgraph, kernel label). CPU: the steady clock around each node (CPU ops run
/// synchronously). CUDA: two timing events recorded on env.stream around each node, created on first use (the
/// timer is only ever set outside a capture) and reused every step; their times are read by finish_step, after the
/// step has been synchronised. Nested brackets are allowed and count in both (the executor does not nest them).
class StepProfiler final : public OpTimer {
 public:
  explicit StepProfiler(Backend backend);
  ~StepProfiler() override;
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void graph(const std::string& label) override;
  void begin(ExecEnv& env, const std::string& what, const std::string& detail = {}) override;
  void end(ExecEnv& env) override;

  /// Closes a profiled step once the device has finished it (GPU: reads the events' times); every begin must
  /// have had its end.
  void finish_step();
  /// The tables over `steps` finished steps (calls and times divided by `steps`).
  ProfileResult result(std::int64_t steps) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m;
};

/// What a training step's fused element-wise passes of one profile label ("FUSED:bn+relu") must move.
struct PassTraffic {
  int passes = 0;    ///< distinct passes of the train graph (the double-buffered input's A/B copies once)
  double bytes = 0;  ///< their operands' bytes, each input read once and each output written once
};

/// Per profile label, the compulsory traffic of the train graph's fused passes (plan::Node::fusions, the passes the
/// backends run with --fused-kernels on; none when it is off), at the full batch (TRAIN_BASE). `bench --profile`
/// divides it by the label's time: an effective bandwidth, what the passes move at the least (re-reads, e.g. a
/// statistics pass and then the apply reading x again, are not counted). `stats_from_convs` (--conv-stats took
/// effect): the BN statistics passes get no entry, since their sums come from the convolutions, not from reading x.
std::map<std::string, PassTraffic> fused_pass_traffic(const plan::CompiledPlan& p, bool stats_from_convs);

}  // namespace renaissance::runtime
