// LayerKind: the vocabulary of the IR, plain and fused (DESIGN §3).
#pragma once

#include <renaissance/ops/activations.h>

#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::plan {

#define RN_LAYER_KINDS(X)                                                                          \
  /* plain */                                                                                      \
  X(Conv) X(Bn2d) X(Bn1d) X(Relu) X(Tanh) X(Identity) X(MaxPool) X(Gap) X(Flatten) X(Fc)           \
  X(SoftmaxCE) X(ChannelPadding) X(Add2Start) X(Add2ShortcutEnd) X(Add2End)                        \
  /* fused (AMP) */                                                                                \
  X(CBR) X(BottleneckIdentity) X(BottleneckProjection) X(BasicBlockIdentity) X(BasicBlockProjection) \
  X(InvResidualNoShortcut) X(InvResidualIdentity) X(GapFC)                                         \
  /* transient: a BN before rename_bn decides 1d or 2d */                                          \
  X(Bn)                                                                                            \
  /* the activations of ops/activations.h */                                                       \
  RN_ACTIVATION_LAYER_KINDS(X)

enum class LayerKind : std::uint8_t {
#define RN_LK_ENUM(name) name,
  RN_LAYER_KINDS(RN_LK_ENUM)
#undef RN_LK_ENUM
};

const char* layer_kind_name(LayerKind k);
/// Throws Error listing the known kinds.
LayerKind layer_kind_from_name(const std::string& s);
std::vector<LayerKind> all_layer_kinds();

bool is_fused(LayerKind k);
bool is_add2_marker(LayerKind k);
bool is_bn(LayerKind k);
/// Kinds whose main weight is a convolution (candidates for the *_FIRST_CONV regions).
bool has_conv_weight(LayerKind k);
/// The activation of an activation kind (ops/activations.h); false for the other kinds.
bool layer_activation(LayerKind k, ops::Activation* out);
LayerKind activation_layer_kind(ops::Activation a);

}  // namespace renaissance::plan
