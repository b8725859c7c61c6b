// compute_slot_bytes and strides against hand-computed numbers (DESIGN §5 slot rule).
#include <renaissance/core/dtensor.h>
#include <renaissance/core/error.h>

#include <gtest/gtest.h>

#include <random>

using namespace renaissance;

namespace {
struct SlotCase {
  Shape shape;
  DType dtype;
  Region region;
  std::int64_t channel_align;
  std::int64_t bytes;  // worked out by hand in the comment of each row
};
}  // namespace

TEST(SlotBytes, TableEveryDtypeAndAlignmentCase) {
  const Shape s{1, 10, 10, 3};  // N·H·W = 100
  const Shape odd{2, 3, 5, 3};  // N·H·W = 30
  const std::vector<SlotCase> cases = {
      // FP16 in I_*_DATA: C 3 -> 8; elems 800; 2·800+16 = 1616 -> 1792
      {s, DType::F16, Region::I_A_DATA, 8, 1792},
      {s, DType::F16, Region::I_B_DATA, 8, 1792},
      // FP16 in F_FEATURE_FP16 / F_GRAD_SLOT_FP16: C 3 -> 8; elems 800; 1616 -> 1792
      {s, DType::F16, Region::F_FEATURE_FP16, 8, 1792},
      {s, DType::F16, Region::F_GRAD_SLOT_FP16, 8, 1792},
      // FP16 elsewhere: C stays 3; elems 300; 616 -> 768
      {s, DType::F16, Region::T_TEMP_FP16, 1, 768},
      {s, DType::F16, Region::A_DEEP_CONV, 1, 768},
      {s, DType::F16, Region::G_DEEP_CONV_FP16, 1, 768},
      // INT8 in S_MASK: C 3 -> 8; elems 800; 816 -> 1024
      {s, DType::I8, Region::S_MASK, 8, 1024},
      // INT8 / U8 elsewhere: elems 300; 316 -> 512
      {s, DType::I8, Region::T_TEMP_INT8, 1, 512},
      {s, DType::U8, Region::I_A_DATA, 1, 512},
      {s, DType::U8, Region::S_MASK, 1, 512},
      {s, DType::I8, Region::I_A_DATA, 1, 512},
      // FP32 / INT32: 2 × align256(2·300+16 = 616 -> 768) = 1536, whatever the region
      {s, DType::F32, Region::F_FEATURE_FP32, 1, 1536},
      {s, DType::F32, Region::I_A_DATA, 1, 1536},
      {s, DType::F32, Region::F_FEATURE_FP16, 1, 1536},
      {s, DType::F32, Region::S_MASK, 1, 1536},
      {s, DType::I32, Region::T_TEMP_INT32, 1, 1536},
      {s, DType::I32, Region::I_A_LABEL, 1, 1536},
      // N = 2, 3×5, C = 3: N·H·W = 30
      // FP16 I_A_DATA: 30·8 = 240; 496 -> 512
      {odd, DType::F16, Region::I_A_DATA, 8, 512},
      // FP16 feature: 30·8 = 240; 496 -> 512
      {odd, DType::F16, Region::F_FEATURE_FP16, 8, 512},
      // INT8 mask: 240 + 16 = 256 -> 256 (exactly on the boundary)
      {odd, DType::I8, Region::S_MASK, 8, 256},
      // FP32: 90 elems; 196 -> 256; × 2 = 512
      {odd, DType::F32, Region::F_FEATURE_FP32, 1, 512},
      // Boundaries: 120 FP16 elems = 240 + 16 = 256 -> 256; 121 -> 258 -> 512
      {Shape{1, 1, 1, 120}, DType::F16, Region::T_TEMP_FP16, 1, 256},
      {Shape{1, 1, 1, 121}, DType::F16, Region::T_TEMP_FP16, 1, 512},
      // 240 INT8 + 16 = 256; 241 -> 257 -> 512
      {Shape{1, 1, 1, 240}, DType::I8, Region::T_TEMP_INT8, 1, 256},
      {Shape{1, 1, 1, 241}, DType::U8, Region::T_TEMP_INT8, 1, 512},
      // FP16 feature with C already a multiple of 8: 1·4·4·16 = 256 elems; 528 -> 768
      {Shape{1, 4, 4, 16}, DType::F16, Region::F_FEATURE_FP16, 8, 768},
      // an empty tensor still has its 16 spare bytes: FP16 256, FP32 512
      {Shape{0, 1, 1, 1}, DType::F16, Region::T_TEMP_FP16, 1, 256},
      {Shape{0, 1, 1, 1}, DType::F32, Region::T_TEMP_FP32, 1, 512},
      // ResNet-50 stem output at batch 256, FP16: 256·112·112·64 = 205,520,896 elems;
      // 2·that + 16 = 411,041,808 -> 411,042,048
      {Shape{256, 112, 112, 64}, DType::F16, Region::F_FEATURE_FP16, 8, 411042048},
  };
  for (const SlotCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.shape.str() << " " << dtype_name(c.dtype) << " " << region_name(c.region));
    EXPECT_EQ(channel_alignment(c.dtype, c.region), c.channel_align);
    EXPECT_EQ(compute_slot_bytes(c.shape, c.dtype, c.region), c.bytes);
    EXPECT_EQ(c.bytes % 256, 0);
  }
}

TEST(SlotBytes, ChannelAlignmentEveryDtypeRegionPair) {
  for (int i = 0; i < kNamedRegions; ++i) {
    const Region r = region_at(i);
    for (DType t : {DType::F32, DType::F16, DType::I32, DType::I8, DType::U8}) {
      std::int64_t want = 1;
      if (t == DType::F16 && (r == Region::I_A_DATA || r == Region::I_B_DATA)) want = 8;  // 16 bytes a pixel
      if (t == DType::F16 && (r == Region::F_FEATURE_FP16 || r == Region::F_GRAD_SLOT_FP16)) want = 8;
      if (t == DType::I8 && r == Region::S_MASK) want = 8;
      EXPECT_EQ(channel_alignment(t, r), want) << region_name(r) << " " << dtype_name(t);
    }
  }
}

TEST(SlotBytes, Fp32IsTwiceFp16OverRandomShapes) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<std::int64_t> d(1, 300);
  const Region pairs[][2] = {{Region::W_DEEP_CONV, Region::A_DEEP_CONV},
                             {Region::G_FC_WEIGHT, Region::G_FC_WEIGHT_FP16},
                             {Region::E_FIRST_CONV, Region::E_FIRST_CONV_FP16},
                             {Region::T_TEMP_FP32, Region::T_TEMP_FP16}};
  for (int it = 0; it < 2000; ++it) {
    const Shape s{d(rng) % 9, d(rng), d(rng) % 17 + 1, d(rng)};
    for (const auto& p : pairs) {
      const std::int64_t f32 = compute_slot_bytes(s, DType::F32, p[0]);
      const std::int64_t f16 = compute_slot_bytes(s, DType::F16, p[1]);
      ASSERT_EQ(f32, 2 * f16) << s.str();
      // Independent reference: 2 bytes per FP16 element plus 16 spare, rounded up to 256.
      const std::int64_t e = s.n * s.h * s.w * s.c;
      ASSERT_EQ(f16, (2 * e + 16 + 255) / 256 * 256) << s.str();
      ASSERT_EQ(compute_slot_bytes(s, DType::I32, p[0]), f32);
    }
  }
}

TEST(SlotBytes, NegativeShapeIsAnError) {
  EXPECT_THROW(compute_slot_bytes(Shape{1, -1, 1, 1}, DType::F32, Region::T_TEMP_FP32), Error);
}

TEST(Strides, PaddedVersusCompact) {
  const Shape s{2, 3, 5, 3};
  EXPECT_EQ(compact_strides(s), (Strides{45, 15, 3, 1}));
  EXPECT_EQ(padded_strides(s, 8), (Strides{120, 40, 8, 1}));
  EXPECT_EQ(padded_strides(s, 4), (Strides{60, 20, 4, 1}));
  EXPECT_EQ(padded_strides(Shape{1, 7, 7, 64}, 8), (Strides{3136, 448, 64, 1}));

  const DTensor f = make_dtensor(3, "conv1.y", s, DType::F16, Region::F_FEATURE_FP16);
  EXPECT_EQ(f.cuda_strides, (Strides{120, 40, 8, 1}));
  EXPECT_EQ(f.cpu_strides, (Strides{45, 15, 3, 1}));
  EXPECT_EQ(f.slot_bytes, 512);  // 240 elems -> 496 -> 512
  EXPECT_EQ(f.bytes(), 2 * 90);  // logical bytes, compact
  const DTensor d = make_dtensor(4, "input.a.data", s, DType::F16, Region::I_A_DATA);
  EXPECT_EQ(d.cuda_strides, (Strides{120, 40, 8, 1}));
  const DTensor w = make_dtensor(5, "conv1.w", s, DType::F32, Region::W_DEEP_CONV);
  EXPECT_EQ(w.cuda_strides, w.cpu_strides);
  EXPECT_EQ(w.slot_bytes, 512);
  // min_slot_bytes only ever enlarges a slot
  EXPECT_EQ(make_dtensor(6, "x", s, DType::F32, Region::W_DEEP_CONV, 4096).slot_bytes, 4096);
  EXPECT_EQ(make_dtensor(7, "y", s, DType::F32, Region::W_DEEP_CONV, 256).slot_bytes, 512);
}
