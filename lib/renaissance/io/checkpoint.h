// Checkpoints (DESIGN §10, docs/checkpoints.md): everything a resumed run needs to continue bit for bit, as named
// FP32 tensors in HDF5 (/params masters, /bn running statistics, /optimizer moments, /ema EMA weights), the small
// device-resident state in /state (loss scale and its counters, the partial epoch's metric sums) and root
// attributes (format, version, step, epoch, position in the epoch, seed, model YAML, run config, world size, plan
// hash, creation time). Every dataset carries HDF5's Fletcher32 checksum and the file's metadata is written with
// checksummed (1.8+) object headers, so a flipped byte or a truncation is an error naming the file and tensor.
//
// A checkpoint is written to a temporary file in the same directory, fsynced, renamed and the directory fsynced;
// in a checkpoint directory `latest.h5` is a symlink to the newest file, replaced atomically and updated last.
#pragma once

#include <renaissance/io/weights.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace renaissance::io {

inline constexpr const char* kCheckpointFormat = "renaissance-checkpoint";
/// Version 2 adds the checksum header (hdf5_util.h: the whole file and every tensor's stored bytes); version 1
/// files (no header) stay readable.
inline constexpr std::int64_t kCheckpointVersion = 2;
inline constexpr const char* kLatestCheckpoint = "latest.h5";
inline constexpr const char* kCheckpointLock = ".renaissance-lock";

/// The scalar state of a run at a step boundary.
struct CheckpointState {
  std::int64_t step = 0;          ///< optimizer steps done
  std::int64_t epoch = 0;         ///< 0-based epoch the next step belongs to
  std::int64_t position = 0;      ///< batches of `epoch` already trained
  std::int64_t samples_done = 0;  ///< samples of `epoch` already trained (position · batch)
  std::int64_t batch = 0;         ///< global batch size it was written with
  std::int64_t world_size = 1;
  std::uint64_t seed = 0;  ///< the RNG state: order, augmentation are Philox streams keyed by (seed, epoch, sample)
  bool amp = false;
  std::string optimizer;             ///< "nesterov", "adam", ...
  std::string model;                 ///< model name
  std::string model_yaml;            ///< the BluePrint as YAML (loadable with blueprint_from_yaml)
  std::string arch_plan;             ///< the built ArchPlan as YAML
  std::string run_config;            ///< the training options as YAML
  std::string plan_hash;             ///< hex
  std::string created;               ///< UTC, ISO 8601 (set by write_checkpoint when empty)
  std::vector<float> loss_scale;     ///< the loss-scale slots: scale, clean steps, interval, factor
  /// The partial epoch's metric sums of each rank (rank-major, [world_size, 4]): loss, top-1, top-5, samples.
  std::vector<float> train_metrics;
  /// The validation metrics of the epoch this checkpoint ends (attributes val_loss, val_top1, val_top5, also
  /// ema_val_top1 with EMA); negative: none (a mid-epoch checkpoint, --no-validate, or a file before issue 17).
  double val_loss = -1, val_top1 = -1, val_top5 = -1, ema_val_top1 = -1;
};

struct Checkpoint {
  CheckpointState state;
  std::vector<NamedTensor> tensors;  ///< groups "params", "bn", "optimizer", "ema"; in plan order within a group
  const NamedTensor* find(const std::string& group, const std::string& name) const;
};

/// Writes atomically (temporary file in the same directory, fsync, rename, fsync of the directory). The test hook
/// RENAISSANCE_TEST_CHECKPOINT_DELAY_MS sleeps that long in the middle of the write (after the tensors, before the
/// rename), so a test can kill the process while a write is in flight.
void write_checkpoint(const std::string& path, const Checkpoint& ckpt);

/// Reads and validates everything: format, version, the attributes, every dataset's checksum, the tensor count.
/// Errors name the file (and the tensor) and say what is wrong.
Checkpoint read_checkpoint(const std::string& path);

/// What `renaissance checkpoint inspect` shows. Never throws for a bad file: `valid` is false and `error` says why.
struct CheckpointReport {
  bool valid = false;
  std::string error;
  std::map<std::string, std::string> attributes;  ///< every root attribute, as text
  std::set<std::string> numeric;                  ///< the attributes the file stores as integers or floats
  struct Entry {
    std::string group, name;
    std::vector<std::int64_t> dims;
    bool ok = false;  ///< read back with its checksum verified
  };
  std::vector<Entry> tensors;
};
CheckpointReport inspect_checkpoint(const std::string& path);

/// An exclusive lock on a checkpoint directory (flock of `dir`/.renaissance-lock, which names its holder), held by
/// a training run from before its first step to its exit: a second run in the same directory is refused, since the
/// two would overwrite and prune each other's checkpoints. Released when the process ends, however it ends (a
/// requeued job finds it free). Where the file system has no flock (some NFS mounts) there is no lock, and
/// temporaries are still only removed when their writer is dead.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  std::string m_dir;
  int m_fd = -1;
};

/// "ckpt-step00001234.h5"
std::string checkpoint_file_name(std::int64_t step);

/// Writes `dir`/ckpt-stepNNNNNNNN.h5, then replaces `dir`/latest.h5 (a symlink, swapped atomically by rename), then
/// removes all but the newest `keep` ckpt-*.h5 files and the temporaries of dead writers. Holds the directory's
/// lock for the save unless this process already holds it (a run does). Returns the new file's path.
std::string save_checkpoint_in_dir(const std::string& dir, const Checkpoint& ckpt, int keep);

/// `train --keep-best val_top1`: the best checkpoint so far, beside latest.h5 (a copy: the rotation of --keep never
/// removes it).
inline constexpr const char* kBestCheckpoint = "best.h5";
/// Writes `dir`/best.h5 when `ckpt` has validation metrics and its val_top1 beats the one best.h5 holds (or there is
/// none, or it cannot be read). `best_top1`: that value when the caller knows it (what best_checkpoint_top1 gave, or
/// the val_top1 it last wrote), so best.h5 is not read again; NaN: read it. Returns the path written, or empty.
std::string save_best_checkpoint(const std::string& dir, const Checkpoint& ckpt,
                                 double best_top1 = std::numeric_limits<double>::quiet_NaN());
/// The val_top1 recorded in `dir`/best.h5; -1 when there is none, or it cannot be read (save_best_checkpoint then
/// replaces it).
/// `why_invalid` (optional): set to the reason when a best.h5 exists but cannot be read.
double best_checkpoint_top1(const std::string& dir, std::string* why_invalid = nullptr);

/// Before a run writes into `dir`: its own names (latest.h5, best.h5, ckpt-step*.h5) are regular files or symbolic
/// links (a run replaces the links themselves, never writing through them). A directory or a special file there is
/// an Error naming it (latest.h5 as a directory failed only at the first checkpoint, after the training).
void require_usable_checkpoint_entries(const std::string& dir);

/// One of a checkpoint directory's own files: ckpt-stepNNNNNNNN.h5, latest.h5 or best.h5.
bool is_checkpoint_file_name(const std::string& filename);
/// What a run writing into `dir` would overwrite: its newest ckpt-step*.h5 (by step), else latest.h5 or best.h5
/// when there, else empty. Throws Error when `dir` exists but cannot be listed.
std::string checkpoint_file_in(const std::string& dir);

/// The newest valid checkpoint in `dir`: latest.h5 when it resolves to a file that validates, else the newest
/// ckpt-*.h5 that validates. Each skipped file is reported through `warn` (with the reason). Empty when the
/// directory is missing or holds no valid checkpoint. `found`, if given, receives the checkpoint read to validate it
/// (so a caller that resumes from it does not read it twice).
std::string find_latest_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& warn = {},
                                   Checkpoint* found = nullptr);

}  // namespace renaissance::io
