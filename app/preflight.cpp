#include "preflight.h"

#include <renaissance/core/error.h>
#include <renaissance/core/hash.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/hdf5_util.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>
#include <vector>

namespace renaissance::app {

namespace fs = std::filesystem;

namespace {

struct Rule {
  const char* option;
  bool integer;
  long double lo, hi;
  bool lo_open, hi_open;  ///< the bound itself is excluded
  const char* words;      ///< what the message says it must be
};

constexpr long double kInf = std::numeric_limits<long double>::infinity();

/// The value as the user wrote it (command line or run.yaml), checked against `r`; empty: fine.
std::string check_text(const std::string& text, const Rule& r) {
  bool ok = false;
  if (r.integer) {
    long long v = 0;
    const char* first = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
    const auto [ptr, ec] = std::from_chars(first, text.data() + text.size(), v);
    ok = ec == std::errc() && ptr == text.data() + text.size() && v >= r.lo && v <= r.hi;
  } else {
    // As the option holds it (a double) and as the kernels get it (hyper-parameters are floats): 1e999 was finite as
    // a long double and became inf, 1e-400 became an lr of 0, 0.99999999999999999 a momentum of 1.
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const auto in_range = [&](long double x) {
      return std::isfinite(x) && (r.lo_open ? x > r.lo : x >= r.lo) && (r.hi_open ? x < r.hi : x <= r.hi);
    };
    ok = !text.empty() && end && *end == '\0' && in_range(v) && in_range(static_cast<float>(v));
  }
  return ok ? std::string() : fmt::format("{} must be {}, got '{}'", r.option, r.words, text);
}

}  // namespace

bool same_file_as_fd(const std::string& path, int fd) {
  struct stat a {};
  struct stat b {};
  return ::stat(path.c_str(), &a) == 0 && ::fstat(fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

bool is_own_stdio(const std::string& path) {
  return same_file_as_fd(path, STDOUT_FILENO) || same_file_as_fd(path, STDERR_FILENO);
}

namespace {

bool is_directory(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// An output written in place (appended or truncated, no rename): a FIFO or /dev/stdout is fine, a directory is not,
/// and a new file needs an existing, writable directory.
void check_in_place_output(const std::string& path, const std::string& option) {
  if (path.empty()) return;
  // The process's own stdout or stderr: written through its descriptor (RunLog), never reopened.
  if (is_own_stdio(path)) return;
  RN_CHECK_CTX(!is_directory(path), path, "{}: is a directory, not a file", option);
  std::error_code ec;
  if (fs::is_fifo(path, ec)) {
    // A FIFO is fine with a reader (`--metrics >(jq ...)`); without one the run's first write blocked forever.
    // The probe stays open for the life of the process: closing the only writer would hand a reader such as
    // `cat FIFO` its end of file before the run has written a line.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    const int err = errno;
    RN_CHECK_CTX(fd >= 0, path, "{}: a FIFO {}", option,
                 err == ENXIO ? "that nothing reads: start its reader first"
                              : std::string("that cannot be opened: ") + std::strerror(err));
    return;
  }
  if (fs::exists(path, ec)) {
    // A file the run cannot write (read-only, a read-only mount) failed after the start-up.
    RN_CHECK_CTX(::access(path.c_str(), W_OK) == 0, path, "{}: cannot be written: {}", option, std::strerror(errno));
    return;
  }
  // A dangling symbolic link: the file is created where it points.
  fs::path where = path;
  for (int i = 0; i < 40 && fs::is_symlink(where, ec); ++i) {
    const fs::path to = fs::read_symlink(where, ec);
    if (ec) break;
    where = to.is_absolute() ? to : where.parent_path() / to;
  }
  const fs::path parent = where.parent_path();
  require_writable_dir(parent.empty() ? "." : parent.string(), option);
  RN_CHECK_CTX(is_directory(parent.empty() ? "." : parent.string()), path, "{}: the directory '{}' does not exist",
               option, parent.string());
}

const std::vector<Rule>& train_rules() {
  static const std::vector<Rule> rules = {
      {"--epochs", true, 1, 1000000, false, false, "an integer from 1 to 1000000"},
      {"--batch", true, 1, 1LL << 31, false, false, "an integer from 1 to 2147483648"},
      {"--val-batch", true, 0, 1LL << 31, false, false, "an integer from 0 (the training batch) to 2147483648"},
      {"--lr", false, 0, kInf, true, false, "a finite number > 0"},
      {"--momentum", false, 0, 1, false, true, "a number in [0, 1)"},
      {"--weight-decay", false, 0, kInf, false, false, "a finite number >= 0"},
      {"--warmup-epochs", false, 0, 1000000, false, false, "a number of epochs from 0 to 1000000"},
      {"--step-epochs", true, 1, 1000000, false, false, "an integer from 1 to 1000000"},
      {"--label-smoothing", false, 0, 1, false, true, "a number in [0, 1)"},
      {"--ema-decay", false, 0, 1, true, true, "a number in (0, 1)"},
      {"--max-steps", true, 1, 1LL << 53, false, false, "an integer from 1 to 2^53"},
      {"--crop-padding", true, 0, 4096, false, false, "an integer from 0 (off) to 4096"},
      {"--start-resolution", true, 0, 1LL << 20, false, false, "an integer from 0 (off) to 1048576"},
      {"--lowres-epochs", true, 0, 1000000, false, false, "an integer from 0 to 1000000"},
      {"--keep", true, 1, 1000000, false, false, "an integer from 1 to 1000000"},
      {"--comm-timeout", false, 0, 1e9, true, false, "a number of seconds > 0"},
      {"--onecycle-div", false, 1, 1e9, false, false, "a number from 1 to 1e9"},  // CLI11's Range let NaN through
  };
  return rules;
}

}  // namespace

bool train_checks_as_written(const std::string& option) {
  for (const Rule& r : train_rules())
    if (option == r.option) return true;
  return false;
}

void check_train_numbers(const CLI::App& cmd, const std::string& config,
                         const std::map<std::string, int>& from_config) {
  const std::vector<Rule>& rules = train_rules();
  for (const Rule& r : rules) {
    const CLI::Option* opt = cmd.get_option_no_throw(r.option);
    if (!opt || opt->count() == 0 || opt->results().empty()) continue;
    const std::string err = check_text(opt->results().back(), r);
    if (err.empty()) continue;
    // A value of the run config: its file and line, as its parse errors say them (`lr: 1e400` gave no place).
    const std::string key = std::string(r.option).substr(2);
    if (const auto it = from_config.find(key); it != from_config.end())
      RN_FAIL_CTX(fmt::format("{}:{}", config, it->second), "{}", err);
    RN_FAIL("{}", err);
  }
}

void require_same_on_ranks(runtime::Communicator* comm, const std::function<std::uint64_t()>& fingerprint,
                           const std::string& what, const std::string& path, const std::string& hint) {
  if (!comm || comm->world_size() <= 1) return;
  const std::uint64_t mine = fingerprint();
  std::vector<std::uint8_t> theirs(8);
  for (int i = 0; i < 8; ++i) theirs[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(mine >> (8 * i));
  comm->broadcast(theirs, 0);
  std::uint64_t root_fp = 0;
  for (int i = 0; i < 8 && i < static_cast<int>(theirs.size()); ++i) root_fp |= std::uint64_t(theirs[i]) << (8 * i);
  const std::int64_t bad = comm->agree_max(root_fp == mine ? -1 : comm->rank());
  // Each rank names its own file (the paths may differ: node-local copies, another --resume): rank 0 and the rank
  // that differs say which file they read.
  if (bad >= 0)
    throw Error(
        fmt::format("{} differs between ranks: rank {}'s copy does not match rank 0's (content fingerprint "
                    "{:016x} on rank 0; this rank, {}, read {}{})",
                    what, bad, root_fp, comm->rank(), path,
                    comm->rank() == 0 || mine == root_fp ? std::string() : fmt::format(", fingerprint {:016x}", mine)),
        "data-parallel run", hint);
}

std::uint64_t state_fingerprint(const runtime::InitialState* state) {
  if (!state) return 0;
  std::uint64_t h = kFnv1aOffset;
  for (const io::NamedTensor& nt : state->tensors) {
    h = fnv1a(nt.group.data(), nt.group.size(), h);
    h = fnv1a(nt.name.data(), nt.name.size(), h);
    h = fnv1a(nt.values.data(), nt.values.size() * sizeof(float), h);
  }
  if (state->checkpoint && !state->weights_only) {
    const io::CheckpointState& c = state->state;
    for (const std::int64_t v : {c.step, c.epoch, c.position, c.samples_done, static_cast<std::int64_t>(c.seed)})
      h = fnv1a(&v, sizeof v, h);
  }
  return h;
}

TrainPreflight preflight_train(const TrainFiles& f, const runtime::TrainOptions& t, bool root) {
  TrainPreflight out;
  RN_CHECK(t.schedule != runtime::ScheduleKind::STEP || t.step_epochs >= 1,
           "--schedule step needs --step-epochs >= 1 (decay every N epochs)");
  RN_CHECK(t.lowres_epochs == 0 || t.start_resolution > 0, "--lowres-epochs needs --start-resolution");
  const std::string resume_file = f.resume == "auto" ? std::string() : f.resume;
  if (root) {
    // Inputs first (a clear "no such file"), then every output against every input and against each other.
    if (!resume_file.empty()) require_input_file(resume_file, "--resume");
    if (!f.save.empty()) (void)resolve_output_file(f.save, "--save");
    check_in_place_output(f.metrics, "--metrics");
    check_in_place_output(f.loss_log, "--loss-log");
    // The event directory before anything is written (a failing --tensorboard emptied an existing --metrics file).
    if (!f.tensorboard.empty()) require_writable_dir(f.tensorboard, "--tensorboard");
    // The logs may share the process's stdout (`--metrics /dev/stdout --loss-log /dev/stdout`): lines, not files.
    auto log = [](const std::string& p) { return is_own_stdio(p) ? std::string() : p; };
    require_distinct_files(
        {{"--data", f.data}, {"--resume", resume_file}, {"--model-file", f.model_file}, {"--config", f.config}},
        {{"--save", f.save}, {"--metrics", log(f.metrics)}, {"--loss-log", log(f.loss_log)}});
    if (!f.checkpoint_dir.empty()) {
      require_writable_dir(f.checkpoint_dir, "--checkpoint-dir");
      // An output onto one of the directory's own files (the checkpoint --resume auto will load, say) would destroy
      // it: --save, --metrics and --loss-log alike.
      std::error_code ec;
      const fs::path dp = fs::weakly_canonical(fs::absolute(f.checkpoint_dir, ec), ec);
      for (const auto& [option, path] : {std::pair<const char*, const std::string&>{"--save", f.save},
                                         {"--metrics", f.metrics},
                                         {"--loss-log", f.loss_log}}) {
        if (path.empty()) continue;
        const fs::path sp = fs::weakly_canonical(fs::absolute(path, ec), ec);
        const std::string name = sp.filename().string();
        const bool own = io::is_checkpoint_file_name(name) || name == io::kCheckpointLock;
        RN_CHECK_CTX(!(own && sp.parent_path() == dp), path,
                     "{} would overwrite {} of --checkpoint-dir {} (write it elsewhere)", option,
                     name == io::kCheckpointLock ? "the lock file" : "a checkpoint", f.checkpoint_dir);
      }
      out.lock = std::make_unique<io::CheckpointDirLock>(f.checkpoint_dir);
      io::require_usable_checkpoint_entries(f.checkpoint_dir);
      // A fresh run (no --resume), or one resumed from a file of another directory, would overwrite the directory's
      // checkpoints step by step, move latest.h5 back to its own and prune the rest: that run's work lost without a
      // word. --resume auto, or a file of the directory itself, continues the directory's own run.
      const bool own_resume =
          f.resume == "auto" ||
          (!f.resume.empty() && fs::weakly_canonical(fs::absolute(f.resume, ec), ec).parent_path() == dp);
      if (!own_resume) {
        const std::string found = io::checkpoint_file_in(f.checkpoint_dir);
        if (f.resume.empty())
          RN_CHECK_CTX(found.empty(), f.checkpoint_dir,
                       "--checkpoint-dir holds the checkpoints of an earlier run ({}): a fresh run would overwrite "
                       "them (hint: --resume auto continues that run; to start afresh, use another directory or "
                       "remove its checkpoints)",
                       found);
        else
          RN_CHECK_CTX(found.empty(), f.checkpoint_dir,
                       "--checkpoint-dir holds the checkpoints of another run ({}), and --resume {} is not one of "
                       "them: the resumed run would overwrite them (hint: resume into a new or empty "
                       "--checkpoint-dir, or --resume auto to continue the directory's own run)",
                       found, f.resume);
      }
    }
    // Files of data under other names than the inputs': a dataset replaced by the weights (--save data2.h5), a
    // checkpoint or dataset by a JSON log (--metrics ck.h5), without a word. --save may replace weights (a rerun).
    for (const auto& [option, path, text] : {std::tuple<const char*, std::string, bool>{"--save", f.save, false},
                                             {"--metrics", log(f.metrics), true},
                                             {"--loss-log", log(f.loss_log), true}}) {
      if (path.empty()) continue;
      const std::string kind = io::data_file_kind(path);
      RN_CHECK_CTX(kind.empty() || (!text && kind != "an HDF5 file"), path,
                   "{} would replace {}{}: write it to a file of its own (or remove that file first)", option, kind,
                   kind == "an HDF5 file" ? " (a dataset?)" : "");
    }
  }
  // The dataset, on every rank (each reads its own copy of the path).
  const io::DatasetFile data(f.data);
  for (io::Split s : io::kAllSplits) data.validate_labels(s);
  RN_CHECK_CTX(data.size(io::Split::train) > 0, f.data, "the train split is empty");
  RN_CHECK_CTX(!t.validate || data.size(io::Split::val) > 0, f.data,
               "the val split is empty: nothing to validate on (pass --no-validate, or add validation samples)");
  // Same shapes but other contents (another copy of the file on a node) would train silently on other data.
  require_same_on_ranks(t.comm, [&] { return data.content_fingerprint(); }, "the dataset's content", f.data,
                        "give every rank the same dataset file (copy it again, or use a shared path)");
  return out;
}

std::string check_room_for_outputs(const std::string& save, std::int64_t weights_bytes,
                                   const std::string& checkpoint_dir, std::int64_t checkpoint_bytes,
                                   int checkpoint_files) {
  struct Need {
    std::string path, option;
    std::int64_t bytes;
    dev_t dev;
    std::int64_t free;
  };
  std::vector<Need> needs;
  // RENAISSANCE_SPACE_CHECK=off: for file systems whose free space says little (quotas elsewhere, compression).
  if (const char* v = std::getenv("RENAISSANCE_SPACE_CHECK"); v && std::string(v) == "off") return {};
  // A file's attributes (model YAML, arch plan, run config) and HDF5's own structures: 0.13-0.18 MB for fmnist_cnn.
  constexpr std::int64_t kSlack = 512 << 10;
  // `path` a file (its directory's file system) or a directory.
  auto add = [&](const std::string& path, bool is_file, const char* option, std::int64_t bytes) {
    // Where the file will be: through a symbolic link, its target's file system.
    std::error_code ec;
    fs::path where = fs::weakly_canonical(fs::absolute(path, ec), ec);
    if (ec) where = path;
    const std::string dir = is_file ? where.parent_path().string() : where.string();
    struct statvfs fs_info {};
    struct stat st {};
    if (::statvfs(dir.c_str(), &fs_info) != 0 || ::stat(dir.c_str(), &st) != 0) return;  // unknown: no check
    if (fs_info.f_blocks == 0) return;  // a file system that reports no sizes (some FUSE ones): unknown
    const auto free = static_cast<std::int64_t>(fs_info.f_bavail) * static_cast<std::int64_t>(fs_info.f_frsize);
    needs.push_back({path, option, bytes, st.st_dev, free});
  };
  if (!save.empty()) add(save, true, "--save", weights_bytes + kSlack);
  if (!checkpoint_dir.empty()) {
    // Over the run the directory holds `checkpoint_files` checkpoints at once (the kept ones, the one being written,
    // best.h5 and its replacement); those already there count as room.
    std::int64_t there = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(checkpoint_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file(ec) && !e.is_symlink(ec) && (name.rfind("ckpt-step", 0) == 0 || name == "best.h5"))
        there += static_cast<std::int64_t>(e.file_size(ec));
    }
    const std::int64_t one = checkpoint_bytes + kSlack;
    add(checkpoint_dir, false, "--checkpoint-dir", std::max(one, one * checkpoint_files - there));
  }
  for (const Need& n : needs) {
    std::int64_t together = 0;
    std::string what;
    int count = 0;
    for (const Need& m : needs)
      if (m.dev == n.dev) {
        together += m.bytes;
        what += (what.empty() ? "" : " and ") + m.option;
        ++count;
      }
    if (together > n.free)
      return fmt::format(
          "{}: {} {} about {:.1f} MiB on this file system and {:.1f} MiB are free: make room "
          "before training (a full disk would fail the run at its first write, after the work; "
          "RENAISSANCE_SPACE_CHECK=off skips this check)",
          n.path, what, count == 1 ? "needs" : "need", static_cast<double>(together) / (1 << 20),
          static_cast<double>(n.free) / (1 << 20));
  }
  return {};
}

}  // namespace renaissance::app
