// What `train` (and `predict`) check before any work is spent (issue 13): numeric options in range (with the
// text the user wrote in the message), every output path writable and never an input, the val split and the
// labels, the dataset's content the same on every rank, and the checkpoint directory's lock. Each error names the
// option, file or split.
#pragma once

#include <renaissance/io/checkpoint.h>
#include <renaissance/runtime/trainer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace CLI {
class App;
}

namespace renaissance::app {

/// Whether `path` names the file open as `fd` (following links: /dev/stdout, /proc/self/fd/1, the job's output file).
bool same_file_as_fd(const std::string& path, int fd);
/// Whether `path` names the process's own stdout or stderr.
bool is_own_stdio(const std::string& path);

/// The numeric options of `train` (from the command line or run.yaml) against their ranges: --lr a finite
/// number > 0, 0 <= --label-smoothing < 1, 0 < --ema-decay < 1, --crop-padding >= 0, --epochs from 1 to 10^6, ...
/// A value that overflowed its type is reported as written ("--epochs must be an integer from 1 to 1000000, got
/// '99999999999999999999'").
/// A value the run config `config` set (`from_config`: its keys and lines) is named by file:line.
void check_train_numbers(const CLI::App& cmd, const std::string& config = {},
                         const std::map<std::string, int>& from_config = {});
/// Whether check_train_numbers checks `option` ("--epochs") as written (so the parse leaves an overflow to it).
bool train_checks_as_written(const std::string& option);

/// The files of one `train` run.
struct TrainFiles {
  std::string data, model_file, config, resume;  ///< inputs (resume: a file, or "auto"/"")
  std::string save, metrics, loss_log;           ///< outputs
  std::string checkpoint_dir;
  std::string tensorboard;  ///< an output directory
};

/// Under mpirun/srun: `fingerprint()` (a content fingerprint of `what` at `path` on this rank) against rank 0's; a
/// rank that differs is the same error on every rank ("<what> differs between ranks: rank R's copy ...", each rank
/// naming the PATH it read),
/// with `hint`. Collective; without a communicator of more than one rank nothing is done, `fingerprint` not called
/// (a dataset's reads its labels and two blocks).
void require_same_on_ranks(runtime::Communicator* comm, const std::function<std::uint64_t()>& fingerprint,
                           const std::string& what, const std::string& path, const std::string& hint);

/// A content fingerprint of a state to start from, for require_same_on_ranks: its tensors (group, name, values) and,
/// of a checkpoint, where it resumes (step, epoch, position, seed). No state (a fresh start): 0.
std::uint64_t state_fingerprint(const runtime::InitialState* state);

/// Held from before the first step to the end of the run.
struct TrainPreflight {
  std::unique_ptr<io::CheckpointDirLock> lock;  ///< rank 0 with --checkpoint-dir
};

/// Paths (on rank 0: outputs writable and distinct from every input; the checkpoint directory locked), the dataset
/// (every rank: labels of both splits in [0, num_classes), a non-empty val split when validating, and the content
/// fingerprint compared with rank 0's), before the Trainer is built.
TrainPreflight preflight_train(const TrainFiles& files, const runtime::TrainOptions& t, bool root);

/// Once the plan is known, before the first step: the file systems of --save and --checkpoint-dir (through symbolic
/// links, where the files will be) have room for one weights file of `weights_bytes` of tensors and for
/// `checkpoint_files` checkpoints of `checkpoint_bytes` (less those already in the directory), both together where
/// they share one. A full disk failed the first checkpoint after an epoch's work, or --save after the whole run. The
/// first problem, empty when there is room (or the free space cannot be known, or RENAISSANCE_SPACE_CHECK=off).
std::string check_room_for_outputs(const std::string& save, std::int64_t weights_bytes,
                                   const std::string& checkpoint_dir, std::int64_t checkpoint_bytes,
                                   int checkpoint_files);

}  // namespace renaissance::app
