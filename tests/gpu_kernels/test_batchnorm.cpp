// CUDA batch norm against kernels/cpu/batchnorm, called as the CPU adapter does (BN_FWD_TRAIN: momentum 1 into
// zeroed running buffers gives the batch mean and the unbiased batch variance). Statistics and parameter gradients
// are reductions: compared relative to the magnitude of the whole reference vector. Shapes cover odd and padded
// channels, 1-D BN, several channel tiles and many row blocks.
#include "gpu_test_util.h"

#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cuda/batchnorm.h>
#include <kernels/cuda/elementwise.h>

#include <fmt/format.h>

#include <algorithm>

namespace renaissance::cuda::ktest {
namespace {

class BatchNormTest : public GpuTest {};

std::vector<Layout> bn_layouts() {
  std::vector<Layout> out = standard_layouts();
  for (DType t : {DType::F32, DType::F16}) {
    out.push_back({Shape{37, 1, 1, 13}, 16, t});     // 1-D
    out.push_back({Shape{8, 7, 7, 520}, 520, t});    // several channel tiles
    out.push_back({Shape{16, 32, 32, 64}, 64, t});   // many row blocks
    out.push_back({Shape{4, 17, 19, 72}, 72, t});
  }
  return out;
}

/// x with a per-channel offset and spread (|mean| ≫ std in some channels: the shifted sums must cope).
Vec bn_input(const Shape& s, std::uint32_t seed, DType t) {
  const Vec u = random_vec(static_cast<std::size_t>(s.elems()), seed, -1.0f, 1.0f);
  const Vec mu = random_vec(static_cast<std::size_t>(s.c), seed + 1, -3.0f, 3.0f);
  const Vec sd = random_vec(static_cast<std::size_t>(s.c), seed + 2, 0.25f, 2.0f);
  Vec x(u.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = mu[i % s.c] + sd[i % s.c] * u[i];
  return quantized(x, t);
}

struct ForwardRef {
  Vec y, mean, var_unbiased, invstd;
};

ForwardRef cpu_forward(const Vec& x, const Shape& s, const Vec& gamma, const Vec& beta, float eps) {
  ForwardRef r;
  const auto c = static_cast<std::size_t>(s.c);
  r.y.resize(x.size());
  r.mean.assign(c, 0.0f);
  r.var_unbiased.assign(c, 0.0f);
  r.invstd.resize(c);
  Vec save_mean(c);
  cpu::batchnorm_forward_train(x.data(), s, gamma.data(), beta.data(), r.y.data(), save_mean.data(), r.invstd.data(),
                               r.mean.data(), r.var_unbiased.data(), 1.0f, eps);
  return r;
}

TEST_F(BatchNormTest, ForwardTrainMatchesCpu) {
  std::uint32_t seed = 10;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  for (const Layout& l : bn_layouts()) {
    const std::string name = layout_name(l);
    const auto c = static_cast<std::size_t>(l.shape.c);
    DevTensor x(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride);
    const Vec xv = bn_input(l.shape, seed, l.dtype);
    const Vec gamma = random_vec(c, seed + 3, 0.5f, 1.5f), beta = random_vec(c, seed + 4, -0.5f, 0.5f);
    seed += 10;
    x.upload(xv);
    y.poison();
    const DeviceBuffer g = upload(gamma), b = upload(beta);
    DeviceBuffer mean(c * 4), var(c * 4), invstd(c * 4);
    mean.fill_bytes(0xFF);
    var.fill_bytes(0xFF);
    invstd.fill_bytes(0xFF);
    const std::size_t ws_bytes = batchnorm_workspace_bytes(x.ref());
    DeviceBuffer ws(ws_bytes);
    batchnorm_forward_train(stream, x.ref(), g.as<float>(), b.as<float>(), eps_dev.as<float>(), y.ref(),
                            mean.as<float>(), var.as<float>(), invstd.as<float>(), ws.get(), ws_bytes);
    sync();
    const ForwardRef ref = cpu_forward(xv, l.shape, gamma, beta, eps);
    expect_near(download<float>(mean, c), ref.mean, 1e-5, "batch mean " + name, true);
    expect_near(download<float>(var, c), ref.var_unbiased, 1e-5, "batch var " + name, true);
    expect_near(download<float>(invstd, c), ref.invstd, 1e-5, "save_invstd " + name, true);
    expect_near(y.download(), ref.y, tol_for(l.dtype), "y " + name);
    y.expect_zero_padding("y " + name);

    // In place, and bit-reproducible.
    const Vec first = y.download_full();
    batchnorm_forward_train(stream, x.ref(), g.as<float>(), b.as<float>(), eps_dev.as<float>(), x.ref(),
                            mean.as<float>(), var.as<float>(), invstd.as<float>(), ws.get(), ws_bytes);
    sync();
    expect_bits_equal(x.download_full(), first, "in-place rerun " + name);
  }
}

TEST_F(BatchNormTest, StatisticsFromSumsMatchCpu) {
  // batchnorm_statistics_from_sums (ConvOp::forward_stats's GEN_STATS epilogue writes Σx, Σx² into the mean and
  // variance slots): the FP32 sums of each layout's x, finalised in place, against the CPU forward's statistics.
  // |mean| up to 3× the spread (bn_input): the unshifted E[x²] − mean² loses about that squared in relative precision,
  // so 1e-4 (the own kernels' shifted sums hold 1e-5).
  std::uint32_t seed = 70;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  for (const Layout& l : bn_layouts()) {
    const std::string name = layout_name(l);
    const auto c = static_cast<std::size_t>(l.shape.c);
    const Vec xv = bn_input(l.shape, seed, l.dtype);
    const Vec gamma(c, 1.0f), beta(c, 0.0f);
    seed += 10;
    std::vector<double> s1(c), s2(c);
    for (std::size_t i = 0; i < xv.size(); ++i) {
      s1[i % c] += xv[i];
      s2[i % c] += static_cast<double>(xv[i]) * xv[i];
    }
    Vec sum(c), sq(c);
    for (std::size_t k = 0; k < c; ++k) {
      sum[k] = static_cast<float>(s1[k]);
      sq[k] = static_cast<float>(s2[k]);
    }
    const DeviceBuffer mean = upload(sum), var = upload(sq);
    DeviceBuffer invstd(c * 4);
    invstd.fill_bytes(0xFF);
    batchnorm_statistics_from_sums(stream, l.shape.c, l.shape.n * l.shape.h * l.shape.w, eps_dev.as<float>(),
                                   mean.as<float>(), var.as<float>(), invstd.as<float>());
    sync();
    const ForwardRef ref = cpu_forward(xv, l.shape, gamma, beta, eps);
    expect_near(download<float>(mean, c), ref.mean, 1e-5, "batch mean " + name, true);
    expect_near(download<float>(var, c), ref.var_unbiased, 1e-4, "batch var " + name, true);
    expect_near(download<float>(invstd, c), ref.invstd, 1e-4, "save_invstd " + name, true);
  }
  DeviceBuffer one(4);
  EXPECT_THROW(batchnorm_statistics_from_sums(stream, 1, 1, eps_dev.as<float>(), one.as<float>(), one.as<float>(),
                                              one.as<float>()),
               Error);
}

TEST_F(BatchNormTest, ForwardInferenceMatchesCpu) {
  std::uint32_t seed = 500;
  const float eps = 1e-3f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  for (const Layout& l : bn_layouts()) {
    const std::string name = layout_name(l);
    const auto c = static_cast<std::size_t>(l.shape.c);
    DevTensor x(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride);
    const Vec xv = bn_input(l.shape, seed, l.dtype);
    const Vec gamma = random_vec(c, seed + 3, 0.5f, 1.5f), beta = random_vec(c, seed + 4, -0.5f, 0.5f);
    const Vec rmean = random_vec(c, seed + 5, -2.0f, 2.0f), rvar = random_vec(c, seed + 6, 0.1f, 3.0f);
    seed += 10;
    x.upload(xv);
    y.poison();
    const DeviceBuffer g = upload(gamma), b = upload(beta), m = upload(rmean), v = upload(rvar);
    batchnorm_forward_inference(stream, x.ref(), g.as<float>(), b.as<float>(), m.as<float>(), v.as<float>(),
                                eps_dev.as<float>(), y.ref());
    sync();
    Vec ref(xv.size());
    cpu::batchnorm_forward_inference(xv.data(), l.shape, gamma.data(), beta.data(), rmean.data(), rvar.data(),
                                     ref.data(), eps);
    expect_near(y.download(), ref, tol_for(l.dtype), "inference y " + name);
    y.expect_zero_padding("inference y " + name);
  }
}

TEST_F(BatchNormTest, BackwardMatchesCpu) {
  std::uint32_t seed = 900;
  const float eps = 1e-5f;
  for (const Layout& l : bn_layouts()) {
    for (int mode = 0; mode < 3; ++mode) {  // 0: dx written, 1: dx accumulated, 2: no dx
      const bool acc = mode == 1, with_dx = mode != 2;
      const std::string name = layout_name(l) + (mode == 0 ? "" : mode == 1 ? " acc" : " no-dx");
      const auto c = static_cast<std::size_t>(l.shape.c);
      DevTensor x(l.shape, l.dtype, l.c_stride), dy(l.shape, l.dtype, l.c_stride), dx(l.shape, l.dtype, l.c_stride);
      const Vec xv = bn_input(l.shape, seed, l.dtype);
      const Vec dyv = quantized(random_vec(x.elems(), seed + 7, -1.0f, 1.0f), l.dtype);
      const Vec dx0 = quantized(random_vec(x.elems(), seed + 8, -1.0f, 1.0f), l.dtype);
      const Vec gamma = random_vec(c, seed + 3, 0.5f, 1.5f), beta = random_vec(c, seed + 4, -0.5f, 0.5f);
      const Vec dg0 = random_vec(c, seed + 5, -1.0f, 1.0f), db0 = random_vec(c, seed + 6, -1.0f, 1.0f);
      seed += 10;
      const ForwardRef fwd = cpu_forward(xv, l.shape, gamma, beta, eps);
      x.upload(xv);
      dy.upload(dyv);
      if (acc)
        dx.upload(dx0);
      else
        dx.poison();
      const DeviceBuffer g = upload(gamma), m = upload(fwd.mean), is = upload(fwd.invstd);
      const DeviceBuffer dg = upload(dg0), db = upload(db0);
      const std::size_t ws_bytes = batchnorm_workspace_bytes(x.ref());
      DeviceBuffer ws(ws_bytes);
      batchnorm_backward(stream, x.ref(), dy.ref(), g.as<float>(), m.as<float>(), is.as<float>(),
                         with_dx ? dx.ref() : TensorRef{}, acc, dg.as<float>(), db.as<float>(), ws.get(), ws_bytes);
      sync();
      Vec dx_ref = dx0, dg_ref = dg0, db_ref = db0;
      cpu::batchnorm_backward(xv.data(), dyv.data(), l.shape, gamma.data(), fwd.mean.data(), fwd.invstd.data(),
                              with_dx ? dx_ref.data() : nullptr, dg_ref.data(), db_ref.data(), acc, true);
      expect_near(download<float>(dg, c), dg_ref, 1e-5, "dgamma " + name, true);
      expect_near(download<float>(db, c), db_ref, 1e-5, "dbeta " + name, true);
      if (with_dx) {
        expect_near(dx.download(), dx_ref, tol_for(l.dtype), "dx " + name, true);
        dx.expect_zero_padding("dx " + name);
      }
    }
  }
}

TEST_F(BatchNormTest, RejectsSmallWorkspaceAndSingleRow) {
  DevTensor x(Shape{1, 1, 1, 8}, DType::F32, 8), y(Shape{1, 1, 1, 8}, DType::F32, 8);
  DeviceBuffer p(64), ws(16);
  float* f = p.as<float>();
  EXPECT_THROW(batchnorm_forward_train(stream, x.ref(), f, f, f, y.ref(), f, f, f, ws.get(), 16), Error);
  DevTensor x2(Shape{4, 5, 5, 8}, DType::F32, 8), y2(Shape{4, 5, 5, 8}, DType::F32, 8);
  EXPECT_THROW(batchnorm_forward_train(stream, x2.ref(), f, f, f, y2.ref(), f, f, f, ws.get(), 16), Error);
}

// ---- fused element-wise tails (DESIGN §11): one pass must equal the plain parts bit for bit ----------------------

/// y = relu(round(round(BN(x)) + s')) from the CPU kernels, rounding to the storage type where the parts store.
Vec cpu_tail(const Vec& bn_x, const Vec* s, const Vec* bn_s, bool relu, DType t) {
  Vec y = quantized(bn_x, t);
  if (s || bn_s) {
    const Vec sc = quantized(s ? *s : *bn_s, t);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = y[i] + sc[i];
    y = quantized(y, t);
  }
  if (relu)
    for (float& v : y) v = v > 0.0f ? v : 0.0f;
  return y;
}

TEST_F(BatchNormTest, FusedApplyEqualsThePlainPartsBitForBit) {
  std::uint32_t seed = 1300;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  for (const Layout& l : bn_layouts()) {
    if (l.shape.n * l.shape.h * l.shape.w < 2) continue;
    for (int inference = 0; inference < 2; ++inference) {
      for (Shortcut sc : {Shortcut::kNone, Shortcut::kTensor, Shortcut::kBatchNorm}) {
        for (int relu = 0; relu < 2; ++relu) {
          const std::string name = fmt::format("{} {} shortcut {} relu {}", layout_name(l), inference ? "infer" : "train",
                                               static_cast<int>(sc), relu);
          const auto c = static_cast<std::size_t>(l.shape.c);
          DevTensor x(l.shape, l.dtype, l.c_stride), xs(l.shape, l.dtype, l.c_stride);
          DevTensor y_plain(l.shape, l.dtype, l.c_stride), s_plain(l.shape, l.dtype, l.c_stride);
          DevTensor y_fused(l.shape, l.dtype, l.c_stride);
          const Vec xv = bn_input(l.shape, seed, l.dtype), xsv = bn_input(l.shape, seed + 1, l.dtype);
          const Vec gamma = random_vec(c, seed + 3, 0.5f, 1.5f), beta = random_vec(c, seed + 4, -0.5f, 0.5f);
          const Vec gamma2 = random_vec(c, seed + 5, 0.5f, 1.5f), beta2 = random_vec(c, seed + 6, -0.5f, 0.5f);
          const Vec rmean = random_vec(c, seed + 7, -2.0f, 2.0f), rvar = random_vec(c, seed + 8, 0.1f, 3.0f);
          const Vec rmean2 = random_vec(c, seed + 9, -2.0f, 2.0f), rvar2 = random_vec(c, seed + 10, 0.1f, 3.0f);
          seed += 20;
          x.upload(xv);
          xs.upload(xsv);
          y_plain.poison();
          s_plain.poison();
          y_fused.poison();
          const DeviceBuffer g = upload(gamma), b = upload(beta), g2 = upload(gamma2), b2 = upload(beta2);
          const DeviceBuffer rm = upload(rmean), rv = upload(rvar), rm2 = upload(rmean2), rv2 = upload(rvar2);
          DeviceBuffer mean(c * 4), var(c * 4), invstd(c * 4), mean2(c * 4), var2(c * 4), invstd2(c * 4);
          const std::size_t ws_bytes = batchnorm_workspace_bytes(x.ref());
          DeviceBuffer ws(ws_bytes);
          // The plain parts: BN (and the shortcut's BN), ADD2 in place, ReLU in place.
          const TensorRef shortcut = sc == Shortcut::kTensor ? xs.ref() : s_plain.ref();
          if (inference) {
            batchnorm_forward_inference(stream, x.ref(), g.as<float>(), b.as<float>(), rm.as<float>(), rv.as<float>(),
                                        eps_dev.as<float>(), y_plain.ref());
            if (sc == Shortcut::kBatchNorm)
              batchnorm_forward_inference(stream, xs.ref(), g2.as<float>(), b2.as<float>(), rm2.as<float>(),
                                          rv2.as<float>(), eps_dev.as<float>(), s_plain.ref());
          } else {
            if (sc == Shortcut::kBatchNorm)
              batchnorm_forward_train(stream, xs.ref(), g2.as<float>(), b2.as<float>(), eps_dev.as<float>(),
                                      s_plain.ref(), mean2.as<float>(), var2.as<float>(), invstd2.as<float>(), ws.get(),
                                      ws_bytes);
            batchnorm_forward_train(stream, x.ref(), g.as<float>(), b.as<float>(), eps_dev.as<float>(), y_plain.ref(),
                                    mean.as<float>(), var.as<float>(), invstd.as<float>(), ws.get(), ws_bytes);
          }
          if (sc != Shortcut::kNone) add2_forward(stream, y_plain.ref(), shortcut, y_plain.ref());
          if (relu) relu_forward(stream, y_plain.ref(), y_plain.ref());
          // The fused pass (training: the statistics computed above are the ones a fused layer computes first).
          const BnApply main = inference ? BnApply{x.ref(), g.as<float>(), b.as<float>(), rm.as<float>(), rv.as<float>(),
                                                   eps_dev.as<float>()}
                                         : BnApply{x.ref(), g.as<float>(), b.as<float>(), mean.as<float>(),
                                                   invstd.as<float>(), nullptr};
          const BnApply second = inference ? BnApply{xs.ref(), g2.as<float>(), b2.as<float>(), rm2.as<float>(),
                                                     rv2.as<float>(), eps_dev.as<float>()}
                                           : BnApply{xs.ref(), g2.as<float>(), b2.as<float>(), mean2.as<float>(),
                                                     invstd2.as<float>(), nullptr};
          batchnorm_apply_fused(stream, inference != 0, main, sc, sc == Shortcut::kTensor ? xs.ref() : TensorRef{},
                                sc == Shortcut::kBatchNorm ? &second : nullptr, relu != 0, y_fused.ref());
          sync();
          const Vec got = y_fused.download();
          expect_bits_equal(got, y_plain.download(), "fused vs plain " + name);
          y_fused.expect_zero_padding("fused y " + name);
          // And against the CPU kernels.
          auto cpu_bn = [&](const Vec& in, const Vec& ga, const Vec& be, const Vec& m, const Vec& v) {
            Vec out(in.size());
            if (inference) {
              cpu::batchnorm_forward_inference(in.data(), l.shape, ga.data(), be.data(), m.data(), v.data(), out.data(),
                                               eps);
              return out;
            }
            return cpu_forward(in, l.shape, ga, be, eps).y;
          };
          const Vec main_ref = cpu_bn(xv, gamma, beta, rmean, rvar);
          const Vec s_ref = sc == Shortcut::kBatchNorm ? cpu_bn(xsv, gamma2, beta2, rmean2, rvar2) : xsv;
          const Vec ref = cpu_tail(main_ref, sc == Shortcut::kTensor ? &s_ref : nullptr,
                                   sc == Shortcut::kBatchNorm ? &s_ref : nullptr, relu != 0, l.dtype);
          expect_near(got, ref, l.dtype == DType::F16 ? 2e-2 : 1e-5, "fused vs CPU " + name);
        }
      }
    }
  }
}

TEST_F(BatchNormTest, ReluBackwardFoldedIntoTheBnBackwardEqualsThePlainParts) {
  std::uint32_t seed = 1700;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  for (const Layout& l : bn_layouts()) {
    for (int mode = 0; mode < 3; ++mode) {  // 0: dx written, 1: dx accumulated, 2: no dx
      const bool acc = mode == 1, with_dx = mode != 2;
      const std::string name = layout_name(l) + (mode == 0 ? "" : mode == 1 ? " acc" : " no-dx");
      const auto c = static_cast<std::size_t>(l.shape.c);
      DevTensor x(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride), dy(l.shape, l.dtype, l.c_stride);
      DevTensor dz(l.shape, l.dtype, l.c_stride), dx_plain(l.shape, l.dtype, l.c_stride);
      DevTensor dx_fused(l.shape, l.dtype, l.c_stride);
      const Vec xv = bn_input(l.shape, seed, l.dtype);
      const Vec dyv = quantized(random_vec(x.elems(), seed + 7, -1.0f, 1.0f), l.dtype);
      const Vec dx0 = quantized(random_vec(x.elems(), seed + 8, -1.0f, 1.0f), l.dtype);
      const Vec gamma = random_vec(c, seed + 3, 0.5f, 1.5f), beta = random_vec(c, seed + 4, -0.5f, 0.5f);
      const Vec dg0 = random_vec(c, seed + 5, -1.0f, 1.0f), db0 = random_vec(c, seed + 6, -1.0f, 1.0f);
      seed += 10;
      x.upload(xv);
      dy.upload(dyv);
      for (DevTensor* d : {&dx_plain, &dx_fused}) {
        if (acc)
          d->upload(dx0);
        else
          d->poison();
      }
      const DeviceBuffer g = upload(gamma), b = upload(beta);
      DeviceBuffer mean(c * 4), var(c * 4), invstd(c * 4);
      const DeviceBuffer dg_plain = upload(dg0), db_plain = upload(db0), dg_fused = upload(dg0), db_fused = upload(db0);
      const std::size_t ws_bytes = batchnorm_workspace_bytes(x.ref());
      DeviceBuffer ws(ws_bytes);
      // Forward y = relu(BN(x)), then the plain backward: ReLU backward into dz, BN backward of dz.
      batchnorm_forward_train(stream, x.ref(), g.as<float>(), b.as<float>(), eps_dev.as<float>(), y.ref(),
                              mean.as<float>(), var.as<float>(), invstd.as<float>(), ws.get(), ws_bytes);
      relu_forward(stream, y.ref(), y.ref());
      relu_backward(stream, y.ref(), dy.ref(), dz.ref(), false);
      batchnorm_backward(stream, x.ref(), dz.ref(), g.as<float>(), mean.as<float>(), invstd.as<float>(),
                         with_dx ? dx_plain.ref() : TensorRef{}, acc, dg_plain.as<float>(), db_plain.as<float>(),
                         ws.get(), ws_bytes);
      const ReluMask mask{invstd.as<float>(), g.as<float>(), b.as<float>()};
      batchnorm_relu_backward(stream, x.ref(), dy.ref(), g.as<float>(), mean.as<float>(), invstd.as<float>(), &mask,
                              with_dx ? dx_fused.ref() : TensorRef{}, acc, dg_fused.as<float>(), db_fused.as<float>(),
                              ws.get(), ws_bytes);
      sync();
      expect_bits_equal(download<float>(dg_fused, c), download<float>(dg_plain, c), "dgamma " + name);
      expect_bits_equal(download<float>(db_fused, c), download<float>(db_plain, c), "dbeta " + name);
      if (with_dx) {
        expect_bits_equal(dx_fused.download(), dx_plain.download(), "dx " + name);
        dx_fused.expect_zero_padding("dx " + name);
      }
      // Against the CPU kernels (the ReLU mask from the GPU's forward output, the rest computed on the CPU).
      const Vec yv = y.download();
      Vec dzv(dyv.size());
      cpu::relu_backward(yv.data(), dyv.data(), dzv.data(), static_cast<std::int64_t>(dzv.size()), false);
      const ForwardRef fwd = cpu_forward(xv, l.shape, gamma, beta, eps);
      Vec dx_ref = dx0, dg_ref = dg0, db_ref = db0;
      cpu::batchnorm_backward(xv.data(), dzv.data(), l.shape, gamma.data(), fwd.mean.data(), fwd.invstd.data(),
                              with_dx ? dx_ref.data() : nullptr, dg_ref.data(), db_ref.data(), acc, true);
      expect_near(download<float>(dg_fused, c), dg_ref, 1e-5, "dgamma vs CPU " + name, true);
      expect_near(download<float>(db_fused, c), db_ref, 1e-5, "dbeta vs CPU " + name, true);
      if (with_dx) expect_near(dx_fused.download(), dx_ref, tol_for(l.dtype), "dx vs CPU " + name, true);
    }
  }
}

TEST_F(BatchNormTest, ResidualSumReluBackwardInsideTheBnBackwardEqualsThePlainParts) {
  // plan ADD_RELU_BN_BWD: relu_backward_sum (g = relu'(y)·round(dy + a), stored) then batchnorm_backward of g, against
  // batchnorm_add_relu_backward, which forms g inside the BN's statistics pass: g (padding included), dγ, dβ and dx
  // bit for bit, with dx written and accumulated; layouts whose padding a vector does not cover take the two passes.
  std::uint32_t seed = 2300;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  for (const Layout& l : bn_layouts()) {
    for (bool acc : {false, true}) {
      const std::string name = layout_name(l) + (acc ? " acc" : "");
      const auto c = static_cast<std::size_t>(l.shape.c);
      DevTensor x(l.shape, l.dtype, l.c_stride), y(l.shape, l.dtype, l.c_stride), dy(l.shape, l.dtype, l.c_stride);
      DevTensor a(l.shape, l.dtype, l.c_stride), g_plain(l.shape, l.dtype, l.c_stride);
      DevTensor g_fused(l.shape, l.dtype, l.c_stride), dx_plain(l.shape, l.dtype, l.c_stride);
      DevTensor dx_fused(l.shape, l.dtype, l.c_stride);
      const Vec xv = bn_input(l.shape, seed, l.dtype);
      y.upload(quantized(random_vec(x.elems(), seed + 1, -1.0f, 1.0f), l.dtype));  // about half the mask is off
      relu_forward(stream, y.ref(), y.ref());
      dy.upload(quantized(random_vec(x.elems(), seed + 2, -1.0f, 1.0f), l.dtype));
      a.upload(quantized(random_vec(x.elems(), seed + 3, -1.0f, 1.0f), l.dtype));
      const Vec dx0 = quantized(random_vec(x.elems(), seed + 4, -1.0f, 1.0f), l.dtype);
      const Vec gamma = random_vec(c, seed + 5, 0.5f, 1.5f), beta = random_vec(c, seed + 6, -0.5f, 0.5f);
      const Vec dg0 = random_vec(c, seed + 7, -1.0f, 1.0f), db0 = random_vec(c, seed + 8, -1.0f, 1.0f);
      seed += 10;
      x.upload(xv);
      g_plain.poison();
      g_fused.poison();
      for (DevTensor* d : {&dx_plain, &dx_fused}) {
        if (acc)
          d->upload(dx0);
        else
          d->poison();
      }
      const DeviceBuffer gm = upload(gamma), b = upload(beta);
      DeviceBuffer mean(c * 4), var(c * 4), invstd(c * 4);
      const DeviceBuffer dg_plain = upload(dg0), db_plain = upload(db0), dg_fused = upload(dg0), db_fused = upload(db0);
      const std::size_t ws_bytes = batchnorm_workspace_bytes(x.ref());
      DeviceBuffer ws(ws_bytes);
      DevTensor scratch(l.shape, l.dtype, l.c_stride);
      batchnorm_forward_train(stream, x.ref(), gm.as<float>(), b.as<float>(), eps_dev.as<float>(), scratch.ref(),
                              mean.as<float>(), var.as<float>(), invstd.as<float>(), ws.get(), ws_bytes);
      relu_backward_sum(stream, y.ref(), dy.ref(), a.ref(), g_plain.ref());
      batchnorm_backward(stream, x.ref(), g_plain.ref(), gm.as<float>(), mean.as<float>(), invstd.as<float>(),
                         dx_plain.ref(), acc, dg_plain.as<float>(), db_plain.as<float>(), ws.get(), ws_bytes);
      batchnorm_add_relu_backward(stream, y.ref(), dy.ref(), a.ref(), g_fused.ref(), x.ref(), gm.as<float>(),
                                  mean.as<float>(), invstd.as<float>(), dx_fused.ref(), acc, dg_fused.as<float>(),
                                  db_fused.as<float>(), ws.get(), ws_bytes);
      sync();
      expect_bits_equal(g_fused.download_full(), g_plain.download_full(), "g " + name);
      expect_bits_equal(download<float>(dg_fused, c), download<float>(dg_plain, c), "dgamma " + name);
      expect_bits_equal(download<float>(db_fused, c), download<float>(db_plain, c), "dbeta " + name);
      expect_bits_equal(dx_fused.download_full(), dx_plain.download_full(), "dx " + name);
      dx_fused.expect_zero_padding("dx " + name);
      // g against the CPU's relu_backward_sum (independent of both GPU paths).
      const Vec yv = y.download(), dyv = dy.download(), av = a.download();
      Vec gref(yv.size());
      cpu::relu_backward_sum(yv.data(), dyv.data(), av.data(), gref.data(), static_cast<std::int64_t>(gref.size()),
                             l.dtype == DType::F16);
      expect_near(g_fused.download(), gref, 0.0, "g vs CPU " + name);
    }
  }
}

TEST_F(BatchNormTest, ReluMaskBitsStandForTheBlockEndOutput) {
  // plan_relu_masks: the block end's apply (BN + shortcut + ReLU) also writes the sign of its stored output as bits
  // (byte row·c_stride/8 + ch/8, bit ch % 8), and batchnorm_add_relu_backward reads them instead of y. FP16 layouts
  // of 8-channel groups: the output is the mask-free apply's bit for bit, every bit is the output's sign (padding 0),
  // the backward with the mask equals the backward reading y bit for bit, and it does read the mask: an all-zero mask
  // gives g = 0 where the statistics pass runs 8-channel vectors.
  std::uint32_t seed = 2600;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  int checked = 0;
  for (const Layout& l : bn_layouts()) {
    if (l.dtype != DType::F16 || l.c_stride % 8 != 0) continue;
    ++checked;
    const std::string name = layout_name(l);
    const auto c = static_cast<std::size_t>(l.shape.c);
    const std::int64_t rows = l.shape.n * l.shape.h * l.shape.w, cs = l.c_stride;
    DevTensor x(l.shape, l.dtype, cs), sc(l.shape, l.dtype, cs), y(l.shape, l.dtype, cs), y_plain(l.shape, l.dtype, cs);
    x.upload(bn_input(l.shape, seed, l.dtype));
    sc.upload(quantized(random_vec(x.elems(), seed + 1, -1.0f, 1.0f), l.dtype));
    const Vec gamma = random_vec(c, seed + 3, 0.5f, 1.5f), beta = random_vec(c, seed + 4, -0.5f, 0.5f);
    const DeviceBuffer gm = upload(gamma), b = upload(beta);
    DeviceBuffer mean(c * 4), var(c * 4), invstd(c * 4);
    const std::size_t ws_bytes = batchnorm_workspace_bytes(x.ref());
    DeviceBuffer ws(ws_bytes);
    batchnorm_train_statistics(stream, x.ref(), eps_dev.as<float>(), mean.as<float>(), var.as<float>(),
                               invstd.as<float>(), ws.get(), ws_bytes);
    const BnApply main{x.ref(), gm.as<float>(), b.as<float>(), mean.as<float>(), invstd.as<float>(), nullptr};
    const auto mask_bytes = static_cast<std::size_t>(rows * cs / 8);
    DeviceBuffer mask(mask_bytes);
    mask.fill_bytes(0xA5);
    y.poison();
    y_plain.poison();
    batchnorm_apply_fused(stream, false, main, Shortcut::kTensor, sc.ref(), nullptr, true, y_plain.ref());
    batchnorm_apply_fused(stream, false, main, Shortcut::kTensor, sc.ref(), nullptr, true, y.ref(),
                          mask.as<std::uint8_t>());
    sync();
    const Vec yv = y.download_full();
    expect_bits_equal(yv, y_plain.download_full(), "y " + name);
    const std::vector<std::uint8_t> bits = download<std::uint8_t>(mask, mask_bytes);
    std::int64_t wrong = 0, on = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t ch = 0; ch < cs; ++ch) {
        const bool bit = (bits[static_cast<std::size_t>(r * cs / 8 + ch / 8)] >> (ch % 8)) & 1u;
        on += bit;
        wrong += bit != (yv[static_cast<std::size_t>(r * cs + ch)] > 0.0f);
      }
    EXPECT_EQ(wrong, 0) << name;
    EXPECT_GT(on, 0) << name;
    // The backward: with the mask, with y, with a zero mask.
    DevTensor dy(l.shape, l.dtype, cs), a(l.shape, l.dtype, cs);
    dy.upload(quantized(random_vec(x.elems(), seed + 5, -1.0f, 1.0f), l.dtype));
    a.upload(quantized(random_vec(x.elems(), seed + 6, -1.0f, 1.0f), l.dtype));
    seed += 10;
    DevTensor g_y(l.shape, l.dtype, cs), g_m(l.shape, l.dtype, cs), g_0(l.shape, l.dtype, cs);
    DevTensor dx_y(l.shape, l.dtype, cs), dx_m(l.shape, l.dtype, cs), dx_0(l.shape, l.dtype, cs);
    const Vec zeros(c, 0.0f);
    const DeviceBuffer dg_y = upload(zeros), db_y = upload(zeros), dg_m = upload(zeros), db_m = upload(zeros);
    const DeviceBuffer dg_0 = upload(zeros), db_0 = upload(zeros);
    DeviceBuffer none(mask_bytes);
    none.fill_bytes(0);
    for (DevTensor* t : {&g_y, &g_m, &g_0, &dx_y, &dx_m, &dx_0}) t->poison();
    auto backward = [&](const DevTensor& g, const DevTensor& dx, const DeviceBuffer& dg, const DeviceBuffer& db,
                        const std::uint8_t* m) {
      batchnorm_add_relu_backward(stream, y.ref(), dy.ref(), a.ref(), g.ref(), x.ref(), gm.as<float>(),
                                  mean.as<float>(), invstd.as<float>(), dx.ref(), false, dg.as<float>(),
                                  db.as<float>(), ws.get(), ws_bytes, nullptr, m);
    };
    backward(g_y, dx_y, dg_y, db_y, nullptr);
    backward(g_m, dx_m, dg_m, db_m, mask.as<std::uint8_t>());
    backward(g_0, dx_0, dg_0, db_0, none.as<std::uint8_t>());
    sync();
    expect_bits_equal(g_m.download_full(), g_y.download_full(), "g " + name);
    expect_bits_equal(dx_m.download_full(), dx_y.download_full(), "dx " + name);
    expect_bits_equal(download<float>(dg_m, c), download<float>(dg_y, c), "dgamma " + name);
    expect_bits_equal(download<float>(db_m, c), download<float>(db_y, c), "dbeta " + name);
    const bool vector_pass = (static_cast<std::int64_t>(c) + 7) / 8 * 8 >= cs;  // else y is read (two passes)
    const Vec g0 = g_0.download(), gy = g_y.download();
    const bool all_zero = std::all_of(g0.begin(), g0.end(), [](float v) { return v == 0.0f; });
    const bool any_y = std::any_of(gy.begin(), gy.end(), [](float v) { return v != 0.0f; });
    EXPECT_TRUE(any_y) << name;
    if (vector_pass)
      EXPECT_TRUE(all_zero) << name << ": the backward did not read the mask";
    else
      expect_bits_equal(g_0.download_full(), g_y.download_full(), "g (y read, mask unused) " + name);
  }
  EXPECT_GE(checked, 5);
  // A mask on a layout it cannot describe is refused.
  DevTensor x32(Shape{2, 3, 3, 8}, DType::F32, 8);
  DeviceBuffer p(64), m(64);
  float* f = p.as<float>();
  const BnApply main32{x32.ref(), f, f, f, f, nullptr};
  EXPECT_THROW(batchnorm_apply_fused(stream, false, main32, Shortcut::kTensor, x32.ref(), nullptr, true, x32.ref(),
                                     m.as<std::uint8_t>()),
               Error);
}

TEST_F(BatchNormTest, ShortcutBnBackwardJoinedEqualsTheTwoCalls) {
  // plan ADD_RELU_BN_BN_BWD: batchnorm_add_relu_backward with the projection shortcut's BN (x', its statistics) sums
  // the shortcut's statistics in the same pass and writes both data gradients from one apply pass, against the block
  // end's call followed by batchnorm_backward(x', g): g, dx, dx', dγ, dβ, dγ', dβ' bit for bit, with and without a ReLU
  // mask; where the layout allows it (16-byte FP16 vectors covering the padding) the joined path ran: it wrote the
  // second half of a workspace of twice batchnorm_workspace_bytes, which the two calls never touch.
  std::uint32_t seed = 2700;
  const float eps = 1e-5f;
  const DeviceBuffer eps_dev = upload(std::vector<float>{eps});
  int joined_runs = 0;
  for (const Layout& l : bn_layouts()) {
    for (bool with_mask : {false, true}) {
      const bool vec = l.dtype == DType::F16 && l.c_stride % 8 == 0 && (l.shape.c + 7) / 8 * 8 >= l.c_stride;
      if (with_mask && !vec) continue;
      const std::string name = layout_name(l) + (with_mask ? " mask" : "");
      const auto c = static_cast<std::size_t>(l.shape.c);
      const std::int64_t cs = l.c_stride, rows = l.shape.n * l.shape.h * l.shape.w;
      DevTensor x(l.shape, l.dtype, cs), x2(l.shape, l.dtype, cs), y(l.shape, l.dtype, cs), dy(l.shape, l.dtype, cs);
      DevTensor a(l.shape, l.dtype, cs);
      x.upload(bn_input(l.shape, seed, l.dtype));
      x2.upload(bn_input(l.shape, seed + 1, l.dtype));
      y.upload(quantized(random_vec(x.elems(), seed + 2, -1.0f, 1.0f), l.dtype));
      relu_forward(stream, y.ref(), y.ref());
      dy.upload(quantized(random_vec(x.elems(), seed + 3, -1.0f, 1.0f), l.dtype));
      a.upload(quantized(random_vec(x.elems(), seed + 4, -1.0f, 1.0f), l.dtype));
      const Vec g1 = random_vec(c, seed + 5, 0.5f, 1.5f), b1 = random_vec(c, seed + 6, -0.5f, 0.5f);
      const Vec g2 = random_vec(c, seed + 7, 0.5f, 1.5f), b2 = random_vec(c, seed + 8, -0.5f, 0.5f);
      const Vec acc0 = random_vec(c, seed + 9, -1.0f, 1.0f);
      seed += 20;
      const DeviceBuffer gm1 = upload(g1), be1 = upload(b1), gm2 = upload(g2), be2 = upload(b2);
      DeviceBuffer m1(c * 4), v1(c * 4), i1(c * 4), m2(c * 4), v2(c * 4), i2(c * 4);
      const std::size_t one = batchnorm_workspace_bytes(x.ref());
      DeviceBuffer ws(2 * one);
      DevTensor scratch(l.shape, l.dtype, cs);
      batchnorm_forward_train(stream, x.ref(), gm1.as<float>(), be1.as<float>(), eps_dev.as<float>(), scratch.ref(),
                              m1.as<float>(), v1.as<float>(), i1.as<float>(), ws.get(), one);
      batchnorm_forward_train(stream, x2.ref(), gm2.as<float>(), be2.as<float>(), eps_dev.as<float>(), scratch.ref(),
                              m2.as<float>(), v2.as<float>(), i2.as<float>(), ws.get(), one);
      DeviceBuffer mask(static_cast<std::size_t>(rows * cs / 8 + 1));
      if (with_mask) {  // the block end's apply writes it: here from y, as y > 0
        const Vec yv = y.download_full();
        std::vector<std::uint8_t> bits(static_cast<std::size_t>(rows * cs / 8), 0);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t ch = 0; ch < cs; ++ch)
            if (yv[static_cast<std::size_t>(r * cs + ch)] > 0.0f)
              bits[static_cast<std::size_t>(r * cs / 8 + ch / 8)] |= static_cast<std::uint8_t>(1u << (ch % 8));
        upload_into(mask, bits);
      }
      const std::uint8_t* mk = with_mask ? mask.as<std::uint8_t>() : nullptr;
      // the two calls
      DevTensor g_two(l.shape, l.dtype, cs), dx_two(l.shape, l.dtype, cs), dx2_two(l.shape, l.dtype, cs);
      const DeviceBuffer dg1_two = upload(acc0), db1_two = upload(acc0), dg2_two = upload(acc0), db2_two = upload(acc0);
      for (DevTensor* t : {&g_two, &dx_two, &dx2_two}) t->poison();
      batchnorm_add_relu_backward(stream, y.ref(), dy.ref(), a.ref(), g_two.ref(), x.ref(), gm1.as<float>(),
                                  m1.as<float>(), i1.as<float>(), dx_two.ref(), false, dg1_two.as<float>(),
                                  db1_two.as<float>(), ws.get(), one, nullptr, mk);
      batchnorm_backward(stream, x2.ref(), g_two.ref(), gm2.as<float>(), m2.as<float>(), i2.as<float>(),
                         dx2_two.ref(), false, dg2_two.as<float>(), db2_two.as<float>(), ws.get(), one);
      // joined
      DevTensor g_j(l.shape, l.dtype, cs), dx_j(l.shape, l.dtype, cs), dx2_j(l.shape, l.dtype, cs);
      const DeviceBuffer dg1_j = upload(acc0), db1_j = upload(acc0), dg2_j = upload(acc0), db2_j = upload(acc0);
      for (DevTensor* t : {&g_j, &dx_j, &dx2_j}) t->poison();
      ws.fill_bytes(0xFF);
      const ShortcutBnBackward sc{x2.ref(),      gm2.as<float>(), m2.as<float>(),  i2.as<float>(),
                                  dx2_j.ref(),   dg2_j.as<float>(), db2_j.as<float>()};
      batchnorm_add_relu_backward(stream, y.ref(), dy.ref(), a.ref(), g_j.ref(), x.ref(), gm1.as<float>(),
                                  m1.as<float>(), i1.as<float>(), dx_j.ref(), false, dg1_j.as<float>(),
                                  db1_j.as<float>(), ws.get(), 2 * one, nullptr, mk, &sc);
      sync();
      expect_bits_equal(g_j.download_full(), g_two.download_full(), "g " + name);
      expect_bits_equal(dx_j.download_full(), dx_two.download_full(), "dx " + name);
      expect_bits_equal(dx2_j.download_full(), dx2_two.download_full(), "dx' " + name);
      expect_bits_equal(download<float>(dg1_j, c), download<float>(dg1_two, c), "dgamma " + name);
      expect_bits_equal(download<float>(db1_j, c), download<float>(db1_two, c), "dbeta " + name);
      expect_bits_equal(download<float>(dg2_j, c), download<float>(dg2_two, c), "dgamma' " + name);
      expect_bits_equal(download<float>(db2_j, c), download<float>(db2_two, c), "dbeta' " + name);
      const std::vector<std::uint8_t> w = download<std::uint8_t>(ws, 2 * one);
      const bool second_half_written =
          std::any_of(w.begin() + static_cast<std::ptrdiff_t>(one), w.end(), [](std::uint8_t v) { return v != 0xFF; });
      EXPECT_EQ(second_half_written, vec) << name << ": the joined path " << (vec ? "did not run" : "ran where it cannot");
      joined_runs += second_half_written;
    }
  }
  EXPECT_GE(joined_runs, 10);
}

TEST_F(BatchNormTest, FusedApplyRejectsMismatchedShortcut) {
  DevTensor x(Shape{4, 5, 5, 8}, DType::F32, 8), y(Shape{4, 5, 5, 8}, DType::F32, 8), s(Shape{4, 5, 5, 16}, DType::F32, 16);
  DeviceBuffer p(64);
  float* f = p.as<float>();
  const BnApply main{x.ref(), f, f, f, f, nullptr};
  EXPECT_THROW(batchnorm_apply_fused(stream, false, main, Shortcut::kTensor, s.ref(), nullptr, true, y.ref()), Error);
  EXPECT_THROW(batchnorm_apply_fused(stream, false, main, Shortcut::kBatchNorm, TensorRef{}, nullptr, true, y.ref()),
               Error);
  const BnApply no_beta{x.ref(), f, nullptr, f, f, nullptr};
  EXPECT_THROW(batchnorm_apply_fused(stream, false, no_beta, Shortcut::kNone, TensorRef{}, nullptr, true, y.ref()), Error);
}

}  // namespace
}  // namespace renaissance::cuda::ktest
