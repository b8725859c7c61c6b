// Layer parameters, each struct with its one field list (DESIGN §12, docs/design.md "adding an op"). The field list
// generates equality, the ArchPlan YAML (plan/arch_yaml.cpp) and the binary plan (plan/serialize.cpp), so a new
// field is one line here. Field types: std::int64_t or bool.
#pragma once

#include <cstdint>
#include <type_traits>
#include <variant>
#include <vector>

namespace renaissance::ops {

/// Calls f(name, field) for every field of `p` (const or not), in the order of P::fields.
template <typename P, typename F>
void for_each_field(P& p, F&& f) {
  std::remove_const_t<P>::fields(p, f);
}

/// The field values in field-list order (bool as 0/1).
template <typename P>
std::vector<std::int64_t> field_values(const P& p) {
  std::vector<std::int64_t> v;
  for_each_field(p, [&v](const char*, const auto& x) { v.push_back(static_cast<std::int64_t>(x)); });
  return v;
}

/// Equality from the field list.
template <typename P>
bool fields_equal(const P& a, const P& b) {
  return field_values(a) == field_values(b);
}

/// Conv / CBR. `groups` is resolved (depthwise → in_c) by shape inference.
struct ConvParams {
  std::int64_t out_c = 0, k = 1, stride = 1, pad = 0, groups = 1;
  bool bias = false;
  /// Channels of the real input when the AMP data buffer pads the first conv's input (3 → 8); 0 = no padding.
  std::int64_t logical_in_c = 0;
  template <typename S, typename F>
  static void fields(S& s, F&& f) {
    f("out_c", s.out_c), f("k", s.k), f("stride", s.stride), f("pad", s.pad), f("groups", s.groups);
    f("bias", s.bias), f("logical_in_c", s.logical_in_c);
  }
  friend bool operator==(const ConvParams& a, const ConvParams& b) { return fields_equal(a, b); }
};

/// MaxPool: a k×k window, stride, implicit −inf padding (at most half the window).
struct PoolParams {
  std::int64_t k = 1, stride = 1, pad = 0;
  template <typename S, typename F>
  static void fields(S& s, F&& f) {
    f("k", s.k), f("stride", s.stride), f("pad", s.pad);
  }
  friend bool operator==(const PoolParams& a, const PoolParams& b) { return fields_equal(a, b); }
};

/// Fc / GapFC (out = output features), SoftmaxCE (out = classes), ChannelPadding (out = padded C).
struct FcParams {
  std::int64_t out = 0;
  template <typename S, typename F>
  static void fields(S& s, F&& f) {
    f("out", s.out);
  }
  friend bool operator==(const FcParams& a, const FcParams& b) { return fields_equal(a, b); }
};

/// The fused residual blocks. Bottleneck: 1×1 in→mid, 3×3 mid→mid (stride), 1×1 mid→out, + post-add ReLU.
/// BasicBlock: 3×3 in→out (stride), 3×3 out→out, + post-add ReLU (mid = out).
/// InvResidual: 1×1 in→mid, 3×3 depthwise (stride), 1×1 mid→out, no activation after the add.
/// Projection shortcuts are 1×1 in→out (stride) + BN.
struct BlockParams {
  std::int64_t mid_c = 0, out_c = 0, stride = 1;
  template <typename S, typename F>
  static void fields(S& s, F&& f) {
    f("mid_c", s.mid_c), f("out_c", s.out_c), f("stride", s.stride);
  }
  friend bool operator==(const BlockParams& a, const BlockParams& b) { return fields_equal(a, b); }
};

struct NoParams {
  template <typename S, typename F>
  static void fields(S&, F&&) {}
  friend bool operator==(const NoParams&, const NoParams&) { return true; }
};

/// The alternatives' order is the binary plan's parameter tag (0 none, 1 conv, 2 pool, 3 fc, 4 block): append only.
using LayerParams = std::variant<NoParams, ConvParams, PoolParams, FcParams, BlockParams>;

}  // namespace renaissance::ops
