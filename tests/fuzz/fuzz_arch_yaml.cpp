// libFuzzer target: the ArchPlan YAML reader (ArchPlan::from_yaml, also fed by weights files' arch_plan).
#include "fuzz_util.h"

#include <renaissance/plan/arch_plan.h>

#include <cstdint>
#include <string>

using namespace renaissance;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] { (void)plan::ArchPlan::from_yaml(text, "fuzz arch plan").to_yaml(); }, "fuzz_arch_yaml");
  return 0;
}
