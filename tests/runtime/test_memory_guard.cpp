// The GPU-memory guard's decision, without a GPU: a plan that fits passes, one that does not is refused with the
// model, required vs available GiB and a hint; the margin is max(256 MiB, 2 % of the device). The host-memory guard
// (the CPU backend's arena) likewise, and what it reads of this machine.
#include <renaissance/core/error.h>
#include <renaissance/runtime/memory_guard.h>

#include <gtest/gtest.h>

namespace {

using namespace renaissance;
using runtime::check_device_memory;
using runtime::DeviceMemoryNeed;

constexpr std::int64_t GiB = std::int64_t(1) << 30;
constexpr std::int64_t MiB = std::int64_t(1) << 20;

TEST(MemoryGuard, MarginIsAtLeast256MiBAndTwoPercent) {
  EXPECT_EQ(runtime::default_margin_bytes(0), 256 * MiB);
  EXPECT_EQ(runtime::default_margin_bytes(8 * GiB), 256 * MiB);
  EXPECT_EQ(runtime::default_margin_bytes(140 * GiB), 140 * GiB / 50);
}

TEST(MemoryGuard, FittingPlanPasses) {
  const DeviceMemoryNeed need{"model 'fmnist_cnn' (batch 128, fp32)", 20 * MiB, 256 * MiB, 256 * MiB};
  EXPECT_NO_THROW(check_device_memory(need, 80 * GiB, 80 * GiB));
  EXPECT_NO_THROW(check_device_memory(need, need.total(), 80 * GiB));  // exactly full still fits
  EXPECT_NO_THROW(check_device_memory(need, -1, 0));                   // unknown free memory: let cudaMalloc decide
}

TEST(MemoryGuard, OversizedPlanIsRefusedWithNumbersAndHint) {
  const DeviceMemoryNeed need{"model 'resnet50' (batch 65536, fp32)", 3000 * GiB, GiB / 4, 2 * GiB};
  try {
    check_device_memory(need, 139 * GiB, 140 * GiB);
    FAIL() << "an arena larger than the device must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("resnet50"), std::string::npos) << m;
    EXPECT_NE(m.find("3002.25 GiB"), std::string::npos) << m;  // required: arena + workspace + margin
    EXPECT_NE(m.find("arena 3000.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("only 139.00 GiB of 140.00 GiB are free"), std::string::npos) << m;
    EXPECT_NE(m.find("--batch"), std::string::npos) << m;
    EXPECT_NE(m.find("--amp"), std::string::npos) << m;
  }
}

TEST(MemoryGuard, OneByteOverIsRefused) {
  const DeviceMemoryNeed need{"the arena", GiB, 0, 0};
  EXPECT_THROW(check_device_memory(need, GiB - 1, 2 * GiB), Error);
}

TEST(MemoryGuard, CpuBuildOrNoDeviceNeverThrowsFromTheGuard) {
#ifndef RENAISSANCE_HAVE_CUDA
  EXPECT_NO_THROW(runtime::guard_device_memory({"anything", 1000 * GiB * 1000, 0, 0}));
#else
  GTEST_SKIP() << "a CUDA build asks the driver";
#endif
}

TEST(HostMemoryGuard, ArenaWithinWhatIsAvailablePassesAndUnknownPasses) {
  EXPECT_NO_THROW(runtime::check_host_memory("model 'fmnist_cnn' (batch 128, fp32)", 28 * MiB, 20 * GiB, 24 * GiB));
  EXPECT_NO_THROW(runtime::check_host_memory("the arena", 20 * GiB, 20 * GiB, 24 * GiB));  // exactly: fits
  EXPECT_NO_THROW(runtime::check_host_memory("the arena", 1000 * GiB, -1, -1));            // nothing known
  EXPECT_THROW(runtime::check_host_memory("the arena", 20 * GiB + 1, 20 * GiB, 24 * GiB), Error);
}

TEST(HostMemoryGuard, AnArenaLargerThanTheHostIsRefusedWithNumbersAndHint) {
  try {
    runtime::check_host_memory("model 'resnet50' (batch 100000, fp32)", 8000 * GiB, 22 * GiB, 24 * GiB);
    FAIL() << "an arena larger than the host's memory must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model 'resnet50' (batch 100000, fp32)"), std::string::npos) << m;
    EXPECT_NE(m.find("8000.00 GiB of host memory"), std::string::npos) << m;
    EXPECT_NE(m.find("only 22.00 GiB of 24.00 GiB are available"), std::string::npos) << m;
    EXPECT_NE(m.find("--batch"), std::string::npos) << m;
  }
}

TEST(HostMemoryGuard, TheRanksOnANodeShareItsMemory) {
  // Four ranks of 6 GiB each fit 24 GiB but not 23: the message gives the sum, the count and one arena.
  EXPECT_NO_THROW(runtime::check_host_memory("model 'resnet50' (batch 256, fp32)", 6 * GiB, 24 * GiB, 32 * GiB, 4));
  try {
    runtime::check_host_memory("model 'resnet50' (batch 256, fp32)", 6 * GiB, 23 * GiB, 32 * GiB, 4);
    FAIL() << "four arenas of 6 GiB must not fit 23 GiB";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("24.00 GiB of host memory for the arenas of its 4 ranks on this node (6.00 GiB each)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("fewer ranks per node"), std::string::npos) << m;
  }
}

TEST(HostMemoryGuard, ThisMachineReportsWhatItHas) {
  // Linux always has /proc/meminfo: something available, no more than the total (MemTotal or a cgroup's limit).
  std::int64_t total = 0;
  const std::int64_t avail = runtime::host_available_bytes(&total);
  ASSERT_GT(avail, 0);
  ASSERT_GT(total, 0);
  EXPECT_LE(avail, total);
}

}  // namespace
