// The 69 semantic regions of the arena, in address order (DESIGN §5).
#pragma once

#include <cstdint>
#include <string>

namespace renaissance {

// X-macro: the order here IS the address order of the arena. Do not reorder.
#define RN_REGIONS(X)                                                                                                  \
  /* BN statistics */                                                                                                  \
  X(B_PREV_MEAN)                                                                                                       \
  X(B_PREV_VAR) X(B_NEXT_MEAN) X(B_NEXT_VAR) /* FP32 master weights */                                                 \
      X(W_EQ_BIAS) X(W_EQ_SCALE) X(W_BN_BIAS) X(W_BN_WEIGHT) X(W_FC_BIAS) X(W_FC_WEIGHT) X(W_FIRST_CONV)               \
          X(W_DEEP_CONV) /* EMA weights */                                                                             \
      X(E_BN_BIAS) X(E_BN_WEIGHT) X(E_FC_BIAS) X(E_FC_WEIGHT) X(E_FIRST_CONV) X(E_DEEP_CONV) X(E_FC_WEIGHT_FP16)       \
          X(E_FIRST_CONV_FP16) X(E_DEEP_CONV_FP16)  /* FP16 compute weights */                                         \
      X(A_FC_WEIGHT) X(A_FIRST_CONV) X(A_DEEP_CONV) /* FP32 gradients */                                               \
      X(G_BN_BIAS) X(G_BN_WEIGHT) X(G_FC_BIAS) X(G_FC_WEIGHT) X(G_FIRST_CONV) X(G_DEEP_CONV)                           \
          X(R_RESULT)                                              /* FP16 gradients */                                \
      X(G_FC_WEIGHT_FP16) X(G_FIRST_CONV_FP16) X(G_DEEP_CONV_FP16) /* optimizer moments and LARS norms */              \
      X(M_BN_BIAS) X(M_BN_WEIGHT) X(M_FC_BIAS) X(M_FC_WEIGHT) X(M_FIRST_CONV) X(M_DEEP_CONV) X(V_BN_BIAS)              \
          X(V_BN_WEIGHT) X(V_FC_BIAS) X(V_FC_WEIGHT) X(V_FIRST_CONV) X(V_DEEP_CONV) X(N_FC_WEIGHT) X(N_FIRST_CONV)     \
              X(N_DEEP_CONV)                                                      /* double-buffered input */          \
      X(I_A_LABEL) X(I_A_DATA) X(I_B_LABEL) X(I_B_DATA)                           /* activations and gradient slots */ \
      X(F_FEATURE_FP32) X(F_GRAD_SLOT_FP32) X(F_FEATURE_FP16) X(F_GRAD_SLOT_FP16) /* scalars and masks */              \
      X(S_SCALAR_FP32) X(S_SCALAR_FP16) X(S_SCALAR_INT32) X(S_SCALAR_INT8) X(S_MASK) /* temporaries */                 \
      X(T_TEMP_FP32) X(T_TEMP_FP16) X(T_TEMP_INT32) X(T_TEMP_INT8)                   /* results */                     \
      X(R_PREDICTED_LABEL) X(R_RESULT_ACCUMULATED)

enum class Region : std::uint8_t {
#define RN_REGION_ENUM(name) name,
  RN_REGIONS(RN_REGION_ENUM)
#undef RN_REGION_ENUM
      COUNT,  ///< sentinel: the 69th slot
  DEFAULT = B_PREV_MEAN,
};

constexpr int kRegionSlots = static_cast<int>(Region::COUNT) + 1;  // 68 named + sentinel
constexpr int kNamedRegions = static_cast<int>(Region::COUNT);
static_assert(kNamedRegions == 68, "DESIGN §5 lists 68 named regions");

constexpr int region_index(Region r) { return static_cast<int>(r); }
constexpr Region region_at(int i) { return static_cast<Region>(i); }

const char* region_name(Region r);
/// Throws Error listing the known names when `name` is not a region.
Region region_from_name(const std::string& name);

/// An inclusive range of regions [first, last] in address order; RANGE ops span one.
struct RegionRange {
  Region first = Region::DEFAULT;
  Region last = Region::DEFAULT;
  constexpr bool contains(Region r) const {
    return region_index(r) >= region_index(first) && region_index(r) <= region_index(last);
  }
  friend constexpr bool operator==(RegionRange a, RegionRange b) { return a.first == b.first && a.last == b.last; }
  friend constexpr bool operator!=(RegionRange a, RegionRange b) { return !(a == b); }
};
std::string range_name(RegionRange r);

/// Region families used by the planner's checks.
enum class RegionFamily : std::uint8_t { B, W, E, A, G, R, G16, M, V, N, I, F, S, T };
RegionFamily region_family(Region r);
/// The family's letters as in the enum ("B", "W", ..., "G16", ..., "T").
const char* region_family_name(RegionFamily f);

/// Parameter kinds: a weight of kind k lives in W_k, its gradient in G_k, moments in M_k/V_k...
enum class ParamKind : std::uint8_t { BN_BIAS, BN_WEIGHT, FC_BIAS, FC_WEIGHT, FIRST_CONV, DEEP_CONV };
constexpr int kParamKinds = 6;
const char* param_kind_name(ParamKind k);

/// Region of a parameter kind within a family (W, E, G, M, V); A/G16/E16/N exist only for
/// FC_WEIGHT, FIRST_CONV, DEEP_CONV (the FP16-castable kinds). Returns Region::COUNT if none.
Region master_region(ParamKind k);     // W_*
Region ema_region(ParamKind k);        // E_*
Region ema_fp16_region(ParamKind k);   // E_*_FP16
Region compute_region(ParamKind k);    // A_*
Region grad_region(ParamKind k);       // G_*
Region grad_fp16_region(ParamKind k);  // G_*_FP16
Region m_region(ParamKind k);          // M_*
Region v_region(ParamKind k);          // V_*
Region n_region(ParamKind k);          // N_*
constexpr bool has_fp16_twin(ParamKind k) {
  return k == ParamKind::FC_WEIGHT || k == ParamKind::FIRST_CONV || k == ParamKind::DEEP_CONV;
}

}  // namespace renaissance
