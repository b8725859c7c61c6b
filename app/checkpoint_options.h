// The `train` options for checkpoints, resume and preemption (docs/checkpoints.md), kept apart from the rest of
// cmd_train.cpp: --checkpoint-dir, --checkpoint-every STEPS|epoch, --keep N, --resume [auto|PATH], --loss-log.
#pragma once

#include <renaissance/io/checkpoint.h>
#include <renaissance/runtime/trainer.h>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

namespace renaissance::app {

/// Exit code of `renaissance train` after a preemption signal (SIGUSR1, SIGTERM): the checkpoint is written,
/// requeue the job (EX_TEMPFAIL of sysexits.h). jobs/*.sbatch turn it into `scontrol requeue`.
inline constexpr int kExitPreempted = 75;

class RunLog;

struct CheckpointCli {
  std::string dir;
  std::string every;  ///< STEPS or "epoch"; default with a directory: epoch
  int keep = 2;
  std::string resume;  ///< "auto" or a checkpoint file; empty: start fresh (a bare --resume: auto)
  std::string loss_log;
  std::string keep_best;  ///< "val_top1": keep the best checkpoint as best.h5 too; empty: no

  void add_to(CLI::App& cmd);
  /// Validates the options, sets the checkpoint fields of `t` and, with a checkpoint directory, installs the
  /// SIGUSR1/SIGTERM handlers that request a checkpoint-and-stop at the next step boundary.
  void apply(runtime::TrainOptions& t);
  /// --resume: reads the checkpoint to resume (auto: the newest valid one in --checkpoint-dir; none there starts
  /// fresh: nullptr), for the Trainer to start from (matched against the plan before the device start-up).
  /// `skipped`, when given: what --resume auto passed over on this rank ("" or " (after skipping N invalid: ...)"),
  /// for the ranks' agreement on the checkpoint (only rank 0 warns, so another rank's reason was never shown).
  std::unique_ptr<runtime::InitialState> read_resume(bool root, std::string* skipped = nullptr) const;
  /// Adds the per-step loss log and the checkpoint messages to `obs` (rank 0 writes).
  /// `trainer` gives each step's learning rate to the loss log.
  void observe(runtime::TrainObserver& obs, bool root, bool resumed, const runtime::Trainer& trainer);
  /// After run(): prints where the checkpoint is; the command then exits with kExitPreempted.
  void report_preempted(const runtime::Trainer& trainer, bool root) const;

 private:
  std::shared_ptr<RunLog> m_loss_log;
  CLI::Option* m_resume_option = nullptr;
};

/// The signal number that requested the stop (0: none).
int preemption_signal();

/// First thing in main, before the MPI start-up: a `train` command line that may checkpoint (--checkpoint-dir, or a
/// --config that may name one) gets the SIGUSR1/SIGTERM handlers at once, so a preemption signal during the
/// start-up (MPI_Init of many ranks, reading the checkpoint, timing engines) is kept for the first step boundary
/// (checkpoint, exit 75) instead of killing the process (exit 138/143, which no job script requeues).
/// CheckpointCli::apply keeps them with a checkpoint directory; without one, disarm_preemption_early.
/// `envp`: the environment when libc's getenv cannot see it yet (the executable's .preinit_array); nullptr: getenv.
void arm_preemption_early(int argc, char** argv, char** envp = nullptr);
/// Without a checkpoint directory after all: the actions the process had before arm_preemption_early (SIG_DFL, or a
/// parent's SIG_IGN), and a signal that came meanwhile taken now if its action was the default. Called by `train`
/// as soon as its options are read; nothing when the handlers were not armed early.
void disarm_preemption_early();

/// A per-step or per-epoch JSONL log (--loss-log, --metrics), written by rank 0.
class RunLog {
 public:
  /// Opens `path`: truncated for a fresh run; for a run resumed at step `resume_step`, the lines whose "step" is past
  /// it, and incomplete ones (a run killed or stopped by a full disk mid-line), are dropped first, then appended to:
  /// a run killed after its last checkpoint wrote them, and the resumed run writes them again (a CR or blanks after a
  /// line's object are allowed; a complete last line without its newline is kept and ended). The dropped lines are
  /// the file's end, so it is cut there in place (its inode, mode and links stay); only a file whose dropped lines
  /// are not all at its end is rewritten through a temporary and a rename. A FIFO or device is appended to, and the
  /// process's own stdout or stderr (`--loss-log /dev/stdout`, the job's output file) is written through them, never
  /// reopened, cut or replaced.
  /// A regular file is locked (flock) for the log's lifetime: a second process writing it is refused.
  RunLog(const std::string& path, const char* option, bool resumed, std::int64_t resume_step);
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  /// Appends `line`; a failed write fails the run naming the file and `what` ("epoch 3"), except on the process's own
  /// stdout, whose lost output the end of the command reports (app/main.cpp).
  void write(const std::string& line, const std::string& what);

 private:
  std::string m_path;
  const char* m_option;
  std::unique_ptr<std::ofstream> m_file;
  std::ostream* m_out = nullptr;
  bool m_std = false;
  /// The flock's descriptor, closed (the lock released) with the log, also when its constructor throws.
  struct LockFd {
    int fd = -1;
    ~LockFd();
  } m_lock;
};

/// The model a checkpoint records (its model_yaml), for `eval --checkpoint`, after the checks `checkpoint inspect`
/// makes of its YAML (the arch plan and run config parse too): a file inspect calls INVALID is refused, with --model
/// as without. nullopt where it records no model and `required` is false (--model given).
std::optional<blueprint::BluePrint> checkpoint_model(const io::Checkpoint& ck, const std::string& path, bool required);

}  // namespace renaissance::app
