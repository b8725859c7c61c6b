// mpi_probe: the smallest check that an MPI launch works (mpirun, srun --mpi=pmix, a singleton).
// Every rank prints one line:
//   mpi_probe rank=R size=S local_rank=L local_size=N host=H
// then rank 0 prints `mpi_probe OK sum=X ranks=S` when MPI_Allreduce of the ranks gives
// S*(S-1)/2. Exit code 0 on success, 1 on a wrong sum or size (and when RENAISSANCE_PROBE_RANKS
// is set and differs from the communicator size), so a launcher that starts N singletons instead
// of one N-rank job fails visibly.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  // Local rank on this node, as the trainer picks its GPU (DESIGN §9).
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_rank = 0, local_size = 0;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::printf("mpi_probe rank=%d size=%d local_rank=%d local_size=%d host=%s\n", rank, size,
              local_rank, local_size, host);
  std::fflush(stdout);

  long mine = rank, sum = -1;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const long expected = static_cast<long>(size) * (size - 1) / 2;

  int rc = 0;
  if (sum != expected) {
    std::fprintf(stderr, "mpi_probe rank=%d: allreduce sum %ld, expected %ld\n", rank, sum, expected);
    rc = 1;
  }
  if (const char* want = std::getenv("RENAISSANCE_PROBE_RANKS"); want != nullptr && *want != '\0') {
    if (std::atoi(want) != size) {
      std::fprintf(stderr, "mpi_probe rank=%d: size %d, expected %s ranks\n", rank, size, want);
      rc = 1;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && rc == 0) {
    std::printf("mpi_probe OK sum=%ld ranks=%d\n", sum, size);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return rc;
}
