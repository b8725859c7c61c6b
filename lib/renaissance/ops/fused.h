// The fused passes, each described once (DESIGN §11, issue 15): which plain parts of a FUSED_* node one pass
// replaces and which tensors it reads, writes and keeps. The compiler decides them (plan/fusion.cpp) and stores them
// in the node (plan::FusedPass), the liveness analysis reads their operands (plan/liveness.cpp), both backends run
// them (runtime/cpu_ops.cpp is the reference, runtime/cuda_fused.cpp), `renaissance plan --nodes` prints them.
#pragma once

#include <cstdint>

namespace renaissance::ops {

/// X(NAME, "label") per fused pass. Append only: the enum is stored in serialised plans.
///   BN_STATS         a training BN's batch statistics alone (the projection shortcut; its apply joins BN_BN_ADD*)
///   BN_RELU          y = relu(BN(x)), one apply pass (y is the BN's and the in-place ReLU's output)
///   BN_ADD           y = BN(x) + s (s: the residual branch as stored)
///   BN_ADD_RELU      y = relu(BN(x) + s)
///   BN_BN_ADD        y = BN(x) + BN'(x') (BN' the projection shortcut's, its output never formed)
///   BN_BN_ADD_RELU   y = relu(BN(x) + BN'(x'))
///   RELU_BN_BWD      the ReLU backward folded into the BN backward: its gradient is never formed, the mask is
///                    recomputed from the BN's input and statistics
///   ADD_RELU_BWD     dx = relu'(y)·(dy + a): the ReLU backward at a residual block's end reads both addends of its
///                    gradient (a: the next block's data gradient, written on its own with beta = 0; the sum is
///                    rounded where the ACCUMULATE it replaces stores it, so the result is the parts' bit for bit)
///   BN_RELU_RECOMPUTE y = relu(BN(x)) with the statistics the forward saved (BN_APPLY → RELU_FWD): a value the
///                    backward reads, formed again instead of kept (TrainConfig::recompute_bn_relu, plan/recompute.h)
///   ADD_RELU_BN_BWD  ADD_RELU_BWD and the backward of the BN whose output fed the residual sum, with the sum's
///                    gradient g = relu'(y)·round(dy + a) formed inside the BN backward's statistics pass (stored
///                    there, since the shortcut reads it too) instead of written by one pass and read back by the
///                    next: one memory pass fewer at every residual block's end, the parts' bits
///   ADD_RELU_BN_BN_BWD ADD_RELU_BN_BWD of a projection block's end with its shortcut BN's backward (which reads the
///                    same g) joined: the statistics pass also sums g·(x' − mean') over the shortcut's input x', one
///                    apply pass reads g once and writes both data gradients (two passes over g fewer); the parts' bits
#define RN_FUSED_KINDS(X)                   \
  X(BN_STATS, "bn-stats")                   \
  X(BN_RELU, "bn+relu")                     \
  X(BN_ADD, "bn+add")                       \
  X(BN_ADD_RELU, "bn+add+relu")             \
  X(BN_BN_ADD, "bn+bn+add")                 \
  X(BN_BN_ADD_RELU, "bn+bn+add+relu")       \
  X(RELU_BN_BWD, "relu+bn backward")        \
  X(ADD_RELU_BWD, "sum+relu backward")      \
  X(BN_RELU_RECOMPUTE, "bn+relu recompute") \
  X(ADD_RELU_BN_BWD, "sum+relu+bn backward") \
  X(ADD_RELU_BN_BN_BWD, "sum+relu+bn+bn backward")

enum class FusedKind : std::uint8_t {
#define RN_FK_ENUM(name, label) name,
  RN_FUSED_KINDS(RN_FK_ENUM)
#undef RN_FK_ENUM
      COUNT
};

inline const char* fused_kind_name(FusedKind k) {
  switch (k) {
#define RN_FK_NAME(name, label) \
  case FusedKind::name: return #name;
    RN_FUSED_KINDS(RN_FK_NAME)
#undef RN_FK_NAME
    case FusedKind::COUNT: break;
  }
  return "?";
}
/// The profiler's label: "FUSED:<label>".
inline const char* fused_kind_label(FusedKind k) {
  switch (k) {
#define RN_FK_LABEL(name, label) \
  case FusedKind::name: return "FUSED:" label;
    RN_FUSED_KINDS(RN_FK_LABEL)
#undef RN_FK_LABEL
    case FusedKind::COUNT: break;
  }
  return "FUSED:?";
}
inline bool fused_has_relu(FusedKind k) {
  return k == FusedKind::BN_RELU || k == FusedKind::BN_ADD_RELU || k == FusedKind::BN_BN_ADD_RELU ||
         k == FusedKind::BN_RELU_RECOMPUTE;
}
inline bool fused_has_shortcut_bn(FusedKind k) { return k == FusedKind::BN_BN_ADD || k == FusedKind::BN_BN_ADD_RELU; }
inline bool fused_is_apply(FusedKind k) {
  return k != FusedKind::BN_STATS && k != FusedKind::RELU_BN_BWD && k != FusedKind::ADD_RELU_BWD &&
         k != FusedKind::ADD_RELU_BN_BWD && k != FusedKind::ADD_RELU_BN_BN_BWD;
}

}  // namespace renaissance::ops
