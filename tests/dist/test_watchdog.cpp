// CommWatchdog (lib/renaissance/comm/watchdog.h): a collective that does not finish within the timeout ends
// the process with exit code 3 and a message naming the rank, what hung and the step; an asynchronous failure
// reported by the poll (NCCL) ends it at once, after the abort hook.
#include <renaissance/comm/mpi_session.h>
#include <renaissance/comm/watchdog.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

using namespace renaissance::comm;
using namespace std::chrono_literals;

TEST(CommWatchdog, FiresAfterTheTimeoutNamingRankAndStep) {
  EXPECT_EXIT(
      {
        CommWatchdog w(5, 0.3);
        w.set_step(42);
        w.arm("MPI_Allreduce (test)");
        std::this_thread::sleep_for(10s);
      },
      testing::ExitedWithCode(kExitCommFailure),
      "rank 5: MPI_Allreduce \\(test\\) did not finish within 0.3 s .* at step 42; aborting the job");
}

TEST(CommWatchdog, DisarmedInTimeNeverFires) {
  CommWatchdog w(0, 0.3);
  for (int i = 0; i < 5; ++i) {
    w.arm("short collective");
    std::this_thread::sleep_for(100ms);
    w.disarm();
  }
  std::this_thread::sleep_for(500ms);
  SUCCEED();
}

TEST(CommWatchdog, AsyncErrorAbortsAtOnceAfterTheHook) {
  EXPECT_EXIT(
      {
        CommWatchdog w(
            1, 1000.0, [] { return std::string("NCCL asynchronous error: test"); },
            [] { std::fprintf(stderr, "abort hook ran\n"); });
        w.arm("a step's device work");
        std::this_thread::sleep_for(10s);
      },
      testing::ExitedWithCode(kExitCommFailure), "rank 1: NCCL asynchronous error: test(.|\n)*abort hook ran");
}

TEST(CommWatchdog, TimeoutFromTheEnvironment) {
  setenv("RENAISSANCE_COMM_TIMEOUT", "12.5", 1);
  EXPECT_DOUBLE_EQ(comm_timeout_from_env(300.0), 12.5);
  setenv("RENAISSANCE_COMM_TIMEOUT", "soon", 1);
  EXPECT_DOUBLE_EQ(comm_timeout_from_env(300.0), 300.0);
  unsetenv("RENAISSANCE_COMM_TIMEOUT");
  EXPECT_DOUBLE_EQ(comm_timeout_from_env(300.0), 300.0);
}
