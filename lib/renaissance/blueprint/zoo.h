// The model zoo: the published architectures, each a few lines of DSL.
#pragma once

#include <renaissance/blueprint/blueprint.h>

#include <string>
#include <vector>

namespace renaissance::blueprint {

struct ZooOptions {
  std::int64_t num_classes = 0;  ///< 0: the model's default (1000 for ImageNet models, 10 for small ones)
  std::int64_t in_c = 0;         ///< 0: the model's default input channels
  std::int64_t resolution = 0;   ///< 0: the model's default input size
};

/// Names of every zoo model, in a stable order.
std::vector<std::string> zoo_names();
/// Builds a zoo model by name; an unknown name throws Error listing the known ones.
BluePrint zoo_model(const std::string& name, const ZooOptions& opts = {});

}  // namespace renaissance::blueprint
