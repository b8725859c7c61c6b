// ArchPlan: the flat, shaped, fused layer list that is the planner's IR (DESIGN §3).
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/core/shape.h>
#include <renaissance/ops/params.h>
#include <renaissance/plan/layer_kind.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace renaissance::plan {

// The parameter structs and their field lists: ops/params.h.
using ops::BlockParams;
using ops::ConvParams;
using ops::FcParams;
using ops::LayerParams;
using ops::NoParams;
using ops::PoolParams;

struct ArchLayer {
  LayerKind kind = LayerKind::Identity;
  LayerParams params;
  std::string name;
  Shape in_shape;   ///< per sample (N = 1), at the plan's resolution
  Shape out_shape;
  bool is_first_layer = false;
  /// Where the layer came from in the BluePrint ("layers[3].repeat[1]"), for error messages only:
  /// not part of equality and not serialised.
  std::string origin;

  const ConvParams& conv() const { return std::get<ConvParams>(params); }
  const PoolParams& pool() const { return std::get<PoolParams>(params); }
  const FcParams& fc() const { return std::get<FcParams>(params); }
  const BlockParams& block() const { return std::get<BlockParams>(params); }

  friend bool operator==(const ArchLayer& a, const ArchLayer& b) {
    return a.kind == b.kind && a.params == b.params && a.name == b.name && a.in_shape == b.in_shape &&
           a.out_shape == b.out_shape && a.is_first_layer == b.is_first_layer;
  }
  friend bool operator!=(const ArchLayer& a, const ArchLayer& b) { return !(a == b); }
};

struct BuildOptions {
  bool amp = false;
  bool fuse = false;  ///< residual blocks become fused layers (Conv+BN+ReLU always does: CBR)
  std::int64_t num_classes = 0;  ///< 0: from the model's softmax_ce
  std::int64_t resolution = 0;   ///< 0: the BluePrint's input size
};

class ArchPlan {
 public:
  /// Step 1 only: expands the tree (no shapes yet). Mostly for tests; use build().
  static ArchPlan from_blueprint(const blueprint::BluePrint& bp, const BuildOptions& opts);
  /// All ten steps: the fused, shaped plan.
  static ArchPlan build(const blueprint::BluePrint& bp, const BuildOptions& opts);

  std::string to_yaml() const;
  static ArchPlan from_yaml(const std::string& text, const std::string& source = "<arch plan>");

  std::string model_name;
  Shape input;                ///< per sample (N = 1): the data buffer's shape (AMP: channels padded to 8)
  std::int64_t input_channels = 0;  ///< channels of the real data (before AMP padding)
  std::int64_t num_classes = 0;
  bool amp = false;
  bool fuse = false;
  std::vector<ArchLayer> layers;

  friend bool operator==(const ArchPlan& a, const ArchPlan& b) {
    return a.model_name == b.model_name && a.input == b.input && a.input_channels == b.input_channels &&
           a.num_classes == b.num_classes && a.amp == b.amp && a.fuse == b.fuse && a.layers == b.layers;
  }
  friend bool operator!=(const ArchPlan& a, const ArchPlan& b) { return !(a == b); }

  std::int64_t parameter_count() const;
  /// Forward multiply-accumulates per image at the plan's resolution.
  std::int64_t forward_macs() const;
};

/// Per-layer figures for reports (logical channels: AMP padding excluded).
std::int64_t layer_parameter_count(const ArchLayer& l);
std::int64_t layer_forward_macs(const ArchLayer& l);
/// Output shape of a layer for a given input shape (any N, any resolution); throws Error naming the layer.
Shape infer_out_shape(const ArchLayer& l, const Shape& in);

/// The ten steps, each a separate function so each is tested alone (DESIGN §3).
namespace steps {
using Layers = std::vector<ArchLayer>;
/// 1. Sequential/Repeat/Add2/Block → flat list with Add2 markers; with fuse, block() and cbr() map to fused kinds.
///    Tracks channels so blocks know whether they need a projection/shortcut.
Layers expand_tree(const blueprint::BluePrint& bp, const BuildOptions& opts);
/// 2. Bn → Bn1d after FC/Flatten/GAP, else Bn2d (looking back past ReLU/Tanh/Identity/ChannelPadding).
void rename_bn(Layers& layers);
/// 3. Removes every SoftmaxCE and appends one at the end; returns its number of classes.
std::int64_t place_softmax_ce(Layers& layers, std::int64_t num_classes_override);
/// 4. Every empty Add2 shortcut gets one Identity placeholder.
void insert_identity_placeholders(Layers& layers);
/// 5. Removes every Flatten, then inserts one before FC/SoftmaxCE only where needed (input not (1,1,C), or
///    FC under AMP with C % 8 != 0). Needs shapes; re-infers them.
void normalize_flatten(Layers& layers, const Shape& input, bool amp);
/// 6. NHWC shape inference (N = 1); resolves depthwise groups; checks every layer.
void infer_shapes(Layers& layers, const Shape& input);
/// 7. Add2 regions matching Bottleneck / BasicBlock / InvResidual → fused blocks (fuse only).
void merge_blocks(Layers& layers);
/// 8. Quadruple fusion (Conv+BN+ReLU+MaxPool): deliberately none; kept as a named step.
void quadruple_fusion(Layers& layers);
/// 9. Conv+Bn2d+ReLU → CBR (FP32 and AMP).
void fuse_cbr(Layers& layers);
/// 10a. GAP + FC → GapFC.
void fuse_gap_fc(Layers& layers);
/// 10b. Marks the first layer (its input is the data buffer; its conv weight lives in *_FIRST_CONV).
void mark_first_layer(Layers& layers);
/// AMP: the data buffer's channels are padded to 8 (kAmpInputChannelAlign); the first conv reads the padded input.
Shape pad_first_conv_channels(Layers& layers, const Shape& input);
/// Gives every unnamed layer a stable name "<kind><ordinal>"; checks that names are unique.
void assign_names(Layers& layers);
}  // namespace steps

}  // namespace renaissance::plan
