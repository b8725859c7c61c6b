// libFuzzer target: the YAML model format (blueprint_from_yaml) and, for models that parse, the ArchPlan build
// (tree expansion, shape inference, fusion) and its YAML round trip.
#include "fuzz_util.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/plan/arch_plan.h>

#include <cstdint>
#include <string>

using namespace renaissance;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean(
      [&] {
        const blueprint::BluePrint bp = blueprint::blueprint_from_yaml(text, "fuzz.yaml");
        // The emitter must produce YAML the parser takes back.
        (void)blueprint::blueprint_from_yaml(blueprint::blueprint_to_yaml(bp), "fuzz.yaml (re-emitted)");
        for (bool amp : {false, true}) {
          plan::BuildOptions o;
          o.amp = amp;
          o.fuse = amp;
          const plan::ArchPlan a = plan::ArchPlan::build(bp, o);
          (void)plan::ArchPlan::from_yaml(a.to_yaml(), "fuzz arch plan");
          (void)a.parameter_count();
        }
      },
      "fuzz_blueprint_yaml");
  return 0;
}
