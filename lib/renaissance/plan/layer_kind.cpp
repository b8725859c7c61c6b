#include <renaissance/core/error.h>
#include <renaissance/plan/layer_kind.h>

#include <array>

namespace renaissance::plan {

namespace {
constexpr const char* kNames[] = {
#define RN_LK_STR(name) #name,
    RN_LAYER_KINDS(RN_LK_STR)
#undef RN_LK_STR
};
constexpr int kCount = sizeof(kNames) / sizeof(kNames[0]);
}  // namespace

const char* layer_kind_name(LayerKind k) {
  int i = static_cast<int>(k);
  return (i >= 0 && i < kCount) ? kNames[i] : "?";
}

LayerKind layer_kind_from_name(const std::string& s) {
  std::string known;
  for (int i = 0; i < kCount; ++i) {
    if (s == kNames[i]) return static_cast<LayerKind>(i);
    known += (i ? ", " : "") + std::string(kNames[i]);
  }
  RN_FAIL("unknown layer kind '{}' (known: {})", s, known);
}

std::vector<LayerKind> all_layer_kinds() {
  std::vector<LayerKind> v;
  for (int i = 0; i < kCount; ++i) v.push_back(static_cast<LayerKind>(i));
  return v;
}

bool is_fused(LayerKind k) {
  switch (k) {
    case LayerKind::CBR:
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection:
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection:
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity:
    case LayerKind::GapFC: return true;
    default: return false;
  }
}

bool is_add2_marker(LayerKind k) {
  return k == LayerKind::Add2Start || k == LayerKind::Add2ShortcutEnd || k == LayerKind::Add2End;
}

bool is_bn(LayerKind k) { return k == LayerKind::Bn || k == LayerKind::Bn2d || k == LayerKind::Bn1d; }

bool has_conv_weight(LayerKind k) {
  switch (k) {
    case LayerKind::Conv:
    case LayerKind::CBR:
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection:
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection:
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity: return true;
    default: return false;
  }
}

bool layer_activation(LayerKind k, ops::Activation* out) {
  switch (k) {
#define RN_LK_ACT_CASE(F, P, key) \
  case LayerKind::F: *out = ops::Activation::F; return true;
    RN_ACTIVATIONS(RN_LK_ACT_CASE)
#undef RN_LK_ACT_CASE
    default: return false;
  }
}

LayerKind activation_layer_kind(ops::Activation a) {
  switch (a) {
#define RN_LK_ACT_CASE(F, P, key) \
  case ops::Activation::F: return LayerKind::F;
    RN_ACTIVATIONS(RN_LK_ACT_CASE)
#undef RN_LK_ACT_CASE
  }
  RN_FAIL("internal: unknown activation {}", static_cast<int>(a));
}

}  // namespace renaissance::plan
