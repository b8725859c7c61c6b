// cudnn-frontend graphs for the three convolution passes (conv_graph.h). The only translation unit that includes
// cudnn_frontend.h.
#include <kernels/cuda/conv.h>
#include <kernels/cuda/conv_graph.h>

#include <cudnn_frontend.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <unordered_map>

namespace renaissance::cuda {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

// Tensor uids of the variant pack.
enum : std::int64_t { kUidX = 1, kUidW = 2, kUidY = 3, kUidOld = 4, kUidSum = 5, kUidSqSum = 6 };

std::vector<std::int64_t> nhwc_dims(const Shape& s) { return {s.n, s.c, s.h, s.w}; }
/// cuDNN's (n, c, h, w) strides of an NHWC tensor with `cs` elements per (n, h, w) row.
std::vector<std::int64_t> nhwc_strides(const Shape& s, std::int64_t cs) { return {s.h * s.w * cs, 1, s.w * cs, cs}; }

std::string fe_message(fe::error_t e) { return e.get_message(); }

}  // namespace

struct GraphConv::Impl {
  GraphConvDesc d;
  bool fallback = false;
  fe::graph::Graph graph;
  std::string validate_error;  ///< non-empty: the graph itself is not valid for cuDNN
  bool queried = false;
  std::vector<std::int64_t> workspaces;  ///< per built candidate, -1 until built

  std::vector<std::int64_t> w_dims() const {
    return {d.y.c, d.x.c / d.groups, d.kernel_h, d.kernel_w};
  }
  std::vector<std::int64_t> w_strides() const {
    const std::int64_t cg = d.x.c / d.groups;
    return {d.kernel_h * d.kernel_w * cg, 1, d.kernel_w * cg, cg};
  }
  TensorPtr tensor(std::int64_t uid, const char* name, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides) {
    return graph.tensor(fe::graph::Tensor_attributes().set_uid(uid).set_name(name).set_dim(std::move(dims)).set_stride(
        std::move(strides)));
  }
  /// The pass's result: the conv output itself, or (accumulate) old + result through a pointwise add.
  void output(TensorPtr r, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides, std::int64_t uid) {
    r->set_dim(dims).set_stride(strides);
    if (!d.accumulate) {
      r->set_output(true).set_uid(uid);
      return;
    }
    TensorPtr old = tensor(kUidOld, "old", dims, strides);
    TensorPtr sum = graph.pointwise(
        r, old,
        fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD).set_compute_data_type(fe::DataType_t::FLOAT));
    sum->set_output(true).set_uid(uid).set_dim(std::move(dims)).set_stride(std::move(strides));
  }

  void make() {
    const fe::DataType_t io = d.dtype == DType::F16 ? fe::DataType_t::HALF : fe::DataType_t::FLOAT;
    graph.set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
        fe::DataType_t::FLOAT);
    const std::vector<std::int64_t> pad{d.pad_h, d.pad_w}, stride{d.stride_h, d.stride_w}, dil{1, 1};
    switch (d.pass) {
      case ConvPass::Forward: {
        TensorPtr x = tensor(kUidX, "x", nhwc_dims(d.x), nhwc_strides(d.x, d.x_cs));
        TensorPtr w = tensor(kUidW, "w", w_dims(), w_strides());
        TensorPtr y = graph.conv_fprop(
            x, w, fe::graph::Conv_fprop_attributes().set_padding(pad).set_stride(stride).set_dilation(dil));
        y->set_output(true).set_uid(kUidY).set_dim(nhwc_dims(d.y)).set_stride(nhwc_strides(d.y, d.y_cs));
        if (d.genstats) {  // Σy, Σy² per channel of the stored y: FP32 {1, C, 1, 1}
          const auto stats = graph.genstats(y, fe::graph::Genstats_attributes().set_name("stats"));
          const std::int64_t c = d.y.c;
          for (std::size_t k = 0; k < 2; ++k)
            stats[k]
                ->set_output(true)
                .set_uid(k == 0 ? kUidSum : kUidSqSum)
                .set_data_type(fe::DataType_t::FLOAT)
                .set_dim({1, c, 1, 1})
                .set_stride({c, 1, c, c});
        }
        break;
      }
      case ConvPass::BackwardData: {
        TensorPtr dy = tensor(kUidY, "dy", nhwc_dims(d.y), nhwc_strides(d.y, d.y_cs));
        TensorPtr w = tensor(kUidW, "w", w_dims(), w_strides());
        TensorPtr dx = graph.conv_dgrad(
            dy, w, fe::graph::Conv_dgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dil));
        output(dx, nhwc_dims(d.x), nhwc_strides(d.x, d.x_cs), kUidX);
        break;
      }
      case ConvPass::BackwardFilter: {
        TensorPtr dy = tensor(kUidY, "dy", nhwc_dims(d.y), nhwc_strides(d.y, d.y_cs));
        TensorPtr x = tensor(kUidX, "x", nhwc_dims(d.x), nhwc_strides(d.x, d.x_cs));
        TensorPtr dw = graph.conv_wgrad(
            dy, x, fe::graph::Conv_wgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dil));
        output(dw, w_dims(), w_strides(), kUidW);
        break;
      }
    }
    if (d.genstats && (d.pass != ConvPass::Forward || d.dtype != DType::F16)) {
      validate_error = "genstats: forward passes with FP16 storage only";
      return;
    }
    if (d.genstats && d.deterministic) {
      // cuDNN marks none of its GEN_STATS plans NONDETERMINISTIC, yet every one tried gave other sums (and so other
      // bits downstream) from run to run on an H100 with cuDNN 9.14 (GpuConvEngines.Genstats*, docs/design.md).
      validate_error = "genstats: no GEN_STATS plan repeats its bits, so none is offered in deterministic mode";
      return;
    }
    const fe::error_t e = graph.validate();
    if (e.is_bad()) validate_error = "validate: " + fe_message(e);
  }
};

GraphConv::GraphConv(const GraphConvDesc& desc, bool fallback_heuristics) : m(std::make_unique<Impl>()) {
  m->d = desc;
  m->fallback = fallback_heuristics;
  m->make();
}

GraphConv::~GraphConv() = default;

const GraphConvDesc& GraphConv::desc() const { return m->d; }

int GraphConv::query(cudnnHandle_t handle, std::string* why) {
  Impl& s = *m;
  if (!s.validate_error.empty()) {
    *why = s.validate_error;
    return 0;
  }
  fe::error_t e = s.graph.build_operation_graph(handle);
  if (e.is_bad()) {
    *why = "build_operation_graph: " + fe_message(e);
    return 0;
  }
  // RN_DEBUG_ENGINE_HEURISTICS=AB: heuristics modes A and B's lists, concatenated (an experiment knob)
  std::vector<fe::HeurMode_t> modes{s.fallback ? fe::HeurMode_t::FALLBACK : fe::HeurMode_t::A};
  if (const char* h = std::getenv("RN_DEBUG_ENGINE_HEURISTICS"); h != nullptr && !s.fallback && std::string(h) == "AB")
    modes.push_back(fe::HeurMode_t::B);
  e = s.graph.create_execution_plans(modes);
  if (e.is_bad()) {
    *why = fmt::format("heuristics {}: {}", s.fallback ? "FALLBACK" : "A", fe_message(e));
    return 0;
  }
  s.queried = true;
  std::vector<fe::NumericalNote_t> barred{fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION};
  if (s.d.deterministic) barred.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
  if (s.d.dtype == DType::F32 && s.d.strict_fp32)
    for (fe::NumericalNote_t n : {fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::DOWN_CONVERT_INPUTS,
                                  fe::NumericalNote_t::FFT, fe::NumericalNote_t::WINOGRAD,
                                  fe::NumericalNote_t::WINOGRAD_TILE_4x4, fe::NumericalNote_t::WINOGRAD_TILE_6x6,
                                  fe::NumericalNote_t::WINOGRAD_TILE_13x13})
      barred.push_back(n);
  s.graph.deselect_numeric_notes(barred);
  s.graph.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  s.graph.deselect_workspace_greater_than(static_cast<std::int64_t>(s.d.workspace_limit));
  const auto n = static_cast<int>(s.graph.get_execution_plan_count());
  s.workspaces.assign(static_cast<std::size_t>(n), -1);
  if (n == 0) *why = fmt::format("heuristics {} offered no engine", s.fallback ? "FALLBACK" : "A");
  return n;
}

int GraphConv::candidates() const { return static_cast<int>(m->workspaces.size()); }

bool GraphConv::build(int i, std::string* why) {
  Impl& s = *m;
  if (i < 0 || i >= candidates()) {
    *why = fmt::format("no candidate {}", i);
    return false;
  }
  const fe::error_t e = s.graph.build_plan_at_index(i);
  if (e.is_bad()) {
    *why = fe_message(e);
    return false;
  }
  std::int64_t ws = 0;
  const fe::error_t w = s.graph.get_workspace_size_plan_at_index(i, ws);
  if (w.is_bad() || ws < 0 || static_cast<std::size_t>(ws) > s.d.workspace_limit) {
    *why = w.is_bad() ? fe_message(w) : fmt::format("needs {} bytes of workspace", ws);
    return false;
  }
  s.workspaces[static_cast<std::size_t>(i)] = ws;
  return true;
}

int GraphConv::find(const EngineConfig& c) const {
  // cuDNN's tag names every knob exactly; the (engine, knobs) pairs do not always (EngineConfig::exact).
  if (!c.name.empty()) {
    for (int i = 0; i < candidates(); ++i) {
      const EngineConfig got = config(i);
      if (got.engine == c.engine && got.name == c.name) return i;
    }
    return -1;
  }
  if (!c.exact()) return -1;
  EngineConfig want = c;
  std::sort(want.knobs.begin(), want.knobs.end());
  for (int i = 0; i < candidates(); ++i) {
    const EngineConfig got = config(i);
    if (got.engine == want.engine && got.exact() && got.knobs == want.knobs) return i;
  }
  return -1;
}

int GraphConv::replay(cudnnHandle_t handle, const EngineConfig& config, std::string* why) {
  Impl& s = *m;
  if (!s.validate_error.empty()) {
    *why = s.validate_error;
    return -1;
  }
  if (!s.queried) {
    fe::error_t e = s.graph.build_operation_graph(handle);
    if (e.is_bad()) {
      *why = "build_operation_graph: " + fe_message(e);
      return -1;
    }
    s.queried = true;
  }
  if (!config.exact()) {
    *why = fmt::format("{} has knobs cudnn-frontend {}.{}.{} has no name for, so it cannot be rebuilt from its knobs",
                       config.name.empty() ? fmt::format("eng{}", config.engine) : config.name,
                       CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
    return -1;
  }
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  for (const auto& [type, value] : config.knobs) knobs[static_cast<fe::KnobType_t>(type)] = value;
  const fe::error_t e = s.graph.create_execution_plan(config.engine, knobs);
  if (e.is_bad()) {
    *why = "create_execution_plan: " + fe_message(e);
    return -1;
  }
  const auto i = static_cast<int>(s.graph.get_execution_plan_count()) - 1;
  s.workspaces.resize(static_cast<std::size_t>(i + 1), -1);
  return build(i, why) ? i : -1;
}

EngineConfig GraphConv::config(int i) const {
  EngineConfig c;
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  if (m->graph.get_engine_and_knobs_at_index(i, c.engine, knobs).is_bad()) c.engine = -1;
  for (const auto& [type, value] : knobs) c.knobs.emplace_back(static_cast<std::int64_t>(type), value);
  if (m->graph.get_plan_name_at_index(i, c.name).is_bad()) c.name.clear();
  // Backend knob types cudnn-frontend has no name for all come back as NOT_SET, one of them kept: such a config
  // is marked by a NOT_SET knob, and a tag with more knobs than the pairs is marked the same way.
  const auto tagged = static_cast<std::size_t>(std::count(c.name.begin(), c.name.end(), '='));
  if (!c.name.empty() && tagged != c.knobs.size() && c.exact()) c.knobs.emplace_back(0, -1);
  std::sort(c.knobs.begin(), c.knobs.end());
  return c;
}

std::int64_t GraphConv::workspace(int i) const {
  return i >= 0 && i < candidates() ? m->workspaces[static_cast<std::size_t>(i)] : -1;
}

void GraphConv::execute(cudnnHandle_t handle, int i, const void* x, const void* w, const void* y, void* workspace,
                        float* sum, float* sqsum) const {
  std::unordered_map<std::int64_t, void*> pack{{kUidX, const_cast<void*>(x)}, {kUidW, const_cast<void*>(w)},
                                               {kUidY, const_cast<void*>(y)}};
  if (m->d.accumulate) pack[kUidOld] = const_cast<void*>(m->d.pass == ConvPass::BackwardData ? x : w);
  if (m->d.genstats) {
    RN_CHECK(sum != nullptr && sqsum != nullptr, "a genstats convolution needs its sum and sqsum outputs");
    pack[kUidSum] = sum;
    pack[kUidSqSum] = sqsum;
  }
  const fe::error_t e = m->graph.execute_plan_at_index(handle, pack, workspace, i);
  RN_CHECK(e.is_good(), "cuDNN graph execution failed: {}", fe_message(e));
}

std::string cudnn_frontend_version() {
  return fmt::format("cudnn-frontend {}.{}.{}", CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
}

}  // namespace renaissance::cuda
