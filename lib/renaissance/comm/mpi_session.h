// MpiSession: the process's MPI bootstrap (DESIGN §9). One per process, made first thing in main(): it works
// under mpirun, under `srun --mpi=pmix` and as a singleton with no launcher. Code that runs without it (unit
// tests constructing a Trainer directly) sees one rank and no communicator.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

namespace renaissance::comm {

class CommWatchdog;

class MpiSession {
 public:
  /// When launched_by_mpi_launcher(): MPI_Init_thread (FUNNELED: only the main thread calls MPI; the watchdog thread
  /// never does), then rank, world size and the node-local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Under
  /// Slurm, a world size that differs from the step's task count (a broken PMI launch starts N singletons) is a fatal
  /// error.
  MpiSession(int* argc, char*** argv);
  /// MPI_Finalize, unless abort() ran. Start-up (MPI_Init to the rank layout) and MPI_Finalize run under a
  /// watchdog of the collective timeout (--comm-timeout on the command line, else RENAISSANCE_COMM_TIMEOUT, else
  /// 300 s): a rank stopped or dead while the others wait in them ends the job with kExitCommFailure.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  /// The live session, or nullptr (no MpiSession in this process: one rank).
  static MpiSession* current();

  int rank() const { return m_rank; }
  int world_size() const { return m_world; }
  int local_rank() const { return m_local_rank; }
  int local_size() const { return m_local_size; }
  bool is_root() const { return m_rank == 0; }
  MPI_Comm world() const { return m_comm; }
  /// "rank 3/8" style prefix for error messages ("" with one rank).
  std::string rank_prefix() const;

  /// After an error on this rank: waits up to `grace_s` seconds for every other rank to arrive here too (a
  /// consistent error, e.g. a configuration mismatch every rank detected). Returns true when all arrived (the
  /// caller may finalize and exit normally); false when some rank did not (it is still working, dead or hung).
  bool all_ranks_failed(double grace_s);
  /// Whether every rank passes the same `value` (one MPI_Allreduce of value and its complement, MAX; under the
  /// start-up watchdog, named `what`, so a rank that never arrives ends the job). True with one rank.
  bool same_on_every_rank(std::uint64_t value, const char* what);
  /// MPI_Abort(MPI_COMM_WORLD, code): ends every rank of the job. Never returns.
  [[noreturn]] void abort(int code);

 private:
  int m_rank = 0, m_world = 1, m_local_rank = 0, m_local_size = 1;
  MPI_Comm m_comm = MPI_COMM_NULL;        ///< a duplicate of MPI_COMM_WORLD for the library's collectives
  MPI_Comm m_error_comm = MPI_COMM_NULL;  ///< another duplicate, only for the error rendezvous
  bool m_finalize = false;
  std::unique_ptr<CommWatchdog> m_watchdog;  ///< start-up and shutdown (the communicators have their own)
};

/// The collective timeout before the command line is parsed: `--comm-timeout S` (or `=S`) in argv, else
/// RENAISSANCE_COMM_TIMEOUT, else kDefaultCommTimeout.
double startup_comm_timeout(int argc, char** argv);

/// The Slurm task count this process should see as its MPI world size: SLURM_STEP_NUM_TASKS inside a job step
/// (srun), -1 elsewhere (no Slurm, or a batch script's own shell, which is one process whatever SLURM_NTASKS says).
int slurm_expected_tasks();

/// True when a launcher started this process as an MPI rank (mpirun, srun, hydra: their environment variables)
/// or RENAISSANCE_MPI=always; false when started alone or RENAISSANCE_MPI=never. MpiSession calls MPI_Init only
/// then: a process started alone is one rank without MPI.
bool launched_by_mpi_launcher();

/// Exit status of a rank that ends the job because a collective timed out or NCCL failed.
constexpr int kExitCommFailure = 3;

}  // namespace renaissance::comm
