// What the compiler is asked to plan: the training configuration and the six variants derived from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::plan {

enum class OptimizerKind : std::uint8_t { SGD, MOMENTUM, NESTEROV, ADAM, ADAMW, LARS };
const char* optimizer_name(OptimizerKind k);
OptimizerKind optimizer_from_name(const std::string& s);  ///< "sgd", "momentum", ... ; throws listing them
bool optimizer_has_m(OptimizerKind k);  ///< momentum/Nesterov/Adam/AdamW/LARS
bool optimizer_has_v(OptimizerKind k);  ///< Adam/AdamW
bool optimizer_has_n(OptimizerKind k);  ///< LARS

/// One variant's shape parameters (DESIGN §4).
struct CompileSpec {
  bool amp_enabled = false;
  std::int64_t max_sample_resolution = 0;
  std::int64_t actual_resolution = 0;
  std::int64_t batch_size = 0;
  std::int64_t num_color_channels = 0;
  bool freeze_first_layer = false;
  friend bool operator==(const CompileSpec& a, const CompileSpec& b) {
    return a.amp_enabled == b.amp_enabled && a.max_sample_resolution == b.max_sample_resolution &&
           a.actual_resolution == b.actual_resolution && a.batch_size == b.batch_size &&
           a.num_color_channels == b.num_color_channels && a.freeze_first_layer == b.freeze_first_layer;
  }
};

enum class Variant : std::uint8_t { TRAIN_BASE, TRAIN_LAST, TRAIN_LOWRES, TRAIN_LOWRES_LAST, VAL_BASE, VAL_LAST };
constexpr int kVariants = 6;
const char* variant_name(Variant v);  ///< "train_base", ...
constexpr bool is_train_variant(Variant v) { return static_cast<int>(v) < 4; }

/// The training configuration the variants come from.
struct TrainConfig {
  std::int64_t dataset_size = 60000;
  std::int64_t batch = 256;
  std::int64_t start_resolution = 0;  ///< progressive resize starts here; 0 = end_resolution
  std::int64_t end_resolution = 0;    ///< 0 = the model's resolution
  std::int64_t val_size = 10000;
  std::int64_t val_batch = 0;  ///< 0 = batch
  OptimizerKind optimizer = OptimizerKind::MOMENTUM;
  bool ema = false;
  bool amp = false;
  bool freeze_first_layer = false;
  /// Liveness-based reuse of the activation pool (features and gradient buffers share bytes when their lifetimes
  /// are disjoint). Off: every pool tensor has bytes of its own and the gradients use <= 4 fixed slots.
  bool reuse_memory = true;
  /// The compiler's fusion phase (plan/fusion.h): fused layers get fused passes. Off (`--fused-kernels off`): every
  /// fused layer runs its plain parts one by one.
  bool fuse_kernels = true;
  /// AMP plans: where a residual branch joins in the backward pass inside fused layers, the data gradient of the branch
  /// that comes second (a block's first conv, or its projection shortcut's conv) writes a buffer of its own (beta = 0,
  /// the faster convolution) and the sum moves into the node that consumes the gradient (an ACCUMULATE before the
  /// previous block's end ReLU backward, fused into ADD_RELU_BWD). Off: that dgrad adds into the gradient (beta = 1).
  bool fold_residual_sums = true;
  /// With fold_residual_sums: where the BN whose output fed the residual sum has its backward right after the end
  /// ReLU's, the sum's gradient is formed inside that BN backward's statistics pass (ADD_RELU_BN_BWD, one memory pass
  /// fewer per block end) instead of by an ADD_RELU_BWD pass of its own. Same bits either way.
  bool fuse_residual_bn_backward = true;
  /// With fuse_residual_bn_backward: a projection block's shortcut BN backward, which reads the same gradient, joins
  /// that pass (ADD_RELU_BN_BN_BWD: its statistics in the same pass, one apply pass writing both data gradients, two
  /// passes over the gradient fewer). Same bits either way.
  bool fuse_shortcut_bn_backward = true;
  /// AMP plans with fused passes: a residual block's end (BN_ADD_RELU / BN_BN_ADD_RELU, training) also writes its ReLU's
  /// sign as a 1-bit mask into S_MASK, and the ADD_RELU_BN_BWD pass of that ReLU reads the mask instead of the FP16
  /// output (1/16 of the bytes, one memory pass fewer there: plan/fusion.h, plan_relu_masks). Same bits either way.
  bool relu_masks = true;
  /// Activation recomputation (plan/recompute.h, `--recompute bn-relu`): the output of each training BN → ReLU pair
  /// that the backward pass reads (the next convolution's weight gradient, the ReLU's own backward) is not kept from
  /// the forward pass; one BN-apply + ReLU pass re-forms it from the BN's input and saved statistics right before its
  /// first backward reader, bit for bit. Trades one element-wise pass per such value for its bytes at the peak.
  bool recompute_bn_relu = false;
  /// With recompute_bn_relu: the arena (bytes) to stay within by recomputing as few values as that takes, in forward
  /// order (the largest activations come first in the networks it is for); 0: recompute every value it can. The
  /// compiler searches for the count and records it in recompute_limit; a plan that cannot get within the budget
  /// recomputes everything.
  std::int64_t recompute_budget_bytes = 0;
  /// With recompute_bn_relu: recompute the first this many values (forward order; the first layer's A/B twins count
  /// once) and keep the rest; -1: all. compile() sets it to the number the plan recomputes.
  std::int32_t recompute_limit = -1;
  friend bool operator==(const TrainConfig& a, const TrainConfig& b) {
    return a.dataset_size == b.dataset_size && a.batch == b.batch && a.start_resolution == b.start_resolution &&
           a.end_resolution == b.end_resolution && a.val_size == b.val_size && a.val_batch == b.val_batch &&
           a.optimizer == b.optimizer && a.ema == b.ema && a.amp == b.amp &&
           a.freeze_first_layer == b.freeze_first_layer && a.reuse_memory == b.reuse_memory &&
           a.fuse_kernels == b.fuse_kernels && a.fold_residual_sums == b.fold_residual_sums &&
           a.fuse_residual_bn_backward == b.fuse_residual_bn_backward && a.relu_masks == b.relu_masks &&
           a.fuse_shortcut_bn_backward == b.fuse_shortcut_bn_backward &&
           a.recompute_bn_relu == b.recompute_bn_relu &&
           a.recompute_budget_bytes == b.recompute_budget_bytes && a.recompute_limit == b.recompute_limit;
  }
};

/// The six specs, in Variant order. `model_resolution` fills end_resolution = 0; channels = data buffer channels.
std::vector<CompileSpec> derive_variant_specs(const TrainConfig& cfg, std::int64_t model_resolution,
                                              std::int64_t channels);

}  // namespace renaissance::plan
