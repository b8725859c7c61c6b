#include "checkpoint_options.h"

#include "json_writer.h"
#include "preflight.h"

#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/checkpoint.h>

#include <fmt/format.h>
#include <renaissance/core/log.h>

#include <signal.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace renaissance::app {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_request{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores into a lock-free atomic");

// The first signal is the one that asked for the stop (a SIGTERM during the checkpoint that a SIGUSR1 requested
// was named as the cause).
extern "C" void on_preemption_signal(int sig) {
  int none = 0;
  g_stop_request.compare_exchange_strong(none, sig);
}

bool g_armed_early = false;           ///< arm_preemption_early installed the handlers
struct sigaction g_previous[2] = {};  ///< SIGUSR1's and SIGTERM's actions before it did (SIG_IGN stays SIG_IGN)

void install_preemption_handlers(struct sigaction* previous = nullptr) {
  struct sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  int i = 0;
  for (int sig : {SIGUSR1, SIGTERM})
    RN_CHECK(sigaction(sig, &sa, previous ? &previous[i++] : nullptr) == 0, "cannot install the handler of signal {}",
             sig);
}

}  // namespace

int preemption_signal() { return g_stop_request.load(); }

void arm_preemption_early(int argc, char** argv, char** envp) {
  // Called twice (from the executable's .preinit_array and again from main): a second install would record our own
  // handler as the action to restore.
  if (g_armed_early || argc < 2 || !argv || !argv[1] || std::strcmp(argv[1], "train") != 0) return;
  bool may_checkpoint = false;
  for (int i = 2; i < argc; ++i)
    for (const char* opt : {"--checkpoint-dir", "--config"})
      if (std::strncmp(argv[i], opt, std::strlen(opt)) == 0) may_checkpoint = true;
  if (!may_checkpoint) return;
  install_preemption_handlers(g_previous);
  g_armed_early = true;
  // Test hook: a start-up slow enough for a test to signal it (the line says when the handlers are in place).
  // From .preinit_array libc has not run its initialiser yet, so getenv sees no environment: envp is read instead.
  const char* d = nullptr;
  constexpr const char* kDelay = "RENAISSANCE_TEST_STARTUP_DELAY_MS=";
  if (envp == nullptr) {
    d = std::getenv("RENAISSANCE_TEST_STARTUP_DELAY_MS");
  } else {
    for (char** e = envp; *e && !d; ++e)
      if (std::strncmp(*e, kDelay, std::strlen(kDelay)) == 0) d = *e + std::strlen(kDelay);
  }
  if (d) {
    std::fprintf(stderr, "renaissance: test: preemption handlers armed, start-up delayed %s ms\n", d);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(d)));
  }
}

void disarm_preemption_early() {
  if (!g_armed_early) return;
  g_armed_early = false;
  // The actions the process had (a job script's `trap '' USR1` kept: an ignored signal stays ignored, and one that
  // came during the start-up is dropped), and a signal that came meanwhile taken now with its default action.
  int i = 0;
  for (int sig : {SIGUSR1, SIGTERM}) sigaction(sig, &g_previous[i++], nullptr);
  const int sig = g_stop_request.exchange(0);
  if (sig == 0) return;
  const struct sigaction& was = g_previous[sig == SIGUSR1 ? 0 : 1];
  if (!(was.sa_flags & SA_SIGINFO) && was.sa_handler == SIG_DFL) ::raise(sig);
}

void CheckpointCli::add_to(CLI::App& cmd) {
  cmd.add_option("--checkpoint-dir", dir,
                 "Write checkpoints here (ckpt-stepN.h5, latest.h5); SIGUSR1/SIGTERM then checkpoint and exit 75");
  cmd.add_option("--checkpoint-every", every, "Checkpoint every N steps, or 'epoch' (default with a directory: epoch)");
  cmd.add_option("--keep", keep, "Keep the newest N checkpoints")->capture_default_str();
  cmd.add_option("--keep-best", keep_best,
                 "Also keep the checkpoint with the best value of this metric as best.h5 beside latest.h5")
      ->check(CLI::IsMember({"val_top1"}));
  m_resume_option =
      cmd.add_option(
             "--resume", resume,
             "Resume from a checkpoint: 'auto' (the newest valid one in --checkpoint-dir; none: start fresh) or a "
             "file")
          ->expected(0, 1);
  cmd.add_option("--loss-log", loss_log, "Write one JSON object per step (step, epoch, loss, lr; momentum with --onecycle-momentum) to this JSONL file");
}

void CheckpointCli::apply(runtime::TrainOptions& t) {
  RN_CHECK(keep >= 1, "--keep must be >= 1, got {}", keep);
  t.checkpoint_dir = dir;
  t.checkpoint_keep = keep;
  RN_CHECK(keep_best.empty() || !dir.empty(), "--keep-best needs --checkpoint-dir");
  t.checkpoint_keep_best = !keep_best.empty();
  t.checkpoint_every = 0;
  t.checkpoint_each_epoch = false;
  if (!every.empty()) {
    RN_CHECK(!dir.empty(), "--checkpoint-every needs --checkpoint-dir");
    if (every == "epoch") {
      t.checkpoint_each_epoch = true;
    } else {
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(every.c_str(), &end, 10);
      RN_CHECK(end && *end == '\0' && errno == 0 && n >= 1 && n <= (1LL << 53),
               "--checkpoint-every must be a number of steps from 1 to 2^53, or 'epoch', got '{}'", every);
      t.checkpoint_every = n;
    }
  } else if (!dir.empty()) {
    t.checkpoint_each_epoch = true;
  }
  if (m_resume_option && m_resume_option->count() > 0 && resume.empty()) resume = "auto";  // a bare --resume
  RN_CHECK(resume != "auto" || !dir.empty(), "--resume auto needs --checkpoint-dir (where to look)");
  // Checked again by the preflight; here so that a wrong path stops the run before the default data set is imported.
  if (!resume.empty() && resume != "auto") require_input_file(resume, "--resume");
  if (!dir.empty()) {
    install_preemption_handlers();
    t.stop_request = &g_stop_request;
  }
}

std::unique_ptr<runtime::InitialState> CheckpointCli::read_resume(bool root, std::string* skipped_note) const {
  if (resume.empty()) return nullptr;
  if (resume != "auto")
    return std::make_unique<runtime::InitialState>(
        runtime::InitialState::of_checkpoint(io::read_checkpoint(resume), resume));
  io::Checkpoint found;  // read once: finding the newest valid checkpoint validates it whole
  int skipped = 0;
  const std::string path = io::find_latest_checkpoint(
      dir,
      [&](const std::string& w) {
        ++skipped;
        if (root) spdlog::warn("{}", w);
        if (skipped_note) *skipped_note += (skipped_note->empty() ? "" : "; ") + w;
      },
      &found);
  if (skipped_note && !skipped_note->empty())
    *skipped_note = fmt::format(" (after skipping {} invalid: {})", skipped, *skipped_note);
  if (path.empty()) {
    // Checkpoints that are all invalid are not "no checkpoint" (an unattended requeue looked like a first run).
    if (root && skipped > 0)
      std::printf("no valid checkpoint in %s (%d skipped, above): starting fresh\n", dir.c_str(), skipped);
    else if (root)
      std::printf("no checkpoint in %s: starting fresh\n", dir.c_str());
    std::fflush(stdout);
    return nullptr;
  }
  return std::make_unique<runtime::InitialState>(runtime::InitialState::of_checkpoint(std::move(found), path));
}

namespace {

/// The "step" of a JSONL line written by this program (`"step":N`); -1 where there is none.
std::int64_t step_of_line(const std::string& line) {
  const auto at = line.find("\"step\":");
  if (at == std::string::npos) return -1;
  const char* begin = line.c_str() + at + 7;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(begin, &end, 10);
  return end == begin || errno != 0 ? -1 : static_cast<std::int64_t>(v);
}

/// A line of ours: a JSON object (a CR or blanks after it allowed: an edited file).
bool is_object(const std::string& line) {
  std::size_t end = line.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(line[end - 1]))) --end;
  return end >= 2 && line.front() == '{' && line[end - 1] == '}';
}

/// The resume's cut of a regular file: lines past `resume_step` and incomplete ones out. Returns how many.
std::int64_t drop_lines_past(const std::string& path, const char* option, std::int64_t resume_step) {
  std::ifstream in(path, std::ios::binary);
  RN_CHECK_CTX(in.good(), path, "{}: cannot read it to resume: {}", option, std::strerror(errno));
  std::string line;
  std::int64_t offset = 0, prefix_end = 0, dropped = 0;
  bool dropping = false, mixed = false, last_unended = false;
  while (std::getline(in, line)) {
    const bool newline = !in.eof();
    const std::int64_t next = offset + static_cast<std::int64_t>(line.size()) + (newline ? 1 : 0);
    // A complete object kept even without its newline (one is added); a line cut short is dropped.
    if (is_object(line) && step_of_line(line) <= resume_step) {
      if (dropping) {
        mixed = true;
      } else {
        prefix_end = next;
        last_unended = !newline;
      }
    } else {
      dropping = true;
      ++dropped;
    }
    offset = next;
  }
  RN_CHECK_CTX(!in.bad(), path, "{}: cannot read it to resume", option);
  in.close();
  if (!mixed) {  // the usual case: cut in place
    if (dropped > 0 && ::truncate(path.c_str(), static_cast<off_t>(prefix_end)) != 0)
      RN_FAIL_CTX(path, "{}: cannot cut the lines past step {}: {}", option, resume_step, std::strerror(errno));
    if (last_unended) {
      std::ofstream end(path, std::ios::app | std::ios::binary);
      RN_CHECK_CTX(end << '\n' << std::flush, path, "{}: cannot end its last line: {}", option, std::strerror(errno));
    }
    return dropped;
  }
  // Kept lines after dropped ones (a file from an older version): the kept ones through a temporary.
  std::error_code ec;
  const fs::path target = fs::canonical(path, ec);
  RN_CHECK_CTX(!ec, path, "{}: {}", option, ec.message());
  const fs::path tmp = target.string() + fmt::format(".resume-{}", static_cast<long>(::getpid()));
  {
    std::ifstream again(target, std::ios::binary);
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    while (std::getline(again, line))
      if (is_object(line) && step_of_line(line) <= resume_step) out << line << '\n';
    if (!(out << std::flush) || again.bad()) {
      const std::string why = std::strerror(errno);
      fs::remove(tmp, ec);
      RN_FAIL_CTX(path, "{}: cannot rewrite it without the lines past step {}: {}", option, resume_step, why);
    }
  }
  fs::permissions(tmp, fs::status(target, ec).permissions(), ec);
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    RN_FAIL_CTX(path, "{}: cannot replace it: {}", option, why);
  }
  return dropped;
}

/// A descriptor of `path` holding an exclusive flock, or -1 where it cannot be opened (the stream's open says why)
/// or the file system has no flock; another holder is an error naming the option.
int lock_log(const std::string& path, const char* option) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0666);
  if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int err = errno;
  ::close(fd);
  RN_CHECK_CTX(err != EWOULDBLOCK, path,
               "{}: another process is writing this file (a second run given the same {}?): give each run a file of "
               "its own",
               option, option);
  return -1;
}

}  // namespace

RunLog::RunLog(const std::string& path, const char* option, bool resumed, std::int64_t resume_step)
    : m_path(path), m_option(option) {
  if (is_own_stdio(path)) {
    // Written through the descriptor the process has (reopening /dev/stdout gave the file a second offset, and a
    // resume's cut replaced the job's output file). A failed write: stdout's is reported at the end of the command
    // (a closed pipe does not stop a run), stderr's fails the run as a file's.
    m_std = same_file_as_fd(path, STDOUT_FILENO);
    m_out = m_std ? &std::cout : &std::cerr;
    return;
  }
  std::error_code ec;
  const bool regular = fs::is_regular_file(path, ec);
  // One writer per file: a second run given the same one (a job array's script without %a in the name) truncated it,
  // or cut it to its own resume step, under the first, and the two runs' lines interleaved. An advisory flock of the
  // file itself, taken before anything is cut and held to the end; where the file system has none (some NFS
  // mounts) the log goes without. A descriptor of its own: the lock is not the stream's.
  if (regular || !fs::exists(path, ec)) m_lock.fd = lock_log(path, option);
  if (resumed && regular) {
    const std::int64_t dropped = drop_lines_past(path, option, resume_step);
    // Kept lines after dropped ones are rewritten through a temporary renamed over the file: the lock is the old
    // inode's, so it is taken again on the new one (a second run was let in).
    struct stat held {
    }, now{};
    if (m_lock.fd >= 0 && ::fstat(m_lock.fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 &&
        (held.st_ino != now.st_ino || held.st_dev != now.st_dev)) {
      ::close(m_lock.fd);
      m_lock.fd = -1;
      m_lock.fd = lock_log(path, option);
    }
    if (dropped > 0)
      std::printf(
          "%s: dropped %lld line%s past step %lld or cut short (written after the checkpoint this run "
          "resumes from, or cut by a failed write)\n",
          option, static_cast<long long>(dropped), dropped == 1 ? "" : "s", static_cast<long long>(resume_step));
  }
  // Truncated only where a fresh run replaces a file; a FIFO or device is written to as it is.
  const bool truncate = !resumed && (regular || !fs::exists(path, ec));
  m_file = std::make_unique<std::ofstream>(path, truncate ? std::ios::trunc : std::ios::app);
  RN_CHECK_CTX(m_file->good(), path, "{}: cannot open it for writing: {}", option, std::strerror(errno));
  m_out = m_file.get();
}

RunLog::LockFd::~LockFd() {
  if (fd >= 0) ::close(fd);  // releases the flock
}

void RunLog::write(const std::string& line, const std::string& what) {
  if (*m_out << line << '\n' << std::flush) return;
  if (m_std) return;  // the process's own stdout: a closed pipe does not stop a run (main.cpp reports a lost line)
  RN_FAIL_CTX(m_path, "{}: writing {} failed: {}", m_option, what, std::strerror(errno));
}

void CheckpointCli::observe(runtime::TrainObserver& obs, bool root, bool resumed, const runtime::Trainer& trainer) {
  if (root && !loss_log.empty())
    m_loss_log = std::make_shared<RunLog>(loss_log, "--loss-log", resumed, trainer.steps());
  long delay_ms = 0;  // test hook: slow every step down so a test can signal a run in flight
  if (const char* d = std::getenv("RENAISSANCE_TEST_STEP_DELAY_MS")) delay_ms = std::atol(d);
  if (m_loss_log || delay_ms > 0) {
    auto log = m_loss_log;
    const runtime::Trainer* t = &trainer;
    obs.on_step_loss = [log, delay_ms, t](std::int64_t step, std::int64_t epoch, double loss) {
      if (log) {
        JsonWriter j;
        j.begin_object().kv("step", step).kv("epoch", epoch).kv("loss", loss).kv("lr", t->last_lr());
        if (t->last_cycled_momentum() >= 0.0) j.kv("momentum", t->last_cycled_momentum());
        j.end_object();
        log->write(j.str(), fmt::format("the loss of step {}", step));
      }
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    };
  }
  if (root)
    obs.on_checkpoint = [](const std::string& path, std::int64_t step) {
      std::printf("checkpoint: step %lld -> %s\n", static_cast<long long>(step), path.c_str());
      std::fflush(stdout);
    };
}

void CheckpointCli::report_preempted(const runtime::Trainer& trainer, bool root) const {
  if (!root) return;
  const int sig = preemption_signal();
  std::printf("preempted by %s at step %lld: checkpoint %s; exit %d (requeue and resume with --resume auto)\n",
              sig == SIGTERM   ? "SIGTERM"
              : sig == SIGUSR1 ? "SIGUSR1"
              : sig == 0       ? "a signal to another rank"  // the stop request is agreed at a step boundary
                               : "a signal",
              static_cast<long long>(trainer.steps()),
              trainer.last_checkpoint().empty() ? "(none)" : trainer.last_checkpoint().c_str(), kExitPreempted);
  std::fflush(stdout);
}

}  // namespace renaissance::app
