#include "model_options.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/comm/communicator.h>
#include <renaissance/comm/mpi_session.h>
#include <renaissance/comm/watchdog.h>
#include <renaissance/core/error.h>
#include <renaissance/io/dataset.h>
#include <renaissance/runtime/devices.h>

#include <fmt/format.h>

#include <cstdlib>
#include <functional>
#include <vector>

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
  // The datasets' limit (a dataset, bench's synthetic batch among them, has at most that many classes).
  RN_CHECK(classes >= 0 && classes <= io::kMaxClasses, "--classes must be in [1, {}], got {}", io::kMaxClasses,
           classes);
  // A negative value was ignored with --model-file (the file's size trained) and refused with --model.
  RN_CHECK(resolution >= 0, "--resolution must be a size > 0 (left out: the model's), got {}", resolution);
  if (!model_file.empty()) {
    blueprint::BluePrint bp = blueprint::load_blueprint_file(model_file);
    if (resolution > 0) bp.in_h = bp.in_w = resolution;  // a shape that does not fit is an error naming the layer
    if (classes > 0) {
      // As `plan` applies it: the loss of a file without one; a file's own softmax_ce must agree (its last layer is
      // built for its classes). train, eval and predict ignored --classes here.
      std::vector<std::int64_t> found;
      std::function<void(const blueprint::Layer&)> walk = [&](const blueprint::Layer& l) {
        if (l.kind == blueprint::NodeKind::SoftmaxCE) found.push_back(l.count);
        for (const blueprint::Layer& c : l.children) walk(c);
      };
      walk(bp.root);
      for (const std::int64_t k : found)
        RN_CHECK_CTX(k == classes, model_file,
                     "--classes {}: the model file's softmax_ce has {} classes (its last layer is built for them); "
                     "leave --classes out or edit the file",
                     classes, k);
      if (found.empty()) bp.root = blueprint::seq(bp.root, blueprint::softmax_ce(classes));
    }
    return bp;
  }
  blueprint::ZooOptions z;
  z.num_classes = classes;
  z.resolution = resolution;  // train/eval/predict build from the blueprint: --resolution must reach it
  return blueprint::zoo_model(model, z);
}

bool is_root_rank() {
  const comm::MpiSession* s = comm::MpiSession::current();
  return !s || s->is_root();
}

void barrier(runtime::Communicator* comm) {
  if (comm) comm->agree_max(0);
}

void add_comm_timeout_option(CLI::App& cmd, double& seconds) {
  seconds = comm::comm_timeout_from_env(comm::kDefaultCommTimeout);
  cmd.add_option("--comm-timeout", seconds,
                 "Data-parallel runs: seconds a collective may wait for the other ranks before the job is aborted "
                 "(default: RENAISSANCE_COMM_TIMEOUT or 300)")
      ->capture_default_str();
}

runtime::Backend pick_backend(const std::string& device) {
  RN_CHECK(device == "cpu" || device == "cuda" || device == "auto", "--device must be cpu, cuda or auto, got '{}'",
           device);
  if (runtime::have_cuda_backend()) {
    if (device == "cuda" || (device == "auto" && runtime::cuda_device_count() > 0)) {
      RN_CHECK(runtime::cuda_device_count() > 0, "--device cuda: no CUDA device is visible");
      return runtime::Backend::CUDA;
    }
  } else {
    RN_CHECK(device != "cuda", "--device cuda: this build has no CUDA backend (configure with -DRENAISSANCE_CUDA=ON)");
  }
  return runtime::Backend::CPU;
}

void add_val_resize_option(CLI::App& cmd, std::int64_t& val_resize) {
  cmd.add_option("--val-resize", val_resize,
                 "Images not of the model's size: short side to this, then the centre crop (0: size/0.875; left out: "
                 "the value the weights or checkpoint record, as train's --val-resize validated them)")
      ->check(CLI::Range(std::int64_t(0), std::int64_t(65535)));
}

std::int64_t scoring_val_resize(std::int64_t given, const runtime::InitialState& file) {
  if (given >= 0) return given;
  return file.val_resize > 0 ? file.val_resize : 0;
}

}  // namespace renaissance::app
