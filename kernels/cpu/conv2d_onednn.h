// The oneDNN passes of Conv2dPlan (internal to kernels/cpu). Everything oneDNN lives in conv2d_onednn.cpp, so
// builds without oneDNN (the GPU machine) compile the same headers; there every entry point throws.
#pragma once

#include <kernels/cpu/conv2d.h>

#include <memory>
#include <string>

namespace renaissance::cpu {

struct Conv2dPlan::Onednn {
  /// Creates the pass's primitives (one per batch-piece size), their memory descriptors and the weight reorder.
  /// Throws Error when oneDNN offers no implementation for the shapes.
  Onednn(const Shape& xs, const Shape& ys, const Conv2dParams& p, Conv2dPass pass, bool bias);
  ~Onednn();
  /// oneDNN's implementation name (impl_info_str), e.g. "brgconv:avx512_core"; "ref:any" is its slow fallback.
  const std::string& impl() const;
  /// The formats chosen at construction (Conv2dPlan::onednn_layout).
  const OnednnLayout& layout() const;
  /// Weight reorders run so far: one per forward, backward_data and backward_filter call.
  std::int64_t weight_reorders() const;

  void forward(const float* x, const float* w, const float* bias, float* y) const;
  void backward_data(const float* dy, const float* w, float* dx, bool accumulate) const;
  /// dw only (the plan adds db with the deterministic column sums every path uses).
  void backward_filter(const float* x, const float* dy, float* dw, bool accumulate) const;
  /// backward_filter (this) and `data`'s backward_data in one parallel section (Conv2dPlan::backward_filter_and_data).
  void backward_filter_and_data(const float* x, const float* dy, float* dw, bool accumulate_w, const Onednn& data,
                                const float* w, float* dx, bool accumulate_dx) const;

  struct Impl;
  std::unique_ptr<Impl> m;
};

}  // namespace renaissance::cpu
