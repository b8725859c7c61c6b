// cuda::FcOp (cuBLASLt) against the CPU fully connected kernels (kernels/cpu/fully_connected.h) on random data:
// forward with and without bias (epilogue or own kernel), backward data and weights (+ bias gradient) with and
// without accumulation, FP32 compact/padded rows and FP16 padded rows; determinism and CUDA graph replay.
#include "dnn_test_util.h"

#include <kernels/cpu/fully_connected.h>
#include <kernels/cuda/fc.h>

#include <cstdio>
#include <tuple>

namespace renaissance::cuda::test {
namespace {

constexpr std::size_t kLimit = 32u << 20;

struct FcCase {
  const char* name;
  int batch, in, out;
  int h = 1, w = 1;  // > 1: x is a compact (batch, h, w, in/(h·w)) feature map, flattened
};

const FcCase kCases[] = {
    {"small_odd", 3, 13, 7},
    {"gap_fc", 32, 64, 10},
    {"resnet_head", 8, 2048, 1000},
    {"flatten", 3, 30, 11, 2, 3},
};

enum class Layout { F32, F32Padded, F16 };
enum class Bias { Epilogue, OwnKernel };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::F32: return "f32";
    case Layout::F32Padded: return "f32pad";
    case Layout::F16: return "f16";
  }
  return "?";
}

FcSpec make_spec(const FcCase& k, Layout layout, Bias bias) {
  FcSpec s;
  s.batch = k.batch;
  s.in = k.in;
  s.out = k.out;
  s.dtype = layout == Layout::F16 ? DType::F16 : DType::F32;
  const bool padded = layout != Layout::F32;
  s.x_ld = padded && k.h * k.w == 1 ? align_up(k.in, 8) : k.in;  // a flattened map is always compact
  s.y_ld = padded ? align_up(k.out, 8) : k.out;
  s.fuse_bias = bias == Bias::Epilogue;
  return s;
}

Shape x_shape(const FcCase& k) {
  return k.h * k.w == 1 ? Shape{k.batch, 1, 1, k.in} : Shape{k.batch, k.h, k.w, k.in / (k.h * k.w)};
}

/// x or dx as the op sees it: rows of x_ld, or a compact feature map (row stride = its channels).
TensorRef x_ref(const DevTensor& t, const FcCase& k) {
  TensorRef r = t.ref(x_shape(k));
  if (k.h * k.w != 1) r.c_stride = r.shape.c;
  return r;
}

struct FcData {
  std::vector<float> x, w, b, dy, dx0, dw0, db0;
  FcData(const FcSpec& s, std::uint32_t seed) {
    const auto n = static_cast<std::size_t>(s.batch), in = static_cast<std::size_t>(s.in),
               out = static_cast<std::size_t>(s.out);
    x = random_vec(n * in, seed + 1);
    w = random_vec(out * in, seed + 2);
    b = random_vec(out, seed + 3);
    dy = random_vec(n * out, seed + 4);
    dx0 = random_vec(n * in, seed + 5);
    dw0 = random_vec(out * in, seed + 6);
    db0 = random_vec(out, seed + 7);
    for (std::vector<float>* v : {&x, &w, &dy, &dx0, &dw0}) quantize(*v, s.dtype);
  }
};

struct FcDevice {
  DevTensor x, y, dx, dy, w, dw;
  DevF32 b, db;
  explicit FcDevice(const FcSpec& s)
      : x(s.batch, s.in, s.x_ld, s.dtype),
        y(s.batch, s.out, s.y_ld, s.dtype),
        dx(s.batch, s.in, s.x_ld, s.dtype),
        dy(s.batch, s.out, s.y_ld, s.dtype),
        w(s.out * s.in, 1, 1, s.dtype),
        dw(s.out * s.in, 1, 1, s.dtype),
        b(static_cast<std::size_t>(s.out)),
        db(static_cast<std::size_t>(s.out)) {}
};

class GpuFc : public ::testing::TestWithParam<std::tuple<FcCase, Layout, Bias>> {};

TEST_P(GpuFc, MatchesCpu) {
  RN_SKIP_WITHOUT_GPU();
  const auto& [k, layout, bias_mode] = GetParam();
  const FcSpec spec = make_spec(k, layout, bias_mode);
  const double tol = tolerance(spec.dtype);
  FcOp op(spec);
  op.choose(handles(), kLimit, false);
  std::printf("  [%s %s] %s | %s | %s\n", k.name, layout_name(layout), op.describe(FcPass::Forward).c_str(),
              op.describe(FcPass::BackwardData).c_str(), op.describe(FcPass::BackwardWeights).c_str());
  DeviceBuffer ws(op.workspace_bytes());
  Stream stream;
  const FcData h(spec, 2000);
  FcDevice d(spec);
  d.x.upload(h.x, 7.0f);
  d.dy.upload(h.dy, -5.0f);
  d.w.upload(h.w);
  d.b.upload(h.b);
  const Shape ys{k.batch, 1, 1, k.out};
  const TensorRef x = x_ref(d.x, k), dy = d.dy.ref(ys), y = d.y.ref(ys), dx = x_ref(d.dx, k);
  const std::int64_t n = k.batch, in = k.in, out = k.out;

  for (const bool with_bias : {true, false}) {
    d.y.upload(nan_vec(h.dy.size()), 0.0f);
    op.forward(stream.get(), x, d.w.ptr(), with_bias ? d.b.get() : nullptr, y, ws.workspace());
    stream.sync();
    std::vector<float> ref(h.dy.size());
    cpu::fc_forward(h.x.data(), n, in, h.w.data(), with_bias ? h.b.data() : nullptr, ref.data(), out);
    EXPECT_TRUE(close(d.y.download(), ref, tol)) << "forward, bias=" << with_bias;
    EXPECT_TRUE(all_zero(d.y.padding())) << "forward wrote y's padding";
  }

  for (const bool acc : {false, true}) {
    d.dx.upload(acc ? h.dx0 : nan_vec(h.x.size()), 0.0f);
    op.backward_data(stream.get(), dy, d.w.ptr(), dx, acc, ws.workspace());
    stream.sync();
    std::vector<float> ref = acc ? h.dx0 : std::vector<float>(h.x.size());
    cpu::fc_backward_data(h.dy.data(), n, out, h.w.data(), ref.data(), in, acc);
    EXPECT_TRUE(close(d.dx.download(), ref, tol)) << "backward data, accumulate=" << acc;
    EXPECT_TRUE(all_zero(d.dx.padding())) << "backward data wrote dx's padding";
  }

  for (const bool acc : {false, true}) {
    d.dw.upload(acc ? h.dw0 : nan_vec(h.w.size()));
    d.db.upload(acc ? h.db0 : nan_vec(h.b.size()));
    op.backward_weights(stream.get(), x, dy, d.dw.ptr(), d.db.get(), acc, ws.workspace());
    stream.sync();
    std::vector<float> ref_w = acc ? h.dw0 : std::vector<float>(h.w.size());
    std::vector<float> ref_b = acc ? h.db0 : std::vector<float>(h.b.size());
    cpu::fc_backward_weights(h.x.data(), h.dy.data(), n, in, out, ref_w.data(), ref_b.data(), acc);
    EXPECT_TRUE(close(d.dw.download(), ref_w, tol)) << "backward weights, accumulate=" << acc;
    EXPECT_TRUE(close(d.db.download(), ref_b, 1e-5)) << "bias gradient, accumulate=" << acc;
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::string fc_name(const ::testing::TestParamInfo<GpuFc::ParamType>& info) {
  return fmt::format("{}_{}_{}", std::get<0>(info.param).name, layout_name(std::get<1>(info.param)),
                     std::get<2>(info.param) == Bias::Epilogue ? "epilogue" : "ownbias");
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuFc,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(Layout::F32, Layout::F32Padded, Layout::F16),
                                            ::testing::Values(Bias::Epilogue, Bias::OwnKernel)),
                         fc_name);

// ---- determinism and graph replay -----------------------------------------------------------------------------------

struct FcBytes {
  std::vector<std::uint8_t> y, dx, dw, db;
};

FcBytes run_all(const FcOp& op, const FcCase& k, FcDevice& d, const Workspace& ws, cudaStream_t s) {
  const Shape ys{k.batch, 1, 1, k.out};
  op.forward(s, x_ref(d.x, k), d.w.ptr(), d.b.get(), d.y.ref(ys), ws);
  op.backward_data(s, d.dy.ref(ys), d.w.ptr(), x_ref(d.dx, k), false, ws);
  op.backward_weights(s, x_ref(d.x, k), d.dy.ref(ys), d.dw.ptr(), d.db.get(), false, ws);
  CUDA_CHECK(cudaStreamSynchronize(s));
  return FcBytes{d.y.bytes(), d.dx.bytes(), d.dw.bytes(), d.db.bytes()};
}

void poison(FcDevice& d, const FcSpec& s) {
  d.y.upload(nan_vec(static_cast<std::size_t>(s.batch * s.out)), 0.0f);
  d.dx.upload(nan_vec(static_cast<std::size_t>(s.batch * s.in)), 0.0f);
  d.dw.upload(nan_vec(static_cast<std::size_t>(s.out * s.in)));
  d.db.upload(nan_vec(static_cast<std::size_t>(s.out)));
}

class GpuFcBig : public ::testing::TestWithParam<Layout> {};

const FcCase kBig{"big", 256, 2048, 1000};

TEST_P(GpuFcBig, DeterministicModeIsBitIdentical) {
  RN_SKIP_WITHOUT_GPU();
  const FcSpec spec = make_spec(kBig, GetParam(), Bias::Epilogue);
  FcOp op(spec);
  op.choose(handles(), kLimit, true);
  DeviceBuffer ws(op.workspace_bytes());
  Stream stream;
  const FcData h(spec, 5);
  FcDevice d(spec);
  d.x.upload(h.x);
  d.dy.upload(h.dy);
  d.w.upload(h.w);
  d.b.upload(h.b);
  poison(d, spec);
  const FcBytes a = run_all(op, kBig, d, ws.workspace(), stream.get());
  poison(d, spec);
  const FcBytes b = run_all(op, kBig, d, ws.workspace(), stream.get());
  EXPECT_TRUE(a.y == b.y) << "forward differs between runs";
  EXPECT_TRUE(a.dx == b.dx) << "backward data differs between runs";
  EXPECT_TRUE(a.dw == b.dw) << "backward weights differs between runs";
  EXPECT_TRUE(a.db == b.db) << "bias gradient differs between runs";
}

// cuBLASLt's heuristics are a function of the problem, the GPU and the library (no timing): two ops of one shape,
// chosen independently on other buffers, get the same algorithms and the same bits. This is why the FC layers need
// no engine cache to be reproducible across processes (docs/kernels-cuda.md).
TEST_P(GpuFcBig, TwoOpsOfOneShapeChooseTheSameAlgorithmsAndBits) {
  RN_SKIP_WITHOUT_GPU();
  const FcSpec spec = make_spec(kBig, GetParam(), Bias::Epilogue);
  FcOp first(spec), second(spec);
  first.choose(handles(), kLimit, true);
  second.choose(handles(), kLimit, true);
  for (FcPass p : {FcPass::Forward, FcPass::BackwardData, FcPass::BackwardWeights})
    EXPECT_EQ(first.describe(p), second.describe(p));
  DeviceBuffer ws(std::max(first.workspace_bytes(), second.workspace_bytes()));
  Stream stream;
  const FcData h(spec, 9);
  FcDevice a(spec), b(spec);
  for (FcDevice* d : {&a, &b}) {
    d->x.upload(h.x);
    d->dy.upload(h.dy);
    d->w.upload(h.w);
    d->b.upload(h.b);
    poison(*d, spec);
  }
  const FcBytes ra = run_all(first, kBig, a, ws.workspace(), stream.get());
  const FcBytes rb = run_all(second, kBig, b, ws.workspace(), stream.get());
  EXPECT_TRUE(ra.y == rb.y && ra.dx == rb.dx && ra.dw == rb.dw && ra.db == rb.db);
}

TEST_P(GpuFcBig, GraphReplayMatchesDirectBitForBit) {
  RN_SKIP_WITHOUT_GPU();
  const FcSpec spec = make_spec(kBig, GetParam(), Bias::Epilogue);
  FcOp op(spec);
  op.choose(handles(), kLimit, true);
  DeviceBuffer ws(op.workspace_bytes());
  Stream stream;
  const FcData h(spec, 6);
  FcDevice d(spec);
  d.x.upload(h.x);
  d.dy.upload(h.dy);
  d.w.upload(h.w);
  d.b.upload(h.b);
  poison(d, spec);
  const FcBytes direct = run_all(op, kBig, d, ws.workspace(), stream.get());

  const Shape xs = x_shape(kBig), ys{kBig.batch, 1, 1, kBig.out};
  poison(d, spec);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  op.forward(stream.get(), d.x.ref(xs), d.w.ptr(), d.b.get(), d.y.ref(ys), ws.workspace());
  op.backward_data(stream.get(), d.dy.ref(ys), d.w.ptr(), d.dx.ref(xs), false, ws.workspace());
  op.backward_weights(stream.get(), d.x.ref(xs), d.dy.ref(ys), d.dw.ptr(), d.db.get(), false, ws.workspace());
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison(d, spec);
    ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
    stream.sync();
    EXPECT_TRUE(d.y.bytes() == direct.y) << "forward, replay " << replay;
    EXPECT_TRUE(d.dx.bytes() == direct.dx) << "backward data, replay " << replay;
    EXPECT_TRUE(d.dw.bytes() == direct.dw) << "backward weights, replay " << replay;
    EXPECT_TRUE(d.db.bytes() == direct.db) << "bias gradient, replay " << replay;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  std::vector<float> ref(static_cast<std::size_t>(spec.batch * spec.out));
  cpu::fc_forward(h.x.data(), spec.batch, spec.in, h.w.data(), h.b.data(), ref.data(), spec.out);
  EXPECT_TRUE(close(d.y.download(), ref, tolerance(spec.dtype)));
}

INSTANTIATE_TEST_SUITE_P(Big, GpuFcBig, ::testing::Values(Layout::F32, Layout::F16),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(layout_name(i.param)); });

TEST(GpuFcSetup, RunTimeChecks) {
  RN_SKIP_WITHOUT_GPU();
  const FcCase k{"checks", 4, 16, 8};
  const FcSpec spec = make_spec(k, Layout::F32, Bias::Epilogue);
  FcOp op(spec);
  FcDevice d(spec);
  const Shape xs = x_shape(k), ys{k.batch, 1, 1, k.out};
  {
    DeviceBuffer small(1u << 20);
    EXPECT_THROW(op.forward(nullptr, d.x.ref(xs), d.w.ptr(), nullptr, d.y.ref(ys), small.workspace()), Error);
  }
  op.choose(handles(), kLimit, false);
  DeviceBuffer ws(op.workspace_bytes());
  EXPECT_THROW(op.forward(nullptr, d.x.ref(Shape{5, 1, 1, 16}), d.w.ptr(), nullptr, d.y.ref(ys), ws.workspace()),
               Error);
  EXPECT_THROW(op.forward(nullptr, d.x.ref(xs), d.w.ptr(), nullptr, d.y.ref(Shape{4, 1, 1, 9}), ws.workspace()),
               Error);
  EXPECT_THROW(FcOp(FcSpec{4, 16, 8, 8, 0, DType::F32, false, true}), Error) << "row stride below in";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace renaissance::cuda::test
