// Which depthwise convolutions the own kernels (kernels/cuda/depthwise.h) take: host-only rules, no GPU needed (runs
// in CI with every CUDA build). ConvOp times the kernels only where depthwise_unsupported() is empty; everything
// else stays with cuDNN, so a rule that is too wide would launch a kernel that cannot run the shape.
#include <kernels/cuda/depthwise.h>

#include <gtest/gtest.h>

namespace {

using renaissance::DType;
using renaissance::Shape;
using renaissance::cuda::depthwise_unsupported;
using renaissance::cuda::DepthwiseSpec;

DepthwiseSpec spec(Shape x, std::int64_t out_c, int k, int stride, int pad, DType t = DType::F16) {
  DepthwiseSpec s;
  s.x = x;
  s.y = Shape{x.n, (x.h + 2 * pad - k) / stride + 1, (x.w + 2 * pad - k) / stride + 1, out_c};
  s.kernel_h = s.kernel_w = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  s.dtype = t;
  return s;
}

TEST(DepthwiseRules, MobileNetV2sLayersAreCovered) {
  // MobileNetV2's depthwise layers at batch 256 (FP16 rows padded to 8) and two odd ones.
  for (const auto& [hw, c, stride] : std::vector<std::tuple<int, int, int>>{
           {112, 32, 1}, {112, 96, 2}, {56, 144, 1}, {56, 144, 2}, {28, 192, 2}, {14, 576, 2}, {7, 960, 1}}) {
    DepthwiseSpec s = spec(Shape{256, hw, hw, c}, c, 3, stride, 1);
    EXPECT_EQ(depthwise_unsupported(s), "") << hw << "x" << hw << "x" << c << " s" << stride;
  }
  EXPECT_EQ(depthwise_unsupported(spec(Shape{3, 9, 7, 20}, 20, 5, 2, 2, DType::F32)), "");
  EXPECT_EQ(depthwise_unsupported(spec(Shape{3, 9, 7, 8}, 16, 3, 2, 1)), "") << "multiplier 2";
  DepthwiseSpec padded = spec(Shape{2, 8, 8, 60}, 60, 3, 1, 1);
  padded.x_cs = padded.y_cs = 64;
  EXPECT_EQ(depthwise_unsupported(padded), "");
}

TEST(DepthwiseRules, WhatTheKernelsCannotRunIsRefusedWithAReason) {
  EXPECT_NE(depthwise_unsupported(spec(Shape{2, 8, 8, 16}, 16, 3, 1, 1, DType::U8)).find("dtype"), std::string::npos);
  EXPECT_NE(depthwise_unsupported(spec(Shape{2, 8, 8, 16}, 24, 3, 1, 1)).find("multiple"), std::string::npos);
  DepthwiseSpec narrow = spec(Shape{2, 8, 8, 16}, 16, 3, 1, 1);
  narrow.x_cs = 8;
  EXPECT_NE(depthwise_unsupported(narrow).find("row stride"), std::string::npos);
  // The weights of one channel (taps × multiplier floats) must fit the block's shared memory.
  EXPECT_NE(depthwise_unsupported(spec(Shape{1, 64, 64, 2}, 2 * 512, 7, 1, 3)).find("shared memory"),
            std::string::npos);
  // 32-bit pixel indices.
  EXPECT_NE(depthwise_unsupported(spec(Shape{40000, 224, 224, 8}, 8, 3, 1, 1)).find("32-bit"), std::string::npos);
  DepthwiseSpec bad = spec(Shape{2, 8, 8, 16}, 16, 3, 1, 1);
  bad.stride_h = 0;
  EXPECT_NE(depthwise_unsupported(bad), "");
}

}  // namespace
