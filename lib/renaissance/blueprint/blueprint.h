// BluePrint: what a model looks like, as a tree of layers (DESIGN §2). The DSL knows nothing
// of the IR: ArchPlan::from_blueprint turns this tree into the flat plan.
#pragma once

#include <renaissance/ops/activations.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::blueprint {

enum class NodeKind : std::uint8_t {
  Seq, Repeat, Conv, Bn, Relu, Tanh, Identity, Cbr, MaxPool, Gap, Flatten, Fc, GapFc, Add2, Block, SoftmaxCE,
#define RN_BP_ACT_ENUM(F, P, key) F,
  RN_ACTIVATIONS(RN_BP_ACT_ENUM)  // ops/activations.h
#undef RN_BP_ACT_ENUM
};
/// The activation of an activation kind (ops/activations.h); false for the other kinds.
bool node_activation(NodeKind k, ops::Activation* out);
const char* node_kind_name(NodeKind k);  ///< the YAML key: "seq", "conv", "softmax_ce", ...

enum class BlockKind : std::uint8_t {
  RESNET_1_3_1,       ///< bottleneck: 1×1 mid, 3×3 mid (stride), 1×1 out; projection when shape changes
  RESNET_3_3,         ///< basic block: 3×3 out (stride), 3×3 out; projection when shape changes
  MBV2_INV_RESIDUAL,  ///< 1×1 expand to mid, 3×3 depthwise (stride), 1×1 project to out; identity when shape kept
};
const char* block_kind_name(BlockKind k);
BlockKind block_kind_from_name(const std::string& s);  ///< throws Error listing the kinds

/// groups value meaning "depthwise": groups = in_c = out_c, resolved at shape inference.
constexpr std::int64_t kDepthwise = -1;

/// One node of the tree. Fields not used by a kind keep their defaults.
struct Layer {
  NodeKind kind = NodeKind::Seq;
  std::string name;  ///< optional user-given name; the planner names the rest

  std::int64_t out_c = 0;   ///< conv/cbr/fc/gap_fc/block: output channels (conv: 0 with depthwise = in_c)
  std::int64_t mid_c = 0;   ///< block: middle channels (bottleneck width, MBV2 expansion channels)
  std::int64_t k = 0;       ///< conv/cbr/maxpool kernel size (square)
  std::int64_t stride = 1;  ///< conv/cbr/maxpool/block stride
  std::int64_t pad = 0;     ///< conv/cbr/maxpool zero padding (each side)
  std::int64_t groups = 1;  ///< conv groups; kDepthwise for depthwise
  bool bias = false;        ///< conv: learnable bias (VGG); fc always has one
  std::int64_t count = 0;   ///< repeat: number of copies; softmax_ce: number of classes
  BlockKind block = BlockKind::RESNET_3_3;
  std::vector<Layer> children;  ///< seq: the sequence; repeat: one child; add2: {main, shortcut}

  Layer& named(std::string n) & { name = std::move(n); return *this; }
  Layer&& named(std::string n) && { name = std::move(n); return std::move(*this); }

  friend bool operator==(const Layer& a, const Layer& b);
  friend bool operator!=(const Layer& a, const Layer& b) { return !(a == b); }
};

/// A model: the layer tree and the input it expects (per sample, HWC).
struct BluePrint {
  std::string name;
  std::int64_t in_h = 0, in_w = 0, in_c = 0;
  Layer root;

  friend bool operator==(const BluePrint& a, const BluePrint& b) {
    return a.name == b.name && a.in_h == b.in_h && a.in_w == b.in_w && a.in_c == b.in_c && a.root == b.root;
  }
};

/// Why an input of H x W x C cannot be planned and trained, or empty: the compiler plans every variant at one
/// resolution, H x H (a model for 20x36 images was planned and trained as 20x20), and the input pipeline normalises
/// at most kMaxImageChannels channels (17 failed only after the trainer's start-up). The YAML reader says it with
/// the file and line, ArchPlan::from_blueprint for any BluePrint.
std::string input_shape_problem(std::int64_t h, std::int64_t w, std::int64_t c);

// ---- DSL factories (DESIGN §2) ----------------------------------------------------------------
Layer seq(std::vector<Layer> layers);
template <typename... L>
Layer seq(L&&... layers) {
  std::vector<Layer> v;
  v.reserve(sizeof...(L));
  (v.push_back(std::forward<L>(layers)), ...);
  return seq(std::move(v));
}
Layer repeat(std::int64_t n, Layer layer);
Layer conv(std::int64_t out_c, std::int64_t k, std::int64_t stride = 1, std::int64_t pad = 0, std::int64_t groups = 1,
           bool bias = false);
Layer dwconv(std::int64_t k, std::int64_t stride = 1, std::int64_t pad = 0);  ///< depthwise conv
Layer bn();
Layer relu();
Layer tanh();
Layer identity();
Layer cbr(std::int64_t out_c, std::int64_t k, std::int64_t stride = 1, std::int64_t pad = 0);  ///< conv+bn+relu
Layer maxpool(std::int64_t k, std::int64_t stride, std::int64_t pad = 0);
Layer gap();
Layer flatten();
Layer fc(std::int64_t n);
Layer gap_fc(std::int64_t n);
Layer add2(Layer main, Layer shortcut);  ///< y = main(x) + shortcut(x); an empty seq() shortcut is identity
Layer block(std::int64_t mid_c, std::int64_t out_c, BlockKind kind, std::int64_t stride = 1);
Layer softmax_ce(std::int64_t num_classes);
// The activations of ops/activations.h: silu(), ...
#define RN_BP_ACT_FACTORY(F, P, key) Layer key();
RN_ACTIVATIONS(RN_BP_ACT_FACTORY)
#undef RN_BP_ACT_FACTORY

}  // namespace renaissance::blueprint
