// The GPU-memory guard on a real device: ResNet-50 with a plan (2048x2048 inputs) whose arena cannot fit is refused before any
// device allocation, with the model, the sizes and a hint; a small plan on the same device starts.
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/arena_keeper.h>
#include <renaissance/runtime/trainer.h>

#include <kernels/cuda/device_info.h>
#include <kernels/cuda/runtime_api.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

namespace {

using namespace renaissance;

std::string dataset(std::int64_t n, std::int64_t hw) {
  const auto dir = std::filesystem::temp_directory_path() / ("rn_guard_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / fmt::format("syn_{}_{}.h5", n, hw)).string();
  if (!std::filesystem::exists(p)) io::make_synthetic(p, n, 8, hw, hw, 3, 10, 3);
  return p;
}

TEST(GpuMemoryGuard, OversizedResnet50IsRefusedBeforeAllocating) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::int64_t free_b = 0, total_b = 0;
  cuda::device_memory(&free_b, &total_b);
  runtime::TrainOptions o;
  // The batch is capped by the train split, so the size comes from the resolution: ResNet-50 at 2048x2048 with a
  // batch of 32 plans a ~230 GB arena (`renaissance plan --model resnet50 --resolution 2048 --batch 32`).
  o.data_path = dataset(32, 2048);
  o.backend = runtime::Backend::CUDA;
  o.batch = 32;
  o.epochs = 1;
  o.validate = false;
  blueprint::ZooOptions z;
  z.num_classes = 10;
  z.resolution = 2048;
  const std::int64_t arenas_before = runtime::ArenaKeeper::allocation_count();
  const std::int64_t allocs_before = cuda::device_alloc_count();
  try {
    runtime::Trainer t(blueprint::zoo_model("resnet50", z), o);
    FAIL() << "a plan larger than the GPU must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("resnet50"), std::string::npos) << m;
    EXPECT_NE(m.find("GiB of GPU memory"), std::string::npos) << m;
    EXPECT_NE(m.find(fmt::format("of {:.2f} GiB are free", static_cast<double>(total_b) / (1 << 30))),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--batch"), std::string::npos) << m;
  }
  EXPECT_EQ(runtime::ArenaKeeper::allocation_count(), arenas_before) << "the arena must not have been allocated";
  EXPECT_EQ(cuda::device_alloc_count(), allocs_before) << "nothing may be allocated before the guard";
}

TEST(GpuMemoryGuard, ArenaKeeperAloneIsGuardedToo) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::int64_t free_b = 0, total_b = 0;
  cuda::device_memory(&free_b, &total_b);
  EXPECT_THROW(runtime::ArenaKeeper(runtime::Backend::CUDA, 2 * total_b), Error);
}

TEST(GpuMemoryGuard, SmallPlanStarts) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  runtime::TrainOptions o;
  o.data_path = dataset(16, 224);
  o.backend = runtime::Backend::CUDA;
  o.batch = 8;
  o.epochs = 1;
  o.validate = false;
  blueprint::ZooOptions z;
  z.num_classes = 10;
  EXPECT_NO_THROW(runtime::Trainer(blueprint::zoo_model("resnet50", z), o));
}

}  // namespace
