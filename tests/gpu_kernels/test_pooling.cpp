// CUDA pooling against kernels/cpu/pooling. Max-pool inputs are small integers, so windows have ties and the
// first-maximum rule is exercised; the maximum itself and the argmax must match exactly, and the backward gather
// adds in the CPU's order, so FP32 dx is compared bit for bit.
#include "gpu_test_util.h"

#include <kernels/cpu/pooling.h>
#include <kernels/cuda/pooling.h>

namespace renaissance::cuda::ktest {
namespace {

class PoolingTest : public GpuTest {};

std::vector<Pool2dParams> pool_params() {
  Pool2dParams a;  // 2x2 stride 2
  Pool2dParams b;
  b.kernel_h = b.kernel_w = 3;
  b.stride_h = b.stride_w = 2;
  b.pad_h = b.pad_w = 1;
  Pool2dParams c;  // overlapping windows
  c.kernel_h = c.kernel_w = 3;
  c.stride_h = c.stride_w = 1;
  c.pad_h = c.pad_w = 1;
  Pool2dParams d;  // rectangular
  d.kernel_h = 2;
  d.kernel_w = 3;
  d.stride_h = 1;
  d.stride_w = 2;
  d.pad_w = 1;
  return {a, b, c, d};
}

cpu::Pool2dParams to_cpu(const Pool2dParams& p) {
  cpu::Pool2dParams c;
  c.kernel_h = p.kernel_h;
  c.kernel_w = p.kernel_w;
  c.stride_h = p.stride_h;
  c.stride_w = p.stride_w;
  c.pad_h = p.pad_h;
  c.pad_w = p.pad_w;
  return c;
}

std::string pool_name(const Pool2dParams& p) {
  return "k" + std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) + "s" + std::to_string(p.stride_h) +
         "x" + std::to_string(p.stride_w) + "p" + std::to_string(p.pad_h) + "x" + std::to_string(p.pad_w);
}

TEST_F(PoolingTest, MaxPoolForwardBackwardMatchCpu) {
  std::uint32_t seed = 1;
  for (const Layout& l : standard_layouts()) {
    for (const Pool2dParams& p : pool_params()) {
      const std::string name = layout_name(l) + " " + pool_name(p);
      const Shape ys = maxpool2d_output_shape(l.shape, p);
      // argmax compact (u8 has no channel alignment) in one case, padded like y in the others: padding gets 255.
      const std::int64_t acs = l.c_stride == l.shape.c ? l.shape.c : l.c_stride;
      DevTensor x(l.shape, l.dtype, l.c_stride), y(ys, l.dtype, l.c_stride);
      DeviceBuffer am(static_cast<std::size_t>(ys.n * ys.h * ys.w * acs));
      const TensorRef am_ref{am.get(), ys, DType::U8, acs};
      const Vec xv = random_ints(x.elems(), seed++, -4, 4);
      x.upload(xv);
      y.poison();
      am.fill_bytes(0x7F);
      maxpool2d_forward(stream, x.ref(), y.ref(), am_ref, p);
      sync();
      Vec yref(static_cast<std::size_t>(ys.elems()));
      std::vector<std::uint8_t> aref(yref.size());
      cpu::maxpool2d_forward(xv.data(), l.shape, yref.data(), ys, to_cpu(p), aref.data());
      expect_bits_equal(y.download(), yref, "maxpool y " + name);
      y.expect_zero_padding("maxpool y " + name);
      const std::vector<std::uint8_t> got = download<std::uint8_t>(am, static_cast<std::size_t>(ys.n * ys.h * ys.w * acs));
      for (std::int64_t r = 0; r < ys.n * ys.h * ys.w; ++r)
        for (std::int64_t c = 0; c < acs; ++c)
          ASSERT_EQ(int{got[r * acs + c]}, c < ys.c ? int{aref[r * ys.c + c]} : 255)
              << "argmax " << name << " row " << r << " channel " << c;

      for (bool acc : {false, true}) {
        DevTensor dy(ys, l.dtype, l.c_stride), dx(l.shape, l.dtype, l.c_stride);
        const Vec dyv = quantized(random_vec(dy.elems(), seed++, -1.0f, 1.0f), l.dtype);
        const Vec dx0 = quantized(random_vec(dx.elems(), seed++, -1.0f, 1.0f), l.dtype);
        dy.upload(dyv);
        if (acc)
          dx.upload(dx0);
        else
          dx.poison();
        maxpool2d_backward(stream, dy.ref(), am_ref, dx.ref(), p, acc);
        sync();
        Vec dref = dx0;
        cpu::maxpool2d_backward(dyv.data(), ys, nullptr, aref.data(), dref.data(), l.shape, to_cpu(p), acc);
        const std::string what = "maxpool dx " + name + (acc ? " acc" : "");
        if (l.dtype == DType::F32)
          expect_bits_equal(dx.download(), dref, what);
        else
          expect_near(dx.download(), dref, tol_for(l.dtype), what);
        dx.expect_zero_padding(what);
      }
    }
  }
}

TEST_F(PoolingTest, GlobalAvgPoolMatchesCpu) {
  std::uint32_t seed = 700;
  std::vector<Layout> layouts = standard_layouts();
  layouts.push_back({Shape{5, 7, 7, 2048}, 2048, DType::F16});
  layouts.push_back({Shape{5, 7, 7, 2048}, 2048, DType::F32});
  for (const Layout& l : layouts) {
    const std::string name = layout_name(l);
    const Shape ys{l.shape.n, 1, 1, l.shape.c};
    // y's stride may differ from x's (its own channel alignment).
    const std::int64_t ycs = l.dtype == DType::F16 ? align_up(l.shape.c, 8) : l.shape.c;
    DevTensor x(l.shape, l.dtype, l.c_stride), y(ys, l.dtype, ycs);
    const Vec xv = quantized(random_vec(x.elems(), seed++, -2.0f, 2.0f), l.dtype);
    x.upload(xv);
    y.poison();
    global_avgpool_forward(stream, x.ref(), y.ref());
    sync();
    Vec yref(static_cast<std::size_t>(ys.elems()));
    cpu::global_avgpool_forward(xv.data(), l.shape, yref.data());
    if (l.dtype == DType::F32)
      expect_bits_equal(y.download(), yref, "gap fwd " + name);  // same FP32 sums in the same order
    else
      expect_near(y.download(), yref, tol_for(l.dtype), "gap fwd " + name);
    y.expect_zero_padding("gap fwd " + name);

    for (bool acc : {false, true}) {
      DevTensor dy(ys, l.dtype, ycs), dx(l.shape, l.dtype, l.c_stride);
      const Vec dyv = quantized(random_vec(dy.elems(), seed++, -1.0f, 1.0f), l.dtype);
      const Vec dx0 = quantized(random_vec(dx.elems(), seed++, -1.0f, 1.0f), l.dtype);
      dy.upload(dyv);
      if (acc)
        dx.upload(dx0);
      else
        dx.poison();
      global_avgpool_backward(stream, dy.ref(), dx.ref(), acc);
      sync();
      Vec dref = dx0;
      cpu::global_avgpool_backward(dyv.data(), dref.data(), l.shape, acc);
      const std::string what = "gap bwd " + name + (acc ? " acc" : "");
      expect_near(dx.download(), dref, tol_for(l.dtype), what);
      dx.expect_zero_padding(what);
    }
  }
}

TEST_F(PoolingTest, RejectsWrongOutputShape) {
  DevTensor x(Shape{2, 8, 8, 4}, DType::F32, 4), y(Shape{2, 3, 3, 4}, DType::F32, 4);
  DeviceBuffer am(2 * 3 * 3 * 4 * 4);
  Pool2dParams p;
  EXPECT_THROW(maxpool2d_forward(stream, x.ref(), y.ref(), TensorRef{am.get(), Shape{2, 3, 3, 4}, DType::U8, 4}, p),
               Error);
  // the argmax is one byte per output (the position in the window), not an i32 index
  DevTensor y4(Shape{2, 4, 4, 4}, DType::F32, 4);
  EXPECT_THROW(maxpool2d_forward(stream, x.ref(), y4.ref(), TensorRef{am.get(), Shape{2, 4, 4, 4}, DType::I32, 4}, p),
               Error);
}

}  // namespace
}  // namespace renaissance::cuda::ktest
