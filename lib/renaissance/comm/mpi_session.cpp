#include <renaissance/comm/communicator.h>
#include <renaissance/comm/mpi_session.h>
#include <renaissance/comm/watchdog.h>
#include <renaissance/core/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace renaissance::comm {

namespace {

MpiSession* g_session = nullptr;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' && x > 0 ? static_cast<int>(x) : -1;
}

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  RN_FAIL("{} failed: {}", what, msg);
}

}  // namespace

bool launched_by_mpi_launcher() {
  const char* mode = std::getenv("RENAISSANCE_MPI");
  if (mode && std::string(mode) == "always") return true;
  if (mode && std::string(mode) == "never") return false;
  // Open MPI's mpirun, PMIx launchers (srun --mpi=pmix, prterun), PMI-1/2 (MPICH/Intel hydra, srun --mpi=pmi2),
  // MVAPICH, and any Slurm job step (so a step whose tasks fail to join one MPI job is caught below).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "HYDRA_CONTROL_FD",
                        "MV2_COMM_WORLD_RANK", "SLURM_STEP_NUM_TASKS"})
    if (std::getenv(v)) return true;
  return false;
}

double startup_comm_timeout(int argc, char** argv) {
  for (int i = 1; argv && i < argc; ++i) {
    const std::string a = argv[i] ? argv[i] : "";
    const char* v = nullptr;
    if (a == "--comm-timeout" && i + 1 < argc) v = argv[i + 1];
    if (a.rfind("--comm-timeout=", 0) == 0) v = argv[i] + 15;
    if (!v) continue;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end && *end == '\0' && x > 0 && x < 1e9) return x;
  }
  return comm_timeout_from_env(kDefaultCommTimeout);
}

int slurm_expected_tasks() {
  // Only inside a job step (srun): a batch script's own shell also sees SLURM_NTASKS of the whole job but is one
  // process by design (e.g. `renaissance data import` before the srun line).
  if (env_int("SLURM_STEP_NUM_TASKS") > 0) return env_int("SLURM_STEP_NUM_TASKS");
  return -1;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  // mpirun (Open MPI, MPICH) is the authority on the rank count it was given; under srun, Slurm is. Read before
  // MPI_Init: Open MPI exports OMPI_COMM_WORLD_SIZE into the environment of the ranks it starts itself.
  const bool by_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
                         std::getenv("HYDRA_CONTROL_FD") != nullptr;
  // RENAISSANCE_MPI=never in a process that a launcher started as one of several ranks: each would train alone on
  // the whole data and write the same outputs (or wait for a rank that never joins until --comm-timeout). Refused.
  if (const char* mode = std::getenv("RENAISSANCE_MPI"); mode && std::string(mode) == "never") {
    int launched = -1;
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"})
      launched = std::max(launched, env_int(v));
    RN_CHECK(launched <= 1,
             "RENAISSANCE_MPI=never, but the launcher started this process as one of {} ranks: each would run the "
             "command alone on all of the data and write the same outputs (hint: unset RENAISSANCE_MPI, or launch "
             "one process)",
             launched);
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized && !launched_by_mpi_launcher()) {
    // Started alone: one rank. MPI_Init as a singleton would work too but costs ~0.5 s per command (Open MPI
    // starts a helper daemon); RENAISSANCE_MPI=always forces it.
    g_session = this;
    return;
  }
  // Start-up waits for every rank (a PMIx fence): a rank stopped or dead before it arrives would leave the others
  // waiting forever. The rank from the launcher's environment, for the message.
  int launch_rank = -1;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (launch_rank < 0 && std::getenv(v)) launch_rank = std::atoi(std::getenv(v));
  m_watchdog =
      std::make_unique<CommWatchdog>(launch_rank, startup_comm_timeout(argc ? *argc : 0, argv ? *argv : nullptr));
  m_watchdog->set_step(-1);
  m_watchdog->arm("MPI start-up (MPI_Init, waiting for every rank)");
  if (!initialized) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    m_finalize = true;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &m_comm);
  MPI_Comm_dup(MPI_COMM_WORLD, &m_error_comm);
  MPI_Comm_set_errhandler(m_comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(m_comm, &m_rank);
  MPI_Comm_size(m_comm, &m_world);
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(m_comm, MPI_COMM_TYPE_SHARED, m_rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &m_local_rank);
  MPI_Comm_size(local, &m_local_size);
  MPI_Comm_free(&local);
  m_watchdog->disarm();
  g_session = this;
  const int expected = by_mpirun ? -1 : slurm_expected_tasks();
  if (expected > 0 && expected != m_world) {
    std::fprintf(stderr,
                 "renaissance: error: rank %d: the MPI world has %d rank(s) but Slurm started %d task(s) "
                 "(SLURM_STEP_NUM_TASKS/SLURM_NTASKS); the tasks did not join one MPI job, each would train alone "
                 "(hint: launch with `srun --mpi=pmix`, check `srun --mpi=list`, or run one task)\n",
                 m_rank, m_world, expected);
    std::fflush(stderr);
    if (m_world > 1) abort(1);
    MPI_Comm_free(&m_comm);
    MPI_Comm_free(&m_error_comm);
    MPI_Finalize();
    std::exit(1);
  }
}

MpiSession::~MpiSession() {
  if (g_session == this) g_session = nullptr;
  if (!m_finalize || m_comm == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // MPI_Finalize waits for the other ranks too: a stopped one must not hang this one.
  if (m_watchdog) m_watchdog->arm("MPI_Finalize (waiting for every rank)");
  // Test hook (tests/dist/dp_test.sh finalize-stop): this rank stops itself on its way into MPI_Finalize.
  if (const char* r = std::getenv("RENAISSANCE_TEST_STOP_BEFORE_FINALIZE"); r && std::atoi(r) == m_rank)
    std::raise(SIGSTOP);
  MPI_Comm_free(&m_comm);
  MPI_Comm_free(&m_error_comm);
  MPI_Finalize();
  if (m_watchdog) m_watchdog->disarm();
}

MpiSession* MpiSession::current() { return g_session; }

std::string MpiSession::rank_prefix() const {
  return m_world > 1 ? fmt::format("rank {}/{}: ", m_rank, m_world) : std::string();
}

bool MpiSession::all_ranks_failed(double grace_s) {
  if (m_world == 1 || m_error_comm == MPI_COMM_NULL) return true;
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(m_error_comm, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;  // the request stays pending: the caller aborts the job
}

bool MpiSession::same_on_every_rank(std::uint64_t value, const char* what) {
  if (m_world == 1 || m_comm == MPI_COMM_NULL) return true;
  std::uint64_t v[2] = {value, ~value}, max[2] = {0, 0};
  if (m_watchdog) m_watchdog->arm(what);
  const int rc = MPI_Allreduce(v, max, 2, MPI_UINT64_T, MPI_MAX, m_comm);
  if (m_watchdog) m_watchdog->disarm();
  mpi_check(rc, what);
  return max[0] == value && max[1] == ~value;  // the largest value and the smallest: all equal
}

void MpiSession::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (m_watchdog) m_watchdog->arm("MPI_Abort");
  if (m_comm != MPI_COMM_NULL) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // not reached
}

}  // namespace renaissance::comm
