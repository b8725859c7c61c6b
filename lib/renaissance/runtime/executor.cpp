#include <renaissance/core/error.h>
#include <renaissance/runtime/executor.h>

#include <fmt/format.h>

#include <renaissance/core/log.h>
#include <renaissance/runtime/fused_match.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/runtime_api.h>
#endif

namespace renaissance::runtime {

using plan::GraphId;

const KernelTable& KernelTable::for_backend(Backend b) {
  static const KernelTable cpu = [] {
    KernelTable t;
    register_cpu_ops(t);
    return t;
  }();
  if (b == Backend::CPU) return cpu;
#ifdef RENAISSANCE_HAVE_CUDA
  static const KernelTable gpu = [] {
    KernelTable t;
    register_cuda_ops(t);
    return t;
  }();
  return gpu;
#else
  RN_FAIL("this build has no CUDA backend (configure with -DRENAISSANCE_CUDA=ON on a machine with the toolkit)");
#endif
}

void KernelTable::add_compute(plan::OpKind op, OpFn fn, PrepareFn prepare) {
  RN_CHECK(!m_compute.count(op), "kernel for {} registered twice", plan::op_kind_name(op));
  m_compute[op] = std::move(fn);
  if (prepare) m_compute_prepare[op] = std::move(prepare);
}
void KernelTable::add_range(plan::RangeOp op, OpFn fn, PrepareFn prepare) {
  RN_CHECK(!m_range.count(op), "range kernel for {} registered twice", plan::range_op_name(op));
  m_range[op] = std::move(fn);
  if (prepare) m_range_prepare[op] = std::move(prepare);
}
void KernelTable::prepare(ResolvedNode& r, ExecEnv& env) const {
  for (ResolvedNode& s : r.sub) prepare(s, env);
  if (r.node->type == plan::NodeType::RANGE) {
    if (auto it = m_range_prepare.find(r.node->range_op); it != m_range_prepare.end()) it->second(r, env);
  } else if (auto it = m_compute_prepare.find(r.node->op); it != m_compute_prepare.end()) {
    it->second(r, env);
  }
}
const OpFn& KernelTable::compute(plan::OpKind op) const {
  auto it = m_compute.find(op);
  RN_CHECK(it != m_compute.end(), "the {} backend has no kernel for {}", backend_name(backend), plan::op_kind_name(op));
  return it->second;
}
const OpFn& KernelTable::range(plan::RangeOp op) const {
  auto it = m_range.find(op);
  RN_CHECK(it != m_range.end(), "the {} backend has no kernel for {}", backend_name(backend), plan::range_op_name(op));
  return it->second;
}

namespace cuda_detail {
struct GraphHolder {
#ifdef RENAISSANCE_HAVE_CUDA
  std::unique_ptr<cuda::GraphExec> exec;
#endif
};
}  // namespace cuda_detail

CapturedGraph::CapturedGraph(std::vector<ResolvedNode> nodes, std::vector<const OpFn*> fns, std::string label,
                             Backend backend, ExecEnv& env)
    : m_nodes(std::move(nodes)), m_fns(std::move(fns)), m_label(std::move(label)), m_backend(backend) {
  if (m_backend != Backend::CUDA || m_nodes.empty()) return;
#ifdef RENAISSANCE_HAVE_CUDA
  m_graph = std::make_unique<cuda_detail::GraphHolder>();
  // Never time inside a capture (event records would become graph nodes): the timer is off while capturing.
  struct TimerOff {
    ExecEnv& env;
    OpTimer* saved;
    ~TimerOff() { env.timer = saved; }
  } timer_off{env, env.timer};
  env.timer = nullptr;
  try {
    // One plain run first: libraries load their kernels lazily, which must not happen inside a capture.
    // (Start-up only: the trainer initialises weights and clears metrics after every capture is made.)
    run_uncaptured(env);
    cuda::stream_synchronize(env.stream);
    m_graph->exec = cuda::GraphExec::capture(env.stream, [&] { run_uncaptured(env); });
  } catch (const Error& e) {
    throw e.with_context("capturing " + m_label);
  }
#else
  (void)env;
#endif
}

CapturedGraph::~CapturedGraph() = default;

void debug_poison_workspace(const char* label, ExecEnv& env) {
#ifdef RENAISSANCE_HAVE_CUDA
  static const std::string list = [] {
    const char* v = std::getenv("RN_DEBUG_POISON_WORKSPACE");
    return v == nullptr ? std::string() : "," + std::string(v) + ",";
  }();
  if (list.empty() || env.workspace == nullptr || env.workspace_bytes <= 0) return;
  if (list.find(",all,") == std::string::npos && list.find("," + std::string(label) + ",") == std::string::npos) return;
  static std::once_flag said;
  std::call_once(said,
                 [] { spdlog::warn("RN_DEBUG_POISON_WORKSPACE: workspaces are filled with NaN before kernels"); });
  cuda::fill_device_async(env.workspace, 0xFF, env.workspace_bytes, env.stream);
#else
  (void)label, (void)env;
#endif
}

void debug_hash_node(const std::string& graph, std::size_t index, const ResolvedNode& r, bool after, ExecEnv& env) {
#ifdef RENAISSANCE_HAVE_CUDA
  NodeHashes* h = env.node_hashes;
  if (h == nullptr) return;
  const plan::Node& n = *r.node;
  const std::string what = n.type == plan::NodeType::RANGE ? plan::range_op_name(n.range_op) : plan::op_kind_name(n.op);
  auto one = [&](const void* p, std::int64_t bytes, const char* dir, std::size_t k) {
    if (p == nullptr || bytes <= 0) return;
    const auto slot = static_cast<int>(h->labels.size());
    if (slot >= h->capacity) {
      static std::once_flag said;
      std::call_once(
          said, [&] { spdlog::warn("RN_DEBUG_NODE_HASHES: all {} slots taken, later nodes not hashed", h->capacity); });
      return;
    }
    cuda::hash_device_async(p, bytes, h->device + static_cast<std::ptrdiff_t>(slot) * cuda::kHashParts, env.stream);
    h->labels.push_back(
        fmt::format("{} #{} {} {} {}{} {}B", graph, index, what, r.layer.empty() ? "-" : r.layer, dir, k, bytes));
  };
  const std::vector<TensorView>& views = after ? r.out : r.in;
  for (std::size_t k = 0; k < views.size(); ++k) {
    if (!views[k]) continue;
    const auto [begin, end] = fused_match::extent(views[k]);  // the padded storage
    one(begin, end - begin, after ? "out" : "in", k);
  }
  const std::vector<RangeView>& ranges = after ? r.out_ranges : r.in_ranges;
  for (std::size_t k = 0; k < ranges.size(); ++k)
    one(ranges[k].ptr, ranges[k].bytes, after ? "out_range" : "in_range", k);
#else
  (void)graph, (void)index, (void)r, (void)after, (void)env;
#endif
}

void run_in_order(std::size_t count, const std::function<const plan::Node*(std::size_t)>& node_of,
                  const std::function<void(std::size_t)>& run, ExecEnv& env) {
  if (!env.streams || env.timer) {
    for (std::size_t i = 0; i < count; ++i) run(i);
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const plan::Node* a = node_of(i);
    const plan::Node* b = i + 1 < count ? node_of(i + 1) : nullptr;
    if (!a || !b || a->type != plan::NodeType::COMPUTE || b->type != plan::NodeType::COMPUTE ||
        !plan::runs_beside(a->op, b->op)) {
      run(i);
      continue;
    }
    env.streams->begin_side(env, SideStream::kWeightGrad);
    try {
      run(i);
    } catch (...) {
      env.streams->end_side(env, SideStream::kWeightGrad);
      throw;
    }
    env.streams->end_side(env, SideStream::kWeightGrad);
    run(++i);
    env.streams->join(env, SideStream::kWeightGrad);
  }
}

void CapturedGraph::run_uncaptured(ExecEnv& env) const {
  if (!env.timer) {
    run_in_order(
        m_nodes.size(), [&](std::size_t i) { return m_nodes[i].node; },
        [&](std::size_t i) {
          const plan::Node& n = *m_nodes[i].node;
          if (n.type == plan::NodeType::COMPUTE && n.op != plan::OpKind::FUSED_FWD && n.op != plan::OpKind::FUSED_BWD &&
              n.op != plan::OpKind::FUSED_INFER)
            debug_poison_workspace(plan::op_kind_name(n.op), env);
          debug_hash_node(m_label, i, m_nodes[i], false, env);
          (*m_fns[i])(m_nodes[i], env);
          debug_hash_node(m_label, i, m_nodes[i], true, env);
        },
        env);
    return;
  }
  // Profiling (`renaissance bench --profile`): every node bracketed by the timer, except FUSED_* nodes, whose
  // runners bracket each of their own steps.
  OpTimer& timer = *env.timer;
  timer.graph(m_label);
  for (std::size_t i = 0; i < m_nodes.size(); ++i) {
    const plan::Node& n = *m_nodes[i].node;
    const bool fused = n.type == plan::NodeType::COMPUTE &&
                       (n.op == plan::OpKind::FUSED_FWD || n.op == plan::OpKind::FUSED_BWD ||
                        n.op == plan::OpKind::FUSED_INFER);
    if (fused) {
      (*m_fns[i])(m_nodes[i], env);
      continue;
    }
    timer.begin(env, n.type == plan::NodeType::RANGE ? plan::range_op_name(n.range_op) : plan::op_kind_name(n.op),
                m_nodes[i].detail);
    (*m_fns[i])(m_nodes[i], env);
    timer.end(env);
  }
}

void CapturedGraph::replay(ExecEnv& env) const {
#ifdef RENAISSANCE_HAVE_CUDA
  if (m_graph) {
    m_graph->exec->launch(env.stream);
    return;
  }
#endif
  run_uncaptured(env);
}

ResolvedNode resolve(const plan::Node& n, const DeviceContext& ctx, plan::Variant v) {
  ResolvedNode r;
  r.node = &n;
  const auto& layers = ctx.plan().arch.layers;
  if (n.layer_index >= 0 && static_cast<std::size_t>(n.layer_index) < layers.size())
    r.layer = layers[static_cast<std::size_t>(n.layer_index)].name;
  for (TensorId id : n.inputs) r.in.push_back(ctx.view(id, v));
  for (TensorId id : n.outputs) r.out.push_back(ctx.view(id, v));
  for (RegionRange x : n.input_ranges) r.in_ranges.push_back(ctx.range(x, v));
  for (RegionRange x : n.output_ranges) r.out_ranges.push_back(ctx.range(x, v));
  for (const plan::Node& s : n.sub) r.sub.push_back(resolve(s, ctx, v));
  for (const plan::FusedPass& f : n.fusions) {
    const plan::FusedOperand* mask = plan::find_operand(f.inputs, "mask");
    if (mask == nullptr) mask = plan::find_operand(f.outputs, "mask");
    r.pass_masks.push_back(mask != nullptr ? ctx.view(mask->id, v) : TensorView{});
  }
  return r;
}

std::byte* BackendSession::host_alloc(std::int64_t bytes) {
  return static_cast<std::byte*>(std::calloc(static_cast<std::size_t>(bytes), 1));
}
void BackendSession::host_free(std::byte* p) noexcept { std::free(p); }
void BackendSession::upload_async(std::byte* dst, const std::byte* src, std::int64_t bytes) {
  std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

std::unique_ptr<BackendSession> open_backend(Backend b, ExecEnv& env, std::int64_t workspace_bytes, bool concurrent) {
  if (b == Backend::CPU) return std::make_unique<BackendSession>();
#ifdef RENAISSANCE_HAVE_CUDA
  return open_cuda_backend(env, workspace_bytes, concurrent);
#else
  (void)env, (void)workspace_bytes, (void)concurrent;
  RN_FAIL("this build has no CUDA backend (configure with -DRENAISSANCE_CUDA=ON on a machine with the toolkit)");
#endif
}

bool in_inference_graph(GraphId g) {
  switch (g) {
    case GraphId::INF_MAIN_A:
    case GraphId::INF_MAIN_B:
    case GraphId::INF_EMA_A:
    case GraphId::INF_EMA_B:
    case GraphId::CAST_E_TO_E16:
    case GraphId::ACCUM_METRICS_VAL_A:
    case GraphId::ACCUM_METRICS_VAL_B:
    case GraphId::VAL_RESULT_COMM:
    case GraphId::UPDATE_BN_INF_PARAMS: return true;
    default: return false;
  }
}

namespace {
// The signature of a resolved node list: every pointer, shape and byte count it touches.
void sign(const ResolvedNode& r, std::string& s) {
  auto t = [&s](const TensorView& v) {
    s += fmt::format("{}:{}:{}|", static_cast<const void*>(v.ptr), v.shape.str(), static_cast<int>(v.dtype));
  };
  s += fmt::format("n{}{}{}(", static_cast<int>(r.node->type), static_cast<int>(r.node->op),
                   static_cast<int>(r.node->range_op));
  for (const auto& v : r.in) t(v);
  for (const auto& v : r.out) t(v);
  for (const auto& x : r.in_ranges) s += fmt::format("{}+{}|", static_cast<const void*>(x.ptr), x.bytes);
  for (const auto& x : r.out_ranges) s += fmt::format("{}+{}|", static_cast<const void*>(x.ptr), x.bytes);
  for (const auto& x : r.sub) sign(x, s);
  s += ")";
}
}  // namespace

GraphAtlas::GraphAtlas(const DeviceContext& ctx, const KernelTable& table) : m_ctx(ctx), m_table(table) {}

std::vector<const CapturedGraph*> GraphAtlas::all() const {
  std::vector<const CapturedGraph*> out;
  for (const auto& [sig, g] : m_unique) out.push_back(g.get());
  return out;
}

const CapturedGraph& GraphAtlas::get(plan::Variant v, GraphId g, ExecEnv& env) {
  const auto key = std::make_pair(static_cast<int>(v), static_cast<int>(g));
  if (auto it = m_by_key.find(key); it != m_by_key.end()) return *it->second;
  const bool shared_bucket = g == GraphId::TRANSFER_A || g == GraphId::TRANSFER_B || g == GraphId::CLEAR_METRICS;
  const bool inference = in_inference_graph(g) || (shared_bucket && !plan::is_train_variant(v));
  const plan::ComputationGraph& graph = inference ? m_ctx.plan().inference : m_ctx.plan().train;
  RN_CHECK(inference || plan::is_train_variant(v), "variant '{}' has no train graph ({} requested)",
           plan::variant_name(v), plan::graph_id_name(g));
  std::vector<ResolvedNode> nodes;
  std::vector<const OpFn*> fns;
  std::string signature = fmt::format("{}:{}:", graph.name(), plan::graph_id_name(g));
  for (const plan::Node& n : graph.bucket(g)) {
    nodes.push_back(resolve(n, m_ctx, v));
    fns.push_back(n.type == plan::NodeType::RANGE ? &m_table.range(n.range_op) : &m_table.compute(n.op));
    sign(nodes.back(), signature);
  }
  auto it = m_unique.find(signature);
  if (it == m_unique.end()) {
    if (m_table.fuse_graph()) m_table.fuse_graph()(nodes, fns, env);
    for (ResolvedNode& r : nodes) m_table.prepare(r, env);
    auto cap = std::make_unique<CapturedGraph>(std::move(nodes), std::move(fns),
                                               fmt::format("{}/{}", plan::variant_name(v), plan::graph_id_name(g)),
                                               m_ctx.backend(), env);
    it = m_unique.emplace(signature, std::move(cap)).first;
  } else {
    ++m_dedup_hits;
  }
  m_by_key[key] = it->second.get();
  return *it->second;
}

}  // namespace renaissance::runtime
