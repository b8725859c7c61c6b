// renaissance: one SPMD executable; every subcommand is registered from app/cmd_*.cpp.
#include "checkpoint_options.h"
#include "cli_errors.h"
#include "commands.h"
#include "environment.h"

#include <renaissance/comm/mpi_session.h>
#include <renaissance/core/error.h>
#include <renaissance/io/hdf5_util.h>

#include <renaissance/core/log.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace {

/// Seconds a failing rank waits for the others to fail too before it aborts the whole job.
constexpr double kErrorGraceSeconds = 10.0;

/// What this rank's command line asks for, compared across ranks before any command runs: "run <subcommands>",
/// "info" (--help, --version, a bare `renaissance`) or "usage <the error's text>".
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

/// Ranks started with different command lines (an MPMD `mpirun -np 1 A : -np 1 B`, a wrapper script): one running
/// `train` while another printed its help or a usage error and returned left the first waiting in a collective (a
/// hang, or the watchdog's exit 3), and a usage error on a rank other than 0 was never printed.
struct RanksDiffer {
  std::string what;  ///< this rank's part
};

/// Throws RanksDiffer unless every rank's outcome is `outcome` (described as `what`).
void agree_on_command(renaissance::comm::MpiSession& mpi, const std::string& outcome, const std::string& what) {
  if (!mpi.same_on_every_rank(fnv1a(outcome), "agreeing on the command line (every rank must run the same)"))
    throw RanksDiffer{what};
}

/// Every rank reports its own error, prefixed with its rank. When every rank failed (a configuration mismatch
/// all of them detected) they exit normally with `code`; when some rank did not arrive (still in a collective,
/// dead or hung), MPI_Abort ends the whole job so no rank is left waiting.
int fail(renaissance::comm::MpiSession& mpi, const char* what, int code) {
  std::fprintf(stderr, "renaissance: error: %s%s\n", mpi.rank_prefix().c_str(), what);
  std::fflush(stderr);
  if (mpi.world_size() > 1 && !mpi.all_ranks_failed(kErrorGraceSeconds)) mpi.abort(code);
  return code;
}

/// std::thread's "Resource temporarily unavailable" (EAGAIN from pthread_create) said as what it means: the process
/// may start no more threads, or not map a thread's stack. It was the bare errno text, and at the MPI start-up (the
/// watchdog thread) an uncaught exception: SIGABRT, exit 134.
std::string describe(const std::system_error& e) {
  if (e.code() != std::errc::resource_unavailable_try_again) return e.what();
  return std::string("could not start a thread (") + e.what() +
         "): this process may not have another thread or its stack (the limits on processes and memory: ulimit -u, "
         "-v and -s, a Slurm job's --mem, a container's pids limit); raise them, or use fewer threads "
         "(--loader-threads, RENAISSANCE_CPU_THREADS)";
}

/// Every thread this process starts gets at least 2 MiB of stack. std::thread takes glibc's default, which is the
/// stack limit (`ulimit -s`): at 128 KiB the batch loader's HDF5 read overflowed its stack (SIGSEGV). Thread stacks
/// are mappings of their own, so the limit on the main thread's stack need not bound them.
void ensure_thread_stacks() {
  constexpr std::size_t kMinThreadStack = std::size_t{2} << 20;
  pthread_attr_t attr;
  if (pthread_getattr_default_np(&attr) != 0) return;
  std::size_t size = 0;
  if (pthread_attr_getstacksize(&attr, &size) == 0 && size < kMinThreadStack &&
      pthread_attr_setstacksize(&attr, kMinThreadStack) == 0)
    pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
}

/// stdout closed under us (`renaissance train | head`): the run goes on (its files are what matters) and says once,
/// on stderr, that its output was lost.
void warn_if_stdout_was_lost() {
  std::fflush(stdout);
  if (std::ferror(stdout))
    std::fprintf(stderr, "renaissance: warning: standard output was closed (a broken pipe?): some of this command's "
                         "output was lost; the command itself ran to its end\n");
}

/// After the command: standard output that could not be written. A pipe whose reader left (`| head`) is the warning
/// above and keeps `code`; a file or device (`eval --json > r.json` on a full disk) lost the command's result, so
/// the exit status says so (it was 0, with an empty r.json and a warning about a broken pipe).
int check_stdout(int code) {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  const int err = errno;
  if (!std::ferror(stdout)) return code;
  struct stat st {};
  // Closed (`>&-`: no descriptor 1) or a pipe: the warning at exit, as before.
  if (::fstat(STDOUT_FILENO, &st) != 0 || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) return code;
  std::fprintf(stderr,
               "renaissance: error: writing the standard output failed%s: this command's output is incomplete\n",
               flush_failed && err ? (" (" + std::string(std::strerror(err)) + ")").c_str() : "");
  std::clearerr(stdout);  // said once: not the broken-pipe warning at exit as well
  return code == 0 ? 1 : code;
}

/// A process started with 0, 1 or 2 closed (`>&-`): the next open() took the number, and stdout's lines went into
/// that file (the checkpoint lock, a log). Stdin gets /dev/null; stdout and stderr a pipe whose reader is gone, so
/// writes fail (EPIPE, SIGPIPE ignored) and the end of the command warns that output was lost.
void fill_closed_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int p[2] = {-1, -1};
    if (fd == 0) {
      p[1] = ::open("/dev/null", O_RDONLY);
    } else if (::pipe(p) != 0) {
      continue;
    }
    // The new descriptor at `fd`, the other end (if any) closed.
    if (p[1] >= 0 && p[1] != fd) {
      ::dup2(p[1], fd);
      ::close(p[1]);
    }
    if (p[0] >= 0 && p[0] != fd) ::close(p[0]);
  }
}

/// The preemption handlers before any shared library's constructor runs: glibc calls an executable's .preinit_array
/// first, then the libraries' initialisers (cuDNN, cuBLASLt, oneDNN, OpenBLAS: 65-100 ms on the 2-core CI machine),
/// and only then main. A SIGTERM or SIGUSR1 in that window killed a checkpointed `train` (143/138, which the job
/// scripts do not requeue) instead of making it checkpoint and exit 75. Only libc is used there (the handlers, the
/// test hook's fprintf and nanosleep; envp instead of getenv, whose environment libc sets up in its own initialiser);
/// main calls it again, which does nothing once armed.
/// Not under a sanitizer, whose runtime initialises itself from .preinit_array too and intercepts sigaction (the
/// order of the two entries is the linker's): there main arms them, as before.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RENAISSANCE_SANITIZED 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && !defined(RENAISSANCE_SANITIZED)
/// Room for the shared libraries' initialisers (cuBLASLt's, nvrtc's, cuDNN's allocate before main: under a memory
/// limit just above what mapping the libraries takes, they crashed, SIGSEGV or an uncaught std::bad_alloc, exit
/// 134/139, in every command, the CPU ones too; a window of ~6 MiB). A 16 MiB reservation that cannot be mapped means
/// there is no such room: said, exit 1. Only libc (the loader has mapped the libraries, none has run its initialiser).
void preinit_memory_headroom() {
  constexpr std::size_t kHeadroom = std::size_t{16} << 20;
  void* p = ::mmap(nullptr, kHeadroom, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    ::munmap(p, kHeadroom);
    return;
  }
  static const char kMessage[] =
      "renaissance: error: out of host memory before the start: the libraries are mapped but there is no room for "
      "their initialisation (the address-space limit, ulimit -v, or a job's memory limit, is too low); raise it\n";
  [[maybe_unused]] const ssize_t n = ::write(2, kMessage, sizeof(kMessage) - 1);
  ::_exit(1);
}

void preinit_preemption(int argc, char** argv, char** envp) {
  preinit_memory_headroom();
  renaissance::app::arm_preemption_early(argc, argv, envp);
}
__attribute__((section(".preinit_array"), used)) void (*const kPreinitPreemption)(int, char**, char**) =
    preinit_preemption;
#endif

}  // namespace

int main(int argc, char** argv) {
  // A reader of stdout that goes away (SIGPIPE) must not kill a run silently, nor a file-size limit (SIGXFSZ) one
  // that is writing a checkpoint: both become write errors, reported where they happen.
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
  fill_closed_standard_descriptors();
  std::atexit(warn_if_stdout_was_lost);
  renaissance::app::arm_preemption_early(argc, argv);
  // Ctrl-C or a kill of an import (or of any write of a file) removes the temporary it was writing; train's
  // preemption handlers, where armed, keep SIGTERM.
  renaissance::io::install_interrupt_cleanup();
  ensure_thread_stacks();  // before any thread of ours (the MPI watchdog's is the first)
  // MPI first: under mpirun or `srun --mpi=pmix` this process is one rank of a data-parallel job; started alone it
  // is a singleton of one rank (DESIGN §9).
  std::optional<renaissance::comm::MpiSession> session;
  try {
    session.emplace(&argc, &argv);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "renaissance: error: MPI start-up: %s\n", describe(e).c_str());
    return 1;
  } catch (const std::exception& e) {  // MPI_Init_thread's own failure, a launcher setting that cannot work
    std::fprintf(stderr, "renaissance: error: MPI start-up: %s\n", e.what());
    return 1;
  }
  renaissance::comm::MpiSession& mpi = *session;
  // Logs go to stderr: stdout carries the results (--json lines, tables) that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("renaissance"));
  CLI::App app{"Renaissance: planned, graph-captured training of convolutional image classifiers", "renaissance"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "renaissance 0.1.0");
  renaissance::app::register_plan_command(app);
  renaissance::app::register_data_command(app);
  renaissance::app::register_train_command(app);
  renaissance::app::register_eval_command(app);
  renaissance::app::register_bench_command(app);
  renaissance::app::register_checkpoint_command(app);
  renaissance::app::register_predict_command(app);
  renaissance::app::read_integers_as_decimal(app);
  renaissance::app::check_flags_and_paths(app);
  // Before any subcommand's callback runs: every rank runs the same subcommand.
  app.parse_complete_callback([&] {
    std::string chain = "renaissance";
    for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
      a = a->get_subcommands().front();
      chain += " " + a->get_name();
    }
    agree_on_command(mpi, "run " + chain, "runs `" + chain + "`");
    // Commands of one process: under mpirun/srun every rank ran them, printing each line N times (`plan --json` gave
    // lines interleaved past parsing) and writing the same file N times (predict's --out: the last rename won,
    // whatever weights that rank had).
    const std::string command = app.get_subcommands().front()->get_name();
    if (mpi.world_size() > 1 &&
        (command == "plan" || command == "data" || command == "checkpoint" || command == "predict"))
      RN_FAIL_CTX(chain.substr(std::string("renaissance ").size()),
                  "it runs in one process, and this job has {} ranks: start it without mpirun/srun, or with one "
                  "task{}",
                  mpi.world_size(), command == "predict" ? " (eval scores a dataset on several ranks)" : "");
  });
  const auto ranks_differ = [&](const RanksDiffer& d) {
    return fail(mpi, ("the ranks were started with different command lines: this rank " + d.what).c_str(),
                renaissance::app::kExitUsage);
  };
  try {
    // A bare `renaissance` shows what it can do (as git and docker do), not an error.
    if (argc <= 1) {
      agree_on_command(mpi, "info", "prints the help (no command given)");
      if (mpi.is_root()) std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    // The environment first: a run must not start with a setting it silently ignores. (Not for --help/--version.)
    bool help = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      help = help || a == "-h" || a == "--help" || a == "--version";
    }
    if (!help) renaissance::app::check_environment();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    try {
      if (e.get_exit_code() == 0) {  // --help, --version: printed once
        agree_on_command(mpi, "info", "asks for the help or the version");
        return mpi.is_root() ? app.exit(e) : 0;
      }
      // A usage error: the same on every rank, said once, exit 2 with a "did you mean" where one is near.
      const std::string text =
          renaissance::app::usage_error_text(app, std::vector<std::string>(argv + 1, argv + argc), e);
      agree_on_command(mpi, "usage " + text, "has this usage error:\n" + text);
      if (mpi.is_root()) {
        std::fputs(text.c_str(), stderr);
        std::fflush(stderr);
      }
      return renaissance::app::kExitUsage;
    } catch (const RanksDiffer& d) {
      return ranks_differ(d);
    } catch (const std::exception& x) {  // the agreement's own MPI error, inside this handler
      return fail(mpi, x.what(), 1);
    }
  } catch (const RanksDiffer& d) {
    return ranks_differ(d);
  } catch (const renaissance::Error& e) {
    return fail(mpi, e.what(), 1);
  } catch (const std::bad_alloc&) {
    // What it meant, not "std::bad_alloc" (a model at the layer cap plans in ~11 GB).
    return fail(mpi,
                "out of host memory (std::bad_alloc): the command needs more memory than this process may have (the "
                "machine's, a ulimit, or a Slurm job's --mem); a smaller model or batch, or more memory",
                1);
  } catch (const std::system_error& e) {
    return fail(mpi, describe(e).c_str(), 1);
  } catch (const std::exception& e) {
    return fail(mpi, e.what(), 1);
  }
  return check_stdout(renaissance::app::exit_code());
}
