// Regions: the 68 named regions in DESIGN §5 order, name round trip, parameter-kind mapping.
#include <renaissance/core/error.h>
#include <renaissance/core/region.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace renaissance;

namespace {

// Transcribed by hand from DESIGN §5, in address order.
const std::vector<std::string> kDesignOrder = {
    "B_PREV_MEAN",       "B_PREV_VAR",       "B_NEXT_MEAN",       "B_NEXT_VAR",
    "W_EQ_BIAS",         "W_EQ_SCALE",       "W_BN_BIAS",         "W_BN_WEIGHT",
    "W_FC_BIAS",         "W_FC_WEIGHT",      "W_FIRST_CONV",      "W_DEEP_CONV",
    "E_BN_BIAS",         "E_BN_WEIGHT",      "E_FC_BIAS",         "E_FC_WEIGHT",
    "E_FIRST_CONV",      "E_DEEP_CONV",      "E_FC_WEIGHT_FP16",  "E_FIRST_CONV_FP16",
    "E_DEEP_CONV_FP16",  "A_FC_WEIGHT",      "A_FIRST_CONV",      "A_DEEP_CONV",
    "G_BN_BIAS",         "G_BN_WEIGHT",      "G_FC_BIAS",         "G_FC_WEIGHT",
    "G_FIRST_CONV",      "G_DEEP_CONV",      "R_RESULT",          "G_FC_WEIGHT_FP16",
    "G_FIRST_CONV_FP16", "G_DEEP_CONV_FP16", "M_BN_BIAS",         "M_BN_WEIGHT",
    "M_FC_BIAS",         "M_FC_WEIGHT",      "M_FIRST_CONV",      "M_DEEP_CONV",
    "V_BN_BIAS",         "V_BN_WEIGHT",      "V_FC_BIAS",         "V_FC_WEIGHT",
    "V_FIRST_CONV",      "V_DEEP_CONV",      "N_FC_WEIGHT",       "N_FIRST_CONV",
    "N_DEEP_CONV",       "I_A_LABEL",        "I_A_DATA",          "I_B_LABEL",
    "I_B_DATA",          "F_FEATURE_FP32",   "F_GRAD_SLOT_FP32",  "F_FEATURE_FP16",
    "F_GRAD_SLOT_FP16",  "S_SCALAR_FP32",    "S_SCALAR_FP16",     "S_SCALAR_INT32",
    "S_SCALAR_INT8",     "S_MASK",           "T_TEMP_FP32",       "T_TEMP_FP16",
    "T_TEMP_INT32",      "T_TEMP_INT8",      "R_PREDICTED_LABEL", "R_RESULT_ACCUMULATED",
};

const std::vector<ParamKind> kAllKinds = {ParamKind::BN_BIAS,   ParamKind::BN_WEIGHT,  ParamKind::FC_BIAS,
                                          ParamKind::FC_WEIGHT, ParamKind::FIRST_CONV, ParamKind::DEEP_CONV};

}  // namespace

TEST(Region, SixtyEightNamedRegionsInDesignOrder) {
  ASSERT_EQ(kDesignOrder.size(), 68u);
  EXPECT_EQ(kNamedRegions, 68);
  EXPECT_EQ(kRegionSlots, 69);
  for (int i = 0; i < kNamedRegions; ++i)
    EXPECT_EQ(region_name(region_at(i)), kDesignOrder[static_cast<size_t>(i)]) << i;
}

TEST(Region, SpotChecks) {
  EXPECT_EQ(region_index(Region::B_PREV_MEAN), 0);
  EXPECT_EQ(Region::DEFAULT, Region::B_PREV_MEAN);
  EXPECT_EQ(region_index(Region::R_RESULT), region_index(Region::G_DEEP_CONV) + 1);
  EXPECT_EQ(region_index(Region::R_RESULT_ACCUMULATED), 67);
  EXPECT_EQ(region_index(Region::W_DEEP_CONV), 11);
  EXPECT_EQ(region_index(Region::I_A_LABEL), 49);
  EXPECT_STREQ(region_name(Region::COUNT), "COUNT");
}

TEST(Region, NameRoundTrip) {
  for (int i = 0; i < kNamedRegions; ++i) {
    const Region r = region_at(i);
    EXPECT_EQ(region_from_name(region_name(r)), r);
  }
  try {
    region_from_name("W_DEEP_CONVV");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("W_DEEP_CONVV"), std::string::npos) << e.what();
  }
}

TEST(Region, Families) {
  EXPECT_EQ(region_family(Region::B_NEXT_VAR), RegionFamily::B);
  EXPECT_EQ(region_family(Region::W_EQ_BIAS), RegionFamily::W);
  EXPECT_EQ(region_family(Region::E_DEEP_CONV_FP16), RegionFamily::E);
  EXPECT_EQ(region_family(Region::A_FIRST_CONV), RegionFamily::A);
  EXPECT_EQ(region_family(Region::G_DEEP_CONV), RegionFamily::G);
  EXPECT_EQ(region_family(Region::R_RESULT), RegionFamily::R);
  EXPECT_EQ(region_family(Region::G_FC_WEIGHT_FP16), RegionFamily::G16);
  EXPECT_EQ(region_family(Region::M_BN_BIAS), RegionFamily::M);
  EXPECT_EQ(region_family(Region::V_DEEP_CONV), RegionFamily::V);
  EXPECT_EQ(region_family(Region::N_FIRST_CONV), RegionFamily::N);
  EXPECT_EQ(region_family(Region::I_B_DATA), RegionFamily::I);
  EXPECT_EQ(region_family(Region::F_GRAD_SLOT_FP16), RegionFamily::F);
  EXPECT_EQ(region_family(Region::S_MASK), RegionFamily::S);
  EXPECT_EQ(region_family(Region::T_TEMP_INT8), RegionFamily::T);
  EXPECT_EQ(region_family(Region::R_PREDICTED_LABEL), RegionFamily::R);
  EXPECT_EQ(region_family(Region::R_RESULT_ACCUMULATED), RegionFamily::R);
}

TEST(Region, ParamKindMappingByName) {
  for (ParamKind k : kAllKinds) {
    const std::string n = param_kind_name(k);
    SCOPED_TRACE(n);
    EXPECT_EQ(region_name(master_region(k)), "W_" + n);
    EXPECT_EQ(region_name(ema_region(k)), "E_" + n);
    EXPECT_EQ(region_name(grad_region(k)), "G_" + n);
    EXPECT_EQ(region_name(m_region(k)), "M_" + n);
    EXPECT_EQ(region_name(v_region(k)), "V_" + n);
    const bool twin = k == ParamKind::FC_WEIGHT || k == ParamKind::FIRST_CONV || k == ParamKind::DEEP_CONV;
    EXPECT_EQ(has_fp16_twin(k), twin);
    if (twin) {
      EXPECT_EQ(region_name(compute_region(k)), "A_" + n);
      EXPECT_EQ(region_name(grad_fp16_region(k)), "G_" + n + "_FP16");
      EXPECT_EQ(region_name(ema_fp16_region(k)), "E_" + n + "_FP16");
      EXPECT_EQ(region_name(n_region(k)), "N_" + n);
      EXPECT_EQ(region_family(compute_region(k)), RegionFamily::A);
      EXPECT_EQ(region_family(grad_fp16_region(k)), RegionFamily::G16);
      EXPECT_EQ(region_family(n_region(k)), RegionFamily::N);
    } else {
      EXPECT_EQ(compute_region(k), Region::COUNT);
      EXPECT_EQ(grad_fp16_region(k), Region::COUNT);
      EXPECT_EQ(ema_fp16_region(k), Region::COUNT);
      EXPECT_EQ(n_region(k), Region::COUNT);
    }
    EXPECT_EQ(region_family(master_region(k)), RegionFamily::W);
    EXPECT_EQ(region_family(ema_region(k)), RegionFamily::E);
    EXPECT_EQ(region_family(grad_region(k)), RegionFamily::G);
    EXPECT_EQ(region_family(m_region(k)), RegionFamily::M);
    EXPECT_EQ(region_family(v_region(k)), RegionFamily::V);
  }
}

TEST(Region, RangeContainsAndName) {
  const RegionRange r{Region::G_BN_BIAS, Region::G_FIRST_CONV};
  EXPECT_TRUE(r.contains(Region::G_BN_BIAS));
  EXPECT_TRUE(r.contains(Region::G_FC_WEIGHT));
  EXPECT_TRUE(r.contains(Region::G_FIRST_CONV));
  EXPECT_FALSE(r.contains(Region::G_DEEP_CONV));
  EXPECT_FALSE(r.contains(Region::A_DEEP_CONV));
  EXPECT_EQ(range_name(r), "G_BN_BIAS..G_FIRST_CONV");
  EXPECT_EQ(range_name({Region::R_RESULT, Region::R_RESULT}), "R_RESULT");
}
