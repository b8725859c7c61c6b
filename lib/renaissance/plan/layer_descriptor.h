// LayerDescriptor: one immutable entry per LayerKind in a central registry (DESIGN §4).
// Adding a layer kind = one file in plan/layers/ + one registry line + its kernels + one test.
#pragma once

#include <renaissance/core/dtensor.h>
#include <renaissance/plan/arch_plan.h>
#include <renaissance/plan/computation_graph.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace renaissance::plan {

/// A non-parameter tensor of a layer: output feature, saved statistics, temporaries.
struct TensorDesc {
  std::string name;  ///< local name ("y", "invstd"); the plan name is "<layer>.<name>"
  Shape shape;
  DType dtype = DType::F32;
  Region region = Region::DEFAULT;
};
/// A learnable tensor; the compiler expands it into W/G (+A/G16, E/E16, M, V, N as configured).
struct ParamDesc {
  std::string name;  ///< "w", "b", "gamma", "beta"
  Shape shape;
  ParamKind kind = ParamKind::DEEP_CONV;
};
struct LayerTensors {
  std::vector<ParamDesc> params;
  std::vector<TensorDesc> tensors;
};

struct InferContext {
  bool amp = false;
  DType act = DType::F32;  ///< activation dtype: F16 under AMP
  bool first_layer = false;
};

/// Ids of every tensor a parameter expands into (kNoTensor where the configuration has none).
struct ParamIds {
  ParamKind kind = ParamKind::DEEP_CONV;
  TensorId master = kNoTensor, grad = kNoTensor, compute = kNoTensor, grad16 = kNoTensor;
  TensorId ema = kNoTensor, ema16 = kNoTensor, m = kNoTensor, v = kNoTensor, norm = kNoTensor;
  /// The weight a kernel reads: FP16 copy under AMP for the castable kinds, EMA copies for EMA inference.
  TensorId read(bool amp, bool ema_weights) const;
  /// Where the weight gradient goes: the FP16 gradient under AMP for the castable kinds.
  TensorId grad_target(bool amp) const;
};

/// What the compiler hands a descriptor's builders: resolved ids, never shapes.
struct LayerIds {
  TensorId x = kNoTensor;   ///< input feature (the data buffer for the first layer)
  TensorId x2 = kNoTensor;  ///< Add2End: the shortcut branch's output
  TensorId y = kNoTensor;   ///< output feature (== x for pass-through kinds)
  std::map<std::string, TensorId> t;
  std::map<std::string, ParamIds> p;
  // baseline tensors some layers read
  TensorId labels = kNoTensor, hyper = kNoTensor, loss_scale = kNoTensor, result = kNoTensor;

  TensorId tensor(const std::string& name) const;
  const ParamIds& param(const std::string& name) const;
  bool has_param(const std::string& name) const { return p.count(name) > 0; }
};

struct BuildFlags {
  bool amp = false;
  bool ema_weights = false;  ///< inference on the EMA weights
};

struct LayerDescriptor {
  LayerKind kind = LayerKind::Identity;
  /// The union of tensors needed by train forward/backward and inference, for one variant's shapes.
  std::function<LayerTensors(const ArchLayer& l, const Shape& in, const Shape& out, const InferContext& ctx)>
      infer_tensors;
  std::function<std::vector<Node>(const ArchLayer& l, const LayerIds& ids, const BuildFlags& f)> build_forward;
  /// dx == kNoTensor: no data gradient wanted (first layer). `accumulate_dx`: add into dx (second consumer).
  /// Weight gradients always accumulate: ZERO_GRAD clears them once per step.
  std::function<std::vector<Node>(const ArchLayer& l, const LayerIds& ids, TensorId dy, TensorId dx,
                                  bool accumulate_dx, const BuildFlags& f)>
      build_backward;
  std::function<std::vector<Node>(const ArchLayer& l, const LayerIds& ids, const BuildFlags& f)> build_inference;
  /// Fused kinds: the plain layers they stand for (names "<fused>.<part>", shapes filled). Plain kinds: empty.
  std::function<std::vector<ArchLayer>(const ArchLayer& l)> decompose;
  bool pass_through = false;  ///< owns no output: y is x (Identity, Add2 start/shortcut markers, SoftmaxCE)
};

class LayerRegistry {
 public:
  static const LayerRegistry& instance();
  void add(LayerDescriptor d);  ///< registering a kind twice is a hard error
  const LayerDescriptor& get(LayerKind k) const;  ///< unknown kind: error listing the registered ones
  bool has(LayerKind k) const { return m_entries.count(k) > 0; }
  std::vector<LayerKind> kinds() const;

 private:
  std::map<LayerKind, LayerDescriptor> m_entries;
};

// Registration functions, one per file in plan/layers/ (static libraries drop self-registering objects).
void register_conv_layers(LayerRegistry& r);
void register_bn_layers(LayerRegistry& r);
void register_elementwise_layers(LayerRegistry& r);
void register_pool_layers(LayerRegistry& r);
void register_fc_layers(LayerRegistry& r);
void register_loss_layers(LayerRegistry& r);
void register_fused_layers(LayerRegistry& r);

/// Helpers shared by descriptors.
/// A layer's output feature "y" in the activation dtype's feature region.
TensorDesc output_feature(const Shape& out, const InferContext& ctx);
Node layer_node(OpKind op, const ArchLayer& l, std::vector<TensorId> in, std::vector<TensorId> out);
/// Expands a fused layer into its plain layers with shapes, recursively (plain layers return themselves).
std::vector<ArchLayer> lower_layer(const ArchLayer& l);

}  // namespace renaissance::plan
