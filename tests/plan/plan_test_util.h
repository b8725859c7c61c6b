// Helpers shared by the planner tests.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/core/error.h>
#include <renaissance/plan/arch_plan.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace plan_test {

namespace rb = renaissance::blueprint;
namespace rp = renaissance::plan;
using renaissance::Shape;
using rp::LayerKind;

inline rb::BluePrint model(rb::Layer root, std::int64_t h = 8, std::int64_t c = 3, std::string name = "m") {
  rb::BluePrint bp;
  bp.name = std::move(name);
  bp.in_h = bp.in_w = h;
  bp.in_c = c;
  bp.root = std::move(root);
  return bp;
}

inline std::vector<LayerKind> kinds(const std::vector<rp::ArchLayer>& v) {
  std::vector<LayerKind> k;
  for (const auto& l : v) k.push_back(l.kind);
  return k;
}

inline std::string kind_list(const std::vector<rp::ArchLayer>& v) {
  std::string s;
  for (const auto& l : v) s += std::string(s.empty() ? "" : " ") + rp::layer_kind_name(l.kind);
  return s;
}

/// Runs `fn`, expects a renaissance::Error whose what() contains every fragment.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected a renaissance::Error";
  } catch (const renaissance::Error& e) {
    const std::string what = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' not in: " << what;
  }
}

}  // namespace plan_test
