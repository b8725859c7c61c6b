#include "model_options.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>

namespace renaissance::app {

void ModelOptions::add_to(CLI::App& cmd) {
  auto* m = cmd.add_option("--model", model, "Zoo model name (resnet18, resnet50, fmnist_cnn, ...)")->capture_default_str();
  auto* f = cmd.add_option("--model-file", model_file, "Model definition in YAML (see models/)");
  m->excludes(f);
  f->excludes(m);
  cmd.add_option("--resolution", resolution, "Input resolution (default: the model's)");
  cmd.add_option("--classes", classes, "Number of classes (default: the model's)");
}

blueprint::BluePrint ModelOptions::load() const {
  if (!model_file.empty()) return blueprint::load_blueprint_file(model_file);
  blueprint::ZooOptions z;
  z.num_classes = classes;
  return blueprint::zoo_model(model, z);
}

}  // namespace renaissance::app
