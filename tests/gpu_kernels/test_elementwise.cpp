// CUDA element-wise kernels against kernels/cpu/elementwise: every layout of standard_layouts() (compact and padded
// rows, scalar and vector paths, FP32 and FP16 storage), outputs poisoned first so unwritten padding fails.
#include "gpu_test_util.h"

#include <cstring>

#include <kernels/cpu/elementwise.h>
#include <kernels/cuda/elementwise.h>

namespace renaissance::cuda::ktest {
namespace {

class ElementwiseTest : public GpuTest {};

TEST_F(ElementwiseTest, ReluAndTanhForward) {
  std::uint32_t seed = 1;
  for (const Layout& l : standard_layouts()) {
    const std::string name = layout_name(l);
    DevTensor x(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride);
    const Vec xv = quantized(random_vec(x.elems(), seed++, -2.0f, 2.0f), l.dtype);
    x.upload(xv);
    Vec ref(xv.size());

    y.poison();
    relu_forward(stream, x.ref(), y.ref());
    sync();
    cpu::relu_forward(xv.data(), ref.data(), static_cast<std::int64_t>(xv.size()));
    expect_near(y.download(), ref, tol_for(l.dtype), "relu " + name);
    y.expect_zero_padding("relu " + name);

    y.poison();
    tanh_forward(stream, x.ref(), y.ref());
    sync();
    cpu::tanh_forward(xv.data(), ref.data(), static_cast<std::int64_t>(xv.size()));
    expect_near(y.download(), ref, tol_for(l.dtype), "tanh " + name);
    y.expect_zero_padding("tanh " + name);

    relu_forward(stream, x.ref(), x.ref());  // in place
    sync();
    cpu::relu_forward(xv.data(), ref.data(), static_cast<std::int64_t>(xv.size()));
    expect_near(x.download(), ref, tol_for(l.dtype), "relu in place " + name);
  }
}

TEST_F(ElementwiseTest, ReluAndTanhBackward) {
  std::uint32_t seed = 100;
  for (const Layout& l : standard_layouts()) {
    for (bool acc : {false, true}) {
      const std::string name = layout_name(l) + (acc ? " acc" : "");
      DevTensor y(l.shape, l.dtype, l.c_stride), dy(l.shape, l.dtype, l.c_stride), dx(l.shape, l.dtype, l.c_stride);
      Vec yv = quantized(random_vec(y.elems(), seed++, -1.0f, 1.0f), l.dtype);
      Vec relu_y(yv.size());
      cpu::relu_forward(yv.data(), relu_y.data(), static_cast<std::int64_t>(yv.size()));  // zeros: the kink
      const Vec dyv = quantized(random_vec(dy.elems(), seed++, -1.0f, 1.0f), l.dtype);
      const Vec dx0 = quantized(random_vec(dx.elems(), seed++, -1.0f, 1.0f), l.dtype);
      dy.upload(dyv);

      for (int op = 0; op < 2; ++op) {
        const Vec& yin = op == 0 ? relu_y : yv;
        y.upload(yin);
        if (acc)
          dx.upload(dx0);
        else
          dx.poison();
        Vec ref = dx0;
        if (op == 0) {
          relu_backward(stream, y.ref(), dy.ref(), dx.ref(), acc);
          cpu::relu_backward(yin.data(), dyv.data(), ref.data(), static_cast<std::int64_t>(ref.size()), acc);
        } else {
          tanh_backward(stream, y.ref(), dy.ref(), dx.ref(), acc);
          cpu::tanh_backward(yin.data(), dyv.data(), ref.data(), static_cast<std::int64_t>(ref.size()), acc);
        }
        sync();
        const std::string what = (op == 0 ? "relu_backward " : "tanh_backward ") + name;
        expect_near(dx.download(), ref, tol_for(l.dtype), what);
        dx.expect_zero_padding(what);
      }
    }
  }
}

// The ReLU backward of a residual sum (plan ADD_RELU_BWD) against its parts on the GPU (accumulate, then
// relu_backward: bit for bit, the sum rounded where the accumulate stores it) and against the CPU kernel.
TEST_F(ElementwiseTest, ReluBackwardOfASumEqualsItsParts) {
  std::uint32_t seed = 700;
  for (const Layout& l : standard_layouts()) {
    const std::string name = layout_name(l);
    DevTensor y(l.shape, l.dtype, l.c_stride), dy(l.shape, l.dtype, l.c_stride), a(l.shape, l.dtype, l.c_stride),
        dx(l.shape, l.dtype, l.c_stride), parts(l.shape, l.dtype, l.c_stride);
    Vec yv = quantized(random_vec(y.elems(), seed++, -1.0f, 1.0f), l.dtype);
    Vec relu_y(yv.size());
    cpu::relu_forward(yv.data(), relu_y.data(), static_cast<std::int64_t>(yv.size()));
    const Vec dyv = quantized(random_vec(dy.elems(), seed++, -1.0f, 1.0f), l.dtype);
    const Vec av = quantized(random_vec(a.elems(), seed++, -1.0f, 1.0f), l.dtype);
    y.upload(relu_y);
    dy.upload(dyv);
    a.upload(av);
    dx.poison();
    parts.poison();
    relu_backward_sum(stream, y.ref(), dy.ref(), a.ref(), dx.ref());
    accumulate(stream, a.ref(), dy.ref());  // the parts: dy += a, then the ReLU backward
    relu_backward(stream, y.ref(), dy.ref(), parts.ref(), false);
    sync();
    const Vec got = dx.download(), want = parts.download();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "fused vs parts " << name;
    Vec ref(relu_y.size());
    cpu::relu_backward_sum(relu_y.data(), dyv.data(), av.data(), ref.data(), static_cast<std::int64_t>(ref.size()),
                           l.dtype == DType::F16);
    expect_near(got, ref, tol_for(l.dtype), "relu_backward_sum vs CPU " + name);
    dx.expect_zero_padding("relu_backward_sum " + name);
  }
}

// The activations of ops/activations.h (one functor, both backends) against the CPU kernel, which
// tests/kernels_cpu checks against a double reference and central differences.
TEST_F(ElementwiseTest, ActivationsForwardAndBackward) {
  std::uint32_t seed = 300;
  for (const ops::Activation a : ops::kActivations) {
    for (const Layout& l : standard_layouts()) {
      for (bool acc : {false, true}) {
        const std::string name = std::string(ops::activation_name(a)) + " " + layout_name(l) + (acc ? " acc" : "");
        DevTensor x(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride), dy(l.shape, l.dtype, l.c_stride),
            dx(l.shape, l.dtype, l.c_stride);
        const Vec xv = quantized(random_vec(x.elems(), seed++, -6.0f, 6.0f), l.dtype);
        const Vec dyv = quantized(random_vec(dy.elems(), seed++, -1.0f, 1.0f), l.dtype);
        const Vec dx0 = quantized(random_vec(dx.elems(), seed++, -1.0f, 1.0f), l.dtype);
        x.upload(xv);
        dy.upload(dyv);
        const auto n = static_cast<std::int64_t>(xv.size());

        y.poison();
        activation_forward(a, stream, x.ref(), y.ref());
        sync();
        Vec ref(xv.size());
        cpu::activation_forward(a, xv.data(), ref.data(), n);
        expect_near(y.download(), ref, tol_for(l.dtype), name + " forward");
        y.expect_zero_padding(name + " forward");

        if (acc)
          dx.upload(dx0);
        else
          dx.poison();
        activation_backward(a, stream, x.ref(), dy.ref(), dx.ref(), acc);
        sync();
        Vec dref = dx0;
        cpu::activation_backward(a, xv.data(), dyv.data(), dref.data(), n, acc);
        expect_near(dx.download(), dref, tol_for(l.dtype), name + " backward");
        dx.expect_zero_padding(name + " backward");
      }
    }
  }
}

TEST_F(ElementwiseTest, Add2AndAccumulate) {
  std::uint32_t seed = 200;
  for (const Layout& l : standard_layouts()) {
    const std::string name = layout_name(l);
    DevTensor a(l.shape, l.dtype, l.c_stride), b(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride);
    const Vec av = quantized(random_vec(a.elems(), seed++, -2.0f, 2.0f), l.dtype);
    const Vec bv = quantized(random_vec(b.elems(), seed++, -2.0f, 2.0f), l.dtype);
    a.upload(av);
    b.upload(bv);
    y.poison();
    add2_forward(stream, a.ref(), b.ref(), y.ref());
    sync();
    Vec ref(av.size());
    cpu::add2_forward(av.data(), bv.data(), ref.data(), static_cast<std::int64_t>(ref.size()));
    expect_near(y.download(), ref, tol_for(l.dtype), "add2 " + name);
    y.expect_zero_padding("add2 " + name);

    accumulate(stream, a.ref(), b.ref());  // b += a
    sync();
    expect_near(b.download(), ref, tol_for(l.dtype), "accumulate " + name);
    b.expect_zero_padding("accumulate " + name);
  }
}

// Flatten: (N,H,W,C) with padded rows <-> (N,1,1,H·W·C) with its own padding; the logical (compact) order is the
// same on both sides, so the compact vectors must match. Also across dtypes and with accumulation.
TEST_F(ElementwiseTest, TensorCopyFlattenBothWays) {
  const Shape four{3, 7, 5, 13}, flat{3, 1, 1, 7 * 5 * 13};
  std::uint32_t seed = 300;
  for (DType ts : {DType::F32, DType::F16}) {
    for (DType td : {DType::F32, DType::F16}) {
      for (bool acc : {false, true}) {
        const std::string name = std::string(dtype_name(ts)) + "->" + dtype_name(td) + (acc ? " acc" : "");
        const std::int64_t cs4 = ts == DType::F16 ? 16 : 13, csf = td == DType::F16 ? 456 : 455;
        DevTensor src(four, ts, cs4), dst(flat, td, csf);
        const Vec sv = quantized(random_vec(src.elems(), seed++, -2.0f, 2.0f), ts);
        const Vec d0 = quantized(random_vec(dst.elems(), seed++, -2.0f, 2.0f), td);
        src.upload(sv);
        if (acc)
          dst.upload(d0);
        else
          dst.poison();
        tensor_copy(stream, src.ref(), dst.ref(), acc);
        sync();
        Vec ref = sv;
        if (acc)
          for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = d0[i] + sv[i];
        const double tol = (ts == DType::F16 || td == DType::F16) ? 1e-2 : 1e-6;
        expect_near(dst.download(), ref, tol, "flatten fwd " + name);
        dst.expect_zero_padding("flatten fwd " + name);

        // And back: (N,1,1,K) -> (N,H,W,C).
        DevTensor back(four, ts, cs4);
        back.poison();
        tensor_copy(stream, dst.ref(), back.ref(), false);
        sync();
        expect_near(back.download(), quantized(dst.download(), ts), 1e-6, "flatten bwd " + name);
        back.expect_zero_padding("flatten bwd " + name);
      }
    }
  }
}

TEST_F(ElementwiseTest, TensorCopySameLayoutIsExact) {
  for (const Layout& l : standard_layouts()) {
    DevTensor a(l.shape, l.dtype, l.c_stride), b(l.shape, l.dtype, l.c_stride);
    const Vec av = quantized(random_vec(a.elems(), 400, -3.0f, 3.0f), l.dtype);
    a.upload(av);
    b.poison();
    tensor_copy(stream, a.ref(), b.ref(), false);
    sync();
    expect_bits_equal(b.download_full(), a.download_full(), "copy " + layout_name(l));
  }
}

TEST_F(ElementwiseTest, ChannelPadForwardBackward) {
  struct Case {
    std::int64_t c, cs, c_out, cs_out;
  };
  std::uint32_t seed = 500;
  for (DType t : {DType::F32, DType::F16}) {
    for (const Case& k : {Case{13, 16, 29, 32}, Case{16, 16, 32, 32}, Case{3, 3, 7, 7}, Case{5, 8, 5, 8}}) {
      const Shape xs{3, 7, 5, k.c}, ys{3, 7, 5, k.c_out};
      const std::string name = xs.str() + "->" + ys.str() + "/" + dtype_name(t);
      DevTensor x(xs, t, k.cs), y(ys, t, k.cs_out);
      const Vec xv = quantized(random_vec(x.elems(), seed++, -2.0f, 2.0f), t);
      x.upload(xv);
      y.poison();
      channel_pad_forward(stream, x.ref(), y.ref());
      sync();
      const std::int64_t rows = xs.n * xs.h * xs.w;
      Vec ref(y.elems());
      cpu::channel_pad_forward(xv.data(), rows, k.c, k.c_out, ref.data());
      expect_near(y.download(), ref, 1e-6, "channel_pad_forward " + name);
      y.expect_zero_padding("channel_pad_forward " + name);

      for (bool acc : {false, true}) {
        DevTensor dy(ys, t, k.cs_out), dx(xs, t, k.cs);
        const Vec dyv = quantized(random_vec(dy.elems(), seed++, -2.0f, 2.0f), t);
        const Vec dx0 = quantized(random_vec(dx.elems(), seed++, -2.0f, 2.0f), t);
        dy.upload(dyv);
        if (acc)
          dx.upload(dx0);
        else
          dx.poison();
        channel_pad_backward(stream, dy.ref(), dx.ref(), acc);
        sync();
        Vec dref = dx0;
        cpu::channel_pad_backward(dyv.data(), rows, k.c_out, k.c, dref.data(), acc);
        const std::string what = "channel_pad_backward " + name + (acc ? " acc" : "");
        expect_near(dx.download(), dref, tol_for(t), what);
        dx.expect_zero_padding(what);
      }
    }
  }
}

TEST_F(ElementwiseTest, RejectsMismatchedLayouts) {
  DevTensor a(Shape{2, 3, 3, 5}, DType::F32, 5), b(Shape{2, 3, 3, 5}, DType::F32, 8),
      h(Shape{2, 3, 3, 5}, DType::F16, 8);
  EXPECT_THROW(relu_forward(stream, a.ref(), b.ref()), Error);
  EXPECT_THROW(add2_forward(stream, b.ref(), h.ref(), b.ref()), Error);
  EXPECT_THROW(relu_forward(stream, TensorRef{}, a.ref()), Error);
}

}  // namespace
}  // namespace renaissance::cuda::ktest
