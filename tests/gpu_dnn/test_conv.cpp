// cuda::ConvOp (cuDNN) against the CPU convolution (kernels/cpu/conv2d.h) on random data: every pass, with and
// without accumulation, FP32 (compact and padded rows) and FP16 (padded rows), through cuDNN's graph API (timed and
// the heuristics' first plan), the legacy API (timed search and heuristics), the staged (compact copy) path and the
// own depthwise kernels (forced, and timed beside cuDNN);
// determinism, CUDA graph replay, the engine cache and run-time checks.
#include "dnn_test_util.h"

#include <kernels/cpu/conv2d.h>
#include <kernels/cuda/conv.h>
#include <kernels/cuda/engine_cache.h>

#include <cstdio>
#include <tuple>

namespace renaissance::cuda::test {
namespace {

constexpr std::size_t kLimit = 64u << 20;  // algorithm workspace limit for the tests

struct ConvCase {
  const char* name;
  int n, h, w, c, out;
  int kh, kw, sh, sw, ph, pw, groups;
  int x_cs16 = 0;  // FP16 input row stride; 0: C rounded up to 8
};

const ConvCase kCases[] = {
    {"pointwise", 2, 8, 8, 16, 32, 1, 1, 1, 1, 0, 0, 1},
    {"pointwise_s2_odd", 3, 9, 7, 13, 20, 1, 1, 2, 2, 0, 0, 1},
    {"k3_p1_odd", 3, 9, 7, 13, 24, 3, 3, 1, 1, 1, 1, 1},
    {"k3_s2_p1", 3, 9, 7, 16, 8, 3, 3, 2, 2, 1, 1, 1},
    {"k3_nopad", 2, 9, 7, 8, 12, 3, 3, 1, 1, 0, 0, 1},
    {"k7_s2_p3_c3", 2, 17, 15, 3, 16, 7, 7, 2, 2, 3, 3, 1, 16},
    {"k7_s2_p3_c4_first", 2, 17, 15, 4, 16, 7, 7, 2, 2, 3, 3, 1, 4},
    {"grouped", 2, 9, 7, 16, 32, 3, 3, 1, 1, 1, 1, 4},
    {"depthwise", 3, 9, 7, 24, 24, 3, 3, 1, 1, 1, 1, 24},
    {"depthwise_s2_mult2", 3, 9, 7, 8, 16, 3, 3, 2, 2, 1, 1, 8},
    {"depthwise_s2_c32", 3, 9, 7, 32, 32, 3, 3, 2, 2, 1, 1, 32},
    {"depthwise_k5_s2_c20", 2, 11, 10, 20, 20, 5, 5, 2, 2, 2, 2, 20},
    {"k3x1_rect", 2, 9, 7, 8, 8, 3, 1, 1, 1, 1, 0, 1},
};

enum class Layout { F32, F32Padded, F16 };
/// Graph/GraphHeuristic: ConvEngine::Auto (the graph API; the legacy API only where no graph plan exists), timed or
/// the heuristics' first plan. Find/Heuristic: the legacy API only, timed search or heuristics. Staged: Auto through
/// compact copies. Own: the own depthwise kernels wherever they cover a pass (OwnKernels::Always), cuDNN elsewhere;
/// Graph also times them beside cuDNN (the default, OwnKernels::Timed).
enum class Search { Graph, GraphHeuristic, Find, Heuristic, Staged, Own };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::F32: return "f32";
    case Layout::F32Padded: return "f32pad";
    case Layout::F16: return "f16";
  }
  return "?";
}
const char* search_name(Search s) {
  switch (s) {
    case Search::Graph: return "graph";
    case Search::GraphHeuristic: return "graphheur";
    case Search::Find: return "find";
    case Search::Heuristic: return "heuristic";
    case Search::Staged: return "staged";
    case Search::Own: return "own";
  }
  return "?";
}

cpu::Conv2dParams cpu_params(const ConvCase& k) {
  cpu::Conv2dParams p;
  p.kernel_h = k.kh;
  p.kernel_w = k.kw;
  p.stride_h = k.sh;
  p.stride_w = k.sw;
  p.pad_h = k.ph;
  p.pad_w = k.pw;
  p.groups = k.groups;
  return p;
}

ConvSpec make_spec(const ConvCase& k, Layout layout, bool force_staging = false) {
  ConvSpec s;
  s.x = Shape{k.n, k.h, k.w, k.c};
  s.y = cpu::conv2d_output_shape(s.x, k.out, cpu_params(k));
  s.params = ConvParams{k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.groups};
  s.dtype = layout == Layout::F16 ? DType::F16 : DType::F32;
  switch (layout) {
    case Layout::F32: s.x_c_stride = s.x.c, s.y_c_stride = s.y.c; break;
    case Layout::F32Padded: s.x_c_stride = align_up(s.x.c, 8), s.y_c_stride = align_up(s.y.c, 8); break;
    case Layout::F16:
      s.x_c_stride = k.x_cs16 ? k.x_cs16 : align_up(s.x.c, 8);
      s.y_c_stride = align_up(s.y.c, 8);
      break;
  }
  s.force_staging = force_staging;
  return s;
}

void choose(ConvOp& op, Search search, bool deterministic, std::size_t limit = kLimit) {
  ConvChoose how;
  how.deterministic = deterministic;
  how.engine = search == Search::Find || search == Search::Heuristic ? ConvEngine::Legacy : ConvEngine::Auto;
  how.time = search != Search::Heuristic && search != Search::GraphHeuristic;
  if (search == Search::Own) how.own = OwnKernels::Always;
  if (!how.time) {
    op.choose(handles(), nullptr, limit, how);
  } else {
    DeviceBuffer scratch(op.find_scratch_bytes(limit));
    op.choose(handles(), scratch.get(), scratch.bytes(), how);
  }
}

void print_algos(const std::string& label, const ConvOp& op) {
  std::printf("  [%s] %s | %s | %s | %s | %s\n", label.c_str(), op.describe(ConvPass::Forward).c_str(),
              op.describe(ConvPass::BackwardData).c_str(), op.describe(ConvPass::BackwardFilter).c_str(),
              op.describe(ConvPass::BackwardData, true).c_str(), op.describe(ConvPass::BackwardFilter, true).c_str());
}

/// Dense (ungrouped) shapes have graph-API plans for every pass; grouped and depthwise ones may fall back.
bool expect_graph(const ConvCase& k, Search s) {
  return k.groups == 1 && (s == Search::Graph || s == Search::GraphHeuristic || s == Search::Staged);
}

/// Host data of one test: inputs already rounded to the op's dtype, so the CPU reference sees what the GPU sees.
struct ConvData {
  std::vector<float> x, w, b, dy, dx0, dw0, db0;
  ConvData(const ConvSpec& s, std::int64_t w_elems, std::uint32_t seed) {
    const std::size_t xn = static_cast<std::size_t>(s.x.elems()), yn = static_cast<std::size_t>(s.y.elems());
    x = random_vec(xn, seed + 1);
    w = random_vec(static_cast<std::size_t>(w_elems), seed + 2);
    b = random_vec(static_cast<std::size_t>(s.y.c), seed + 3);
    dy = random_vec(yn, seed + 4);
    dx0 = random_vec(xn, seed + 5);
    dw0 = random_vec(static_cast<std::size_t>(w_elems), seed + 6);
    db0 = random_vec(static_cast<std::size_t>(s.y.c), seed + 7);
    for (std::vector<float>* v : {&x, &w, &dy, &dx0, &dw0}) quantize(*v, s.dtype);
  }
};

/// Device tensors of one op: x, dy (padding filled with garbage that must never be read), y, dx (padding zero,
/// must stay zero), w, dw, b, db.
struct ConvDevice {
  DevTensor x, y, dx, dy, w, dw;
  DevF32 b, db;
  ConvDevice(const ConvSpec& s, std::int64_t w_elems)
      : x(s.x.n * s.x.h * s.x.w, s.x.c, s.x_c_stride, s.dtype),
        y(s.y.n * s.y.h * s.y.w, s.y.c, s.y_c_stride, s.dtype),
        dx(s.x.n * s.x.h * s.x.w, s.x.c, s.x_c_stride, s.dtype),
        dy(s.y.n * s.y.h * s.y.w, s.y.c, s.y_c_stride, s.dtype),
        w(w_elems, 1, 1, s.dtype),
        dw(w_elems, 1, 1, s.dtype),
        b(static_cast<std::size_t>(s.y.c)),
        db(static_cast<std::size_t>(s.y.c)) {}
};

class GpuConv : public ::testing::TestWithParam<std::tuple<ConvCase, Layout, Search>> {};

TEST_P(GpuConv, MatchesCpu) {
  RN_SKIP_WITHOUT_GPU();
  const auto& [k, layout, search] = GetParam();
  const ConvSpec spec = make_spec(k, layout, search == Search::Staged);
  const cpu::Conv2dParams cp = cpu_params(k);
  const double tol = tolerance(spec.dtype);
  ConvOp op(spec);
  choose(op, search, false);
  print_algos(fmt::format("{} {} {}", k.name, layout_name(layout), search_name(search)), op);
  DeviceBuffer ws(op.workspace_bytes());
  Stream stream;

  // Accumulating passes may fall back to the legacy API: cuDNN 9 offers their add epilogue only in
  // runtime-compiled engines, which are not admitted (docs/kernels-cuda.md).
  if (expect_graph(k, search)) {
    for (ConvPass p : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
      EXPECT_TRUE(op.uses_graph(p)) << op.describe(p);
    }
  }
  if (search == Search::Find || search == Search::Heuristic) {
    for (ConvPass p : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
      EXPECT_FALSE(op.uses_graph(p)) << "--conv-api legacy: " << op.describe(p);
      EXPECT_FALSE(op.uses_own(p)) << "--conv-api legacy: " << op.describe(p);
    }
  }
  if (search == Search::Own) {
    const bool depthwise = k.groups == k.c;
    for (const bool acc : {false, true}) {
      EXPECT_EQ(op.uses_own(ConvPass::BackwardData, acc), depthwise) << op.describe(ConvPass::BackwardData, acc);
      EXPECT_FALSE(op.uses_own(ConvPass::BackwardFilter, acc)) << op.describe(ConvPass::BackwardFilter, acc);
    }
    EXPECT_EQ(op.uses_own(ConvPass::Forward), depthwise) << op.describe(ConvPass::Forward);
  }

  const ConvData h(spec, op.weight_elems(), 1000);
  ConvDevice d(spec, op.weight_elems());
  d.x.upload(h.x, 7.0f);
  d.dy.upload(h.dy, -5.0f);
  d.w.upload(h.w);
  d.b.upload(h.b);
  const TensorRef x = d.x.ref(spec.x), dy = d.dy.ref(spec.y), y = d.y.ref(spec.y), dx = d.dx.ref(spec.x);
  const std::size_t xn = h.x.size(), yn = h.dy.size(), wn = h.w.size();

  // forward, with and without bias (y starts as NaN: beta = 0 must not read it)
  for (const bool with_bias : {true, false}) {
    d.y.upload(nan_vec(yn), 0.0f);
    op.forward(stream.get(), x, d.w.ptr(), with_bias ? d.b.get() : nullptr, y, ws.workspace());
    stream.sync();
    std::vector<float> ref(yn);
    cpu::conv2d_forward(h.x.data(), spec.x, h.w.data(), with_bias ? h.b.data() : nullptr, ref.data(), spec.y, cp);
    EXPECT_TRUE(close(d.y.download(), ref, tol)) << "forward, bias=" << with_bias;
    EXPECT_TRUE(all_zero(d.y.padding())) << "forward wrote y's padding";
  }

  // backward data, overwrite (dx starts as NaN) and accumulate
  for (const bool acc : {false, true}) {
    d.dx.upload(acc ? h.dx0 : nan_vec(xn), 0.0f);
    op.backward_data(stream.get(), dy, d.w.ptr(), dx, acc, ws.workspace());
    stream.sync();
    std::vector<float> ref = acc ? h.dx0 : std::vector<float>(xn);
    cpu::conv2d_backward_data(h.dy.data(), spec.y, h.w.data(), ref.data(), spec.x, cp, acc);
    EXPECT_TRUE(close(d.dx.download(), ref, tol)) << "backward data, accumulate=" << acc;
    EXPECT_TRUE(all_zero(d.dx.padding())) << "backward data wrote dx's padding";
  }

  // backward filter + bias gradient, overwrite and accumulate
  for (const bool acc : {false, true}) {
    d.dw.upload(acc ? h.dw0 : nan_vec(wn));
    d.db.upload(acc ? h.db0 : nan_vec(h.b.size()));
    op.backward_filter(stream.get(), x, dy, d.dw.ptr(), d.db.get(), acc, ws.workspace());
    stream.sync();
    std::vector<float> ref_w = acc ? h.dw0 : std::vector<float>(wn);
    std::vector<float> ref_b = acc ? h.db0 : std::vector<float>(h.b.size());
    cpu::conv2d_backward_filter(h.x.data(), spec.x, h.dy.data(), spec.y, ref_w.data(), ref_b.data(), cp, acc);
    EXPECT_TRUE(close(d.dw.download(), ref_w, tol)) << "backward filter, accumulate=" << acc;
    EXPECT_TRUE(close(d.db.download(), ref_b, 1e-5)) << "bias gradient, accumulate=" << acc;
  }

  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::string conv_name(const ::testing::TestParamInfo<GpuConv::ParamType>& info) {
  return fmt::format("{}_{}_{}", std::get<0>(info.param).name, layout_name(std::get<1>(info.param)),
                     search_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuConv,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(Layout::F32, Layout::F32Padded, Layout::F16),
                                            ::testing::Values(Search::Graph, Search::GraphHeuristic, Search::Find,
                                                              Search::Heuristic, Search::Staged, Search::Own)),
                         conv_name);

// ---- determinism and graph replay -----------------------------------------------------------------------------------

const ConvCase kBig[] = {
    {"k3_p1_32to64", 8, 28, 28, 32, 64, 3, 3, 1, 1, 1, 1, 1},
    {"stem_k7_s2_c8", 4, 56, 56, 8, 64, 7, 7, 2, 2, 3, 3, 1, 8},
    {"bottleneck_1x1_256to64", 8, 14, 14, 256, 64, 1, 1, 1, 1, 0, 0, 1},
    {"pointwise_s2_64to128", 8, 28, 28, 64, 128, 1, 1, 2, 2, 0, 0, 1},
    {"depthwise_k3", 8, 28, 28, 32, 32, 3, 3, 1, 1, 1, 1, 32},
    {"depthwise_k3_s2_c96", 8, 28, 28, 96, 96, 3, 3, 2, 2, 1, 1, 96},
    {"k3_s2_odd_padded", 4, 15, 13, 13, 24, 3, 3, 2, 2, 1, 1, 1},
};

/// Runs forward (bias), backward data and backward filter (+db), overwriting, and returns the raw output bytes.
struct PassBytes {
  std::vector<std::uint8_t> y, dx, dw, db;
};

PassBytes run_all(const ConvOp& op, ConvDevice& d, const Workspace& ws, cudaStream_t s) {
  const ConvSpec& spec = op.spec();
  op.forward(s, d.x.ref(spec.x), d.w.ptr(), d.b.get(), d.y.ref(spec.y), ws);
  op.backward_data(s, d.dy.ref(spec.y), d.w.ptr(), d.dx.ref(spec.x), false, ws);
  op.backward_filter(s, d.x.ref(spec.x), d.dy.ref(spec.y), d.dw.ptr(), d.db.get(), false, ws);
  CUDA_CHECK(cudaStreamSynchronize(s));
  return PassBytes{d.y.bytes(), d.dx.bytes(), d.dw.bytes(), d.db.bytes()};
}

void poison_outputs(ConvDevice& d, const ConvSpec& spec, std::int64_t w_elems) {
  d.y.upload(nan_vec(static_cast<std::size_t>(spec.y.elems())), 0.0f);
  d.dx.upload(nan_vec(static_cast<std::size_t>(spec.x.elems())), 0.0f);
  d.dw.upload(nan_vec(static_cast<std::size_t>(w_elems)));
  d.db.upload(nan_vec(static_cast<std::size_t>(spec.y.c)));
}

void upload_inputs(ConvDevice& d, const ConvData& h) {
  d.x.upload(h.x, 0.0f);
  d.dy.upload(h.dy, 0.0f);
  d.w.upload(h.w);
  d.b.upload(h.b);
}

class GpuConvBig : public ::testing::TestWithParam<std::tuple<ConvCase, Layout>> {};

TEST_P(GpuConvBig, DeterministicModeIsBitIdentical) {
  RN_SKIP_WITHOUT_GPU();
  const auto& [k, layout] = GetParam();
  const ConvSpec spec = make_spec(k, layout);
  ConvOp op(spec);
  choose(op, Search::Graph, true);
  print_algos(fmt::format("{} {} deterministic", k.name, layout_name(layout)), op);
  for (ConvPass p : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
    EXPECT_NE(op.describe(p).find(", deterministic"), std::string::npos) << op.describe(p);
    if (k.groups == 1) {
      EXPECT_TRUE(op.uses_graph(p)) << op.describe(p);
    }
  }
  DeviceBuffer ws(op.workspace_bytes());
  Stream stream;
  const ConvData h(spec, op.weight_elems(), 77);
  ConvDevice d(spec, op.weight_elems());
  upload_inputs(d, h);
  poison_outputs(d, spec, op.weight_elems());
  const PassBytes a = run_all(op, d, ws.workspace(), stream.get());
  poison_outputs(d, spec, op.weight_elems());
  const PassBytes b = run_all(op, d, ws.workspace(), stream.get());
  EXPECT_TRUE(a.y == b.y) << "forward differs between runs";
  EXPECT_TRUE(a.dx == b.dx) << "backward data differs between runs";
  EXPECT_TRUE(a.dw == b.dw) << "backward filter differs between runs";
  EXPECT_TRUE(a.db == b.db) << "bias gradient differs between runs";
}

TEST_P(GpuConvBig, GraphReplayMatchesDirectBitForBit) {
  RN_SKIP_WITHOUT_GPU();
  const auto& [k, layout] = GetParam();
  const ConvSpec spec = make_spec(k, layout);
  ConvOp op(spec);
  choose(op, Search::Graph, true);
  DeviceBuffer ws(op.workspace_bytes());
  Stream stream;
  const ConvData h(spec, op.weight_elems(), 91);
  ConvDevice d(spec, op.weight_elems());
  upload_inputs(d, h);
  poison_outputs(d, spec, op.weight_elems());
  const PassBytes direct = run_all(op, d, ws.workspace(), stream.get());  // also the warm-up before capture

  poison_outputs(d, spec, op.weight_elems());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  op.forward(stream.get(), d.x.ref(spec.x), d.w.ptr(), d.b.get(), d.y.ref(spec.y), ws.workspace());
  op.backward_data(stream.get(), d.dy.ref(spec.y), d.w.ptr(), d.dx.ref(spec.x), false, ws.workspace());
  op.backward_filter(stream.get(), d.x.ref(spec.x), d.dy.ref(spec.y), d.dw.ptr(), d.db.get(), false, ws.workspace());
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison_outputs(d, spec, op.weight_elems());
    ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
    stream.sync();
    EXPECT_TRUE(d.y.bytes() == direct.y) << "forward, replay " << replay;
    EXPECT_TRUE(d.dx.bytes() == direct.dx) << "backward data, replay " << replay;
    EXPECT_TRUE(d.dw.bytes() == direct.dw) << "backward filter, replay " << replay;
    EXPECT_TRUE(d.db.bytes() == direct.db) << "bias gradient, replay " << replay;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // The replayed results are also right, not merely repeatable.
  std::vector<float> ref(static_cast<std::size_t>(spec.y.elems()));
  cpu::conv2d_forward(h.x.data(), spec.x, h.w.data(), h.b.data(), ref.data(), spec.y, cpu_params(k));
  EXPECT_TRUE(close(d.y.download(), ref, tolerance(spec.dtype)));
}

std::string big_name(const ::testing::TestParamInfo<GpuConvBig::ParamType>& info) {
  return fmt::format("{}_{}", std::get<0>(info.param).name, layout_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Big, GpuConvBig,
                         ::testing::Combine(::testing::ValuesIn(kBig), ::testing::Values(Layout::F32, Layout::F16)),
                         big_name);

// ---- setup behaviour --------------------------------------------------------------------------------------------------

TEST(GpuConvSetup, IdenticalLayersShareOneSearch) {
  RN_SKIP_WITHOUT_GPU();
  const ConvCase k{"cache", 2, 11, 13, 8, 8, 3, 3, 1, 1, 1, 1, 1};
  ConvOp first(make_spec(k, Layout::F32));
  choose(first, Search::Find, false);
  const std::size_t entries = ConvOp::algo_cache_size();
  ConvOp second(make_spec(k, Layout::F32));
  choose(second, Search::Find, false);
  EXPECT_EQ(ConvOp::algo_cache_size(), entries);
  for (ConvPass p : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter})
    EXPECT_EQ(first.describe(p), second.describe(p));
}

TEST(GpuConvSetup, RespectsTheWorkspaceLimit) {
  RN_SKIP_WITHOUT_GPU();
  const ConvCase k{"limit", 8, 28, 28, 32, 64, 3, 3, 1, 1, 1, 1, 1};
  for (Search s : {Search::Find, Search::Heuristic}) {
    ConvOp op(make_spec(k, Layout::F16));
    choose(op, s, false, 1u << 20);
    print_algos(fmt::format("limit 1 MiB {}", search_name(s)), op);
    EXPECT_LE(op.workspace_bytes(ConvPass::Forward), 1u << 20);
    EXPECT_LE(op.workspace_bytes(ConvPass::BackwardData), 1u << 20);
  }
}

TEST(GpuConvSetup, RunTimeChecks) {
  RN_SKIP_WITHOUT_GPU();
  const ConvCase k{"checks", 2, 9, 7, 8, 16, 3, 3, 1, 1, 1, 1, 1};
  const ConvSpec spec = make_spec(k, Layout::F32);
  ConvOp op(spec);
  ConvDevice d(spec, op.weight_elems());
  {
    DeviceBuffer small(1u << 20);
    EXPECT_THROW(op.forward(nullptr, d.x.ref(spec.x), d.w.ptr(), nullptr, d.y.ref(spec.y), small.workspace()), Error)
        << "a pass before choose()";
  }
  choose(op, Search::Heuristic, false);
  DeviceBuffer ws(op.workspace_bytes());
  Shape wrong = spec.y;
  wrong.h += 1;
  EXPECT_THROW(op.forward(nullptr, d.x.ref(spec.x), d.w.ptr(), nullptr, d.y.ref(wrong), ws.workspace()), Error);
  TensorRef f16 = d.x.ref(spec.x);
  f16.dtype = DType::F16;
  EXPECT_THROW(op.forward(nullptr, f16, d.w.ptr(), nullptr, d.y.ref(spec.y), ws.workspace()), Error);
  if (op.workspace_bytes(ConvPass::BackwardFilter) > 0) {
    EXPECT_THROW(op.backward_filter(nullptr, d.x.ref(spec.x), d.dy.ref(spec.y), d.dw.ptr(), d.db.get(), false,
                                    Workspace{ws.get(), op.workspace_bytes(ConvPass::BackwardFilter) - 1}),
                 Error);
  }
  ConvSpec bad = spec;
  bad.y.w += 1;
  EXPECT_THROW(ConvOp{bad}, Error) << "an output shape the parameters do not give";
  bad = spec;
  bad.params.groups = 3;
  EXPECT_THROW(ConvOp{bad}, Error) << "channels not divisible by groups";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A choice saved to the engine cache's text and loaded into an empty cache is replayed without timing: the same
// engines, the same bits.
TEST(GpuConvSetup, EngineCacheReplaysTheSameEnginesBitForBit) {
  RN_SKIP_WITHOUT_GPU();
  const ConvCase k{"replay", 4, 28, 28, 64, 64, 3, 3, 1, 1, 1, 1, 1};
  const ConvSpec spec = make_spec(k, Layout::F16);
  EngineCache& cache = EngineCache::global();
  ConvOp first(spec);
  choose(first, Search::Graph, true);
  const std::string text = cache.serialize();
  DeviceBuffer ws(first.workspace_bytes());
  Stream stream;
  const ConvData h(spec, first.weight_elems(), 5);
  ConvDevice d(spec, first.weight_elems());
  upload_inputs(d, h);
  poison_outputs(d, spec, first.weight_elems());
  const PassBytes a = run_all(first, d, ws.workspace(), stream.get());

  cache.clear();
  std::string error;
  ASSERT_TRUE(cache.merge(text, &error)) << error;
  const std::size_t entries = cache.size();
  ConvOp second(spec);
  choose(second, Search::Graph, true);
  EXPECT_EQ(cache.size(), entries) << "a replayed choice must not be timed again";
  EXPECT_GT(cache.hits(), 0u);
  for (ConvPass p : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter})
    EXPECT_EQ(first.engine_label(p), second.engine_label(p));
  DeviceBuffer ws2(second.workspace_bytes());
  poison_outputs(d, spec, second.weight_elems());
  const PassBytes b = run_all(second, d, ws2.workspace(), stream.get());
  EXPECT_TRUE(a.y == b.y && a.dx == b.dx && a.dw == b.dw) << "the replayed engines give other bits";
}

// A corrupted entry (an engine id that does not exist) is not trusted: the pass is chosen afresh.
TEST(GpuConvSetup, AnUnusableCachedChoiceIsChosenAgain) {
  RN_SKIP_WITHOUT_GPU();
  const ConvCase k{"stale", 2, 12, 12, 16, 16, 3, 3, 1, 1, 1, 1, 1};
  const ConvSpec spec = make_spec(k, Layout::F32);
  EngineCache& cache = EngineCache::global();
  cache.clear();
  ConvOp first(spec);
  choose(first, Search::Graph, true);
  std::string text = cache.serialize();
  // every graph entry's engine id → 99999
  std::string bad;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    std::vector<std::string> f;
    std::size_t a = 0;
    for (std::size_t b; (b = line.find('\t', a)) != std::string::npos; a = b + 1) f.push_back(line.substr(a, b - a));
    f.push_back(line.substr(a));
    if (f.size() == 12 && f[1] == "graph") f[3] = "99999";
    std::string joined;
    for (std::size_t i = 0; i < f.size(); ++i) joined += (i ? "\t" : "") + f[i];
    bad += joined + "\n";
  }
  cache.clear();
  std::string error;
  ASSERT_TRUE(cache.merge(bad, &error)) << error;
  ConvOp second(spec);
  choose(second, Search::Graph, true);
  for (ConvPass p : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter})
    EXPECT_NE(second.describe(p).find("cached choice not usable"), std::string::npos) << second.describe(p);
}

}  // namespace
}  // namespace renaissance::cuda::test
