#include <renaissance/core/error.h>
#include <renaissance/core/region.h>

#include <fmt/format.h>

#include <array>
#include <cstring>

namespace renaissance {

namespace {
constexpr std::array<const char*, kNamedRegions> kNames = {
#define RN_REGION_STR(name) #name,
    RN_REGIONS(RN_REGION_STR)
#undef RN_REGION_STR
};

constexpr std::array<ParamKind, kParamKinds> kKinds = {ParamKind::BN_BIAS,    ParamKind::BN_WEIGHT,
                                                       ParamKind::FC_BIAS,    ParamKind::FC_WEIGHT,
                                                       ParamKind::FIRST_CONV, ParamKind::DEEP_CONV};

Region offset_region(Region base, ParamKind k) { return region_at(region_index(base) + static_cast<int>(k)); }
Region offset_fp16(Region base, ParamKind k) {
  // The FP16 families list FC_WEIGHT, FIRST_CONV, DEEP_CONV only.
  if (!has_fp16_twin(k)) return Region::COUNT;
  return region_at(region_index(base) + static_cast<int>(k) - static_cast<int>(ParamKind::FC_WEIGHT));
}
}  // namespace

const char* region_name(Region r) {
  int i = region_index(r);
  if (i >= 0 && i < kNamedRegions) return kNames[static_cast<std::size_t>(i)];
  return "COUNT";
}

Region region_from_name(const std::string& name) {
  for (int i = 0; i < kNamedRegions; ++i)
    if (name == kNames[static_cast<std::size_t>(i)]) return region_at(i);
  RN_FAIL("unknown region '{}' (known: B_PREV_MEAN ... R_RESULT_ACCUMULATED, {} in all)", name, kNamedRegions);
}

std::string range_name(RegionRange r) {
  if (r.first == r.last) return region_name(r.first);
  return fmt::format("{}..{}", region_name(r.first), region_name(r.last));
}

RegionFamily region_family(Region r) {
  int i = region_index(r);
  auto in = [i](Region a, Region b) { return i >= region_index(a) && i <= region_index(b); };
  if (in(Region::B_PREV_MEAN, Region::B_NEXT_VAR)) return RegionFamily::B;
  if (in(Region::W_EQ_BIAS, Region::W_DEEP_CONV)) return RegionFamily::W;
  if (in(Region::E_BN_BIAS, Region::E_DEEP_CONV_FP16)) return RegionFamily::E;
  if (in(Region::A_FC_WEIGHT, Region::A_DEEP_CONV)) return RegionFamily::A;
  if (in(Region::G_BN_BIAS, Region::G_DEEP_CONV)) return RegionFamily::G;
  if (r == Region::R_RESULT || in(Region::R_PREDICTED_LABEL, Region::R_RESULT_ACCUMULATED)) return RegionFamily::R;
  if (in(Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16)) return RegionFamily::G16;
  if (in(Region::M_BN_BIAS, Region::M_DEEP_CONV)) return RegionFamily::M;
  if (in(Region::V_BN_BIAS, Region::V_DEEP_CONV)) return RegionFamily::V;
  if (in(Region::N_FC_WEIGHT, Region::N_DEEP_CONV)) return RegionFamily::N;
  if (in(Region::I_A_LABEL, Region::I_B_DATA)) return RegionFamily::I;
  if (in(Region::F_FEATURE_FP32, Region::F_GRAD_SLOT_FP16)) return RegionFamily::F;
  if (in(Region::S_SCALAR_FP32, Region::S_MASK)) return RegionFamily::S;
  return RegionFamily::T;
}

const char* region_family_name(RegionFamily f) {
  static const char* const names[] = {"B", "W", "E", "A", "G", "R", "G16", "M", "V", "N", "I", "F", "S", "T"};
  static_assert(sizeof names / sizeof names[0] == static_cast<int>(RegionFamily::T) + 1, "one name per family");
  return names[static_cast<int>(f)];
}

const char* param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::BN_BIAS: return "BN_BIAS";
    case ParamKind::BN_WEIGHT: return "BN_WEIGHT";
    case ParamKind::FC_BIAS: return "FC_BIAS";
    case ParamKind::FC_WEIGHT: return "FC_WEIGHT";
    case ParamKind::FIRST_CONV: return "FIRST_CONV";
    case ParamKind::DEEP_CONV: return "DEEP_CONV";
  }
  return "?";
}

Region master_region(ParamKind k) { return offset_region(Region::W_BN_BIAS, k); }
Region ema_region(ParamKind k) { return offset_region(Region::E_BN_BIAS, k); }
Region grad_region(ParamKind k) { return offset_region(Region::G_BN_BIAS, k); }
Region m_region(ParamKind k) { return offset_region(Region::M_BN_BIAS, k); }
Region v_region(ParamKind k) { return offset_region(Region::V_BN_BIAS, k); }
Region ema_fp16_region(ParamKind k) { return offset_fp16(Region::E_FC_WEIGHT_FP16, k); }
Region compute_region(ParamKind k) { return offset_fp16(Region::A_FC_WEIGHT, k); }
Region grad_fp16_region(ParamKind k) { return offset_fp16(Region::G_FC_WEIGHT_FP16, k); }
Region n_region(ParamKind k) { return offset_fp16(Region::N_FC_WEIGHT, k); }

static_assert(kKinds.size() == 6);

}  // namespace renaissance
