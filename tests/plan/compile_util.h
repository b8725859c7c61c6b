// Compiling zoo and hand-written models for the compiler/graph tests.
#pragma once

#include "plan_test_util.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/plan/compiler.h>

#include <functional>

namespace plan_test {

using renaissance::Region;
using renaissance::TensorId;
using rp::OptimizerKind;

struct Cfg {
  std::string model = "fmnist_cnn";
  bool amp = false;
  bool fuse = false;
  OptimizerKind opt = OptimizerKind::MOMENTUM;
  bool ema = false;
  std::int64_t batch = 32;
  std::int64_t dataset = 1000;
  std::int64_t val = 300;
  std::int64_t start_res = 0;
  bool freeze_first = false;
  std::int64_t resolution = 0;  ///< 0 = the model's
  bool reuse = true;            ///< liveness-based reuse of the activation pool
  bool recompute = false;       ///< TrainConfig::recompute_bn_relu
};

inline rb::BluePrint load_model(const std::string& name) {
  if (name.size() > 5 && name.substr(name.size() - 5) == ".yaml")
    return rb::load_blueprint_file(std::string(RENAISSANCE_SOURCE_DIR) + "/models/" + name);
  return rb::zoo_model(name);
}

inline rp::ArchPlan arch_of(const Cfg& c) {
  rp::BuildOptions o;
  o.amp = c.amp;
  o.fuse = c.fuse;
  o.resolution = c.resolution;
  return rp::ArchPlan::build(load_model(c.model), o);
}

inline rp::TrainConfig train_config(const Cfg& c) {
  rp::TrainConfig t;
  t.dataset_size = c.dataset;
  t.batch = c.batch;
  t.val_size = c.val;
  t.start_resolution = c.start_res;
  t.optimizer = c.opt;
  t.ema = c.ema;
  t.amp = c.amp;
  t.freeze_first_layer = c.freeze_first;
  t.reuse_memory = c.reuse;
  t.recompute_bn_relu = c.recompute;
  return t;
}

inline rp::CompiledPlan compile(const Cfg& c) { return rp::Compiler::compile(arch_of(c), train_config(c)); }

/// Visits every node of a bucket, FUSED_* wrappers first and then their sub-nodes (depth first).
inline void visit(const std::vector<rp::Node>& nodes, const std::function<void(const rp::Node&)>& fn) {
  for (const rp::Node& n : nodes) {
    fn(n);
    visit(n.sub, fn);
  }
}

/// The plain nodes in execution order: FUSED_* wrappers replaced by their sub-nodes.
inline std::vector<const rp::Node*> flat(const std::vector<rp::Node>& nodes) {
  std::vector<const rp::Node*> out;
  std::function<void(const std::vector<rp::Node>&)> rec = [&](const std::vector<rp::Node>& v) {
    for (const rp::Node& n : v) {
      if (n.sub.empty())
        out.push_back(&n);
      else
        rec(n.sub);
    }
  };
  rec(nodes);
  return out;
}

}  // namespace plan_test
