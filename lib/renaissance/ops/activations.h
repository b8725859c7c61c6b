// Element-wise activations, each described once (DESIGN §12, docs/design.md "adding an op"). One line of
// RN_ACTIVATIONS and one functor below are the whole op: the table generates the BluePrint kind and its YAML key
// (blueprint/), the layer kind, the planner's layer descriptor and its forward/backward ops (plan/), and the CPU and
// CUDA kernels with their kernel-table adapters (kernels/, runtime/). Compiled by the host compiler and by nvcc.
//
// A functor holds the forward map y = f(x) and the backward map dx = dy · f'(x). The backward pass reads the layer's
// input x (not y), and the output has the input's shape.
#pragma once

#ifdef __CUDACC__
#define RN_OPS_HD __host__ __device__ __forceinline__
#else
#define RN_OPS_HD inline
#endif

#include <array>
#include <cmath>
#include <cstdint>

namespace renaissance::ops {

/// The table: M(X, Functor, OP_PREFIX, yaml_key) per activation: the functor below, the prefix of its OpKinds
/// (OP_PREFIX_FWD, OP_PREFIX_BWD), the BluePrint YAML key (and the blueprint builder function of that name). Append
/// only: the enums generated from it are stored in serialised plans.
#define RN_ACTIVATION_TABLE(M, X) M(X, Silu, SILU, silu)

/// X(Functor, OP_PREFIX, yaml_key) per activation.
#define RN_ACTIVATIONS(X) RN_ACTIVATION_TABLE(RN_OPS_APPLY_, X)
#define RN_OPS_APPLY_(X, F, P, key) X(F, P, key)
/// X(Functor) per activation: the layer kinds (plan/layer_kind.h).
#define RN_ACTIVATION_LAYER_KINDS(X) RN_ACTIVATION_TABLE(RN_OPS_LAYER_KIND_, X)
#define RN_OPS_LAYER_KIND_(X, F, P, key) X(F)
/// X(OP) twice per activation, forward then backward: the op kinds (plan/computation_graph.h).
#define RN_ACTIVATION_OP_KINDS(X) RN_ACTIVATION_TABLE(RN_OPS_OP_KINDS_, X)
#define RN_OPS_OP_KINDS_(X, F, P, key) X(P##_FWD) X(P##_BWD)

/// SiLU (swish): y = x·σ(x); dy/dx = σ(x)·(1 + x·(1 − σ(x))). σ(x) = 1 / (1 + e^(−x)); for x → −∞, e^(−x) → inf
/// and y → −0 (no NaN): inf in the denominator gives σ = 0.
struct Silu {
  RN_OPS_HD static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
  RN_OPS_HD static float forward(float x) { return x * sigmoid(x); }
  RN_OPS_HD static float backward(float x, float dy) {
    const float s = sigmoid(x);
    return dy * (s * (1.0f + x * (1.0f - s)));
  }
};

/// The activations as values (kernel entry points take one).
enum class Activation : std::uint8_t {
#define RN_OPS_ACT_ENUM(F, P, key) F,
  RN_ACTIVATIONS(RN_OPS_ACT_ENUM)
#undef RN_OPS_ACT_ENUM
};

/// Every activation, in table order.
#define RN_OPS_ACT_ONE(F, P, key) +1
#define RN_OPS_ACT_LIST(F, P, key) Activation::F,
constexpr std::array<Activation, 0 RN_ACTIVATIONS(RN_OPS_ACT_ONE)> kActivations = {{RN_ACTIVATIONS(RN_OPS_ACT_LIST)}};
#undef RN_OPS_ACT_LIST
#undef RN_OPS_ACT_ONE

/// The YAML key of an activation ("silu").
inline const char* activation_name(Activation a) {
  switch (a) {
#define RN_OPS_ACT_NAME(F, P, key) \
  case Activation::F: return #key;
    RN_ACTIVATIONS(RN_OPS_ACT_NAME)
#undef RN_OPS_ACT_NAME
  }
  return "?";
}

/// Calls `f(Functor{})` for activation `a` (the kernels' dispatch).
template <typename Fn>
RN_OPS_HD void visit_activation(Activation a, Fn&& f) {
  switch (a) {
#define RN_OPS_ACT_VISIT(F, P, key) \
  case Activation::F: f(F{}); return;
    RN_ACTIVATIONS(RN_OPS_ACT_VISIT)
#undef RN_OPS_ACT_VISIT
  }
}

}  // namespace renaissance::ops
