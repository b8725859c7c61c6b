#include <renaissance/core/error.h>
#include <renaissance/ops/fused.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/profiler.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/runtime_api.h>
#endif

namespace renaissance::runtime {

namespace {
using Clock = std::chrono::steady_clock;
using Key = std::pair<int, int>;  // (subgraph index, kernel label index)

struct Sum {
  std::int64_t calls = 0;
  double ms = 0;
};

int intern(std::map<std::string, int>& index, std::vector<std::string>& names, const std::string& s) {
  auto it = index.find(s);
  if (it != index.end()) return it->second;
  names.push_back(s);
  return index.emplace(s, static_cast<int>(names.size()) - 1).first->second;
}

void sort_rows(std::vector<ProfileRow>& rows) {
  std::sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) {
    if (a.ms_per_step != b.ms_per_step) return a.ms_per_step > b.ms_per_step;
    return std::tie(a.graph, a.label) < std::tie(b.graph, b.label);
  });
}
}  // namespace

struct StepProfiler::Impl {
  Backend backend;
  std::map<std::string, int> graph_index, what_index, detail_index;
  std::vector<std::string> graphs, whats, details;
  int current_graph = -1;
  std::map<Key, Sum> sums;
  std::map<Key, Sum> detail_sums;  // (kernel label, detail) -> the same brackets again, per node detail

  struct Open {
    Key key;
    int detail = -1;
    Clock::time_point t0;  // CPU
    std::size_t event = 0;  // CUDA: index of the begin event
  };
  std::vector<Open> open;

  // CUDA: a pool of timing events, reused every step; the brackets of the running step wait in `pending`.
  std::vector<void*> events;
  std::size_t next_event = 0;
  struct Pending {
    Key key;
    int detail = -1;
    std::size_t begin = 0, end = 0;
  };
  std::vector<Pending> pending;

  explicit Impl(Backend b) : backend(b) {
#ifndef RENAISSANCE_HAVE_CUDA
    RN_CHECK(b == Backend::CPU, "this build has no CUDA backend to profile");
#endif
  }
  ~Impl() {
#ifdef RENAISSANCE_HAVE_CUDA
    for (void* e : events) cuda::event_destroy(e);
#endif
  }

  /// Records the next event of the pool on `stream` (created on first use); returns its index.
  std::size_t record(void* stream) {
#ifdef RENAISSANCE_HAVE_CUDA
    if (next_event == events.size()) events.push_back(cuda::event_create_timed());
    cuda::event_record(events[next_event], stream);
    return next_event++;
#else
    (void)stream;
    RN_FAIL("this build has no CUDA backend to profile");
#endif
  }

  void add(Key k, int detail, double ms) {
    Sum& s = sums[k];
    ++s.calls;
    s.ms += ms;
    if (detail >= 0) {
      Sum& d = detail_sums[{k.second, detail}];
      ++d.calls;
      d.ms += ms;
    }
  }
};

StepProfiler::StepProfiler(Backend backend) : m(std::make_unique<Impl>(backend)) {}
StepProfiler::~StepProfiler() = default;

void StepProfiler::graph(const std::string& label) { m->current_graph = intern(m->graph_index, m->graphs, label); }

void StepProfiler::begin(ExecEnv& env, const std::string& what, const std::string& detail) {
  if (m->current_graph < 0) m->current_graph = intern(m->graph_index, m->graphs, "(no subgraph)");
  Impl::Open o;
  o.key = {m->current_graph, intern(m->what_index, m->whats, what)};
  if (!detail.empty()) o.detail = intern(m->detail_index, m->details, detail);
  if (m->backend == Backend::CUDA) {
    o.event = m->record(env.stream);
    m->open.push_back(o);
  } else {
    m->open.push_back(o);
    m->open.back().t0 = Clock::now();  // last: the bookkeeping above is not timed
  }
}

void StepProfiler::end(ExecEnv& env) {
  const Clock::time_point t1 = Clock::now();  // first: the bookkeeping below is not timed
  RN_CHECK(!m->open.empty(), "internal: OpTimer::end without a begin");
  const Impl::Open o = m->open.back();
  m->open.pop_back();
  if (m->backend == Backend::CUDA) {
    m->pending.push_back({o.key, o.detail, o.event, m->record(env.stream)});
  } else {
    m->add(o.key, o.detail, std::chrono::duration<double, std::milli>(t1 - o.t0).count());
  }
}

void StepProfiler::finish_step() {
  RN_CHECK(m->open.empty(), "internal: {} profiling bracket(s) left open at the end of a step", m->open.size());
#ifdef RENAISSANCE_HAVE_CUDA
  for (const Impl::Pending& p : m->pending)
    m->add(p.key, p.detail, static_cast<double>(cuda::event_elapsed_ms(m->events[p.begin], m->events[p.end])));
#endif
  m->pending.clear();
  m->next_event = 0;
  m->current_graph = -1;
}

ProfileResult StepProfiler::result(std::int64_t steps) const {
  RN_CHECK(steps >= 1, "a profile needs at least one step");
  const double n = static_cast<double>(steps);
  ProfileResult r;
  r.steps = steps;
  std::map<int, Sum> per_graph, per_what;
  double total = 0;
  for (const auto& [k, s] : m->sums) {
    for (Sum* agg : {&per_graph[k.first], &per_what[k.second]}) {
      agg->calls += s.calls;
      agg->ms += s.ms;
    }
    total += s.ms;
  }
  r.total_ms_per_step = total / n;
  auto row = [&](std::string label, std::string graph, const Sum& s) {
    ProfileRow x;
    x.label = std::move(label);
    x.graph = std::move(graph);
    x.calls_per_step = static_cast<double>(s.calls) / n;
    x.ms_per_step = s.ms / n;
    x.percent = total > 0 ? 100.0 * s.ms / total : 0.0;
    return x;
  };
  for (const auto& [g, s] : per_graph) r.graphs.push_back(row(m->graphs[static_cast<std::size_t>(g)], "", s));
  for (const auto& [w, s] : per_what) r.kernels.push_back(row(m->whats[static_cast<std::size_t>(w)], "", s));
  for (const auto& [k, s] : m->sums)
    r.graph_kernels.push_back(
        row(m->whats[static_cast<std::size_t>(k.second)], m->graphs[static_cast<std::size_t>(k.first)], s));
  for (const auto& [k, s] : m->detail_sums)
    r.details.push_back(
        row(m->details[static_cast<std::size_t>(k.second)], m->whats[static_cast<std::size_t>(k.first)], s));
  sort_rows(r.graphs);
  sort_rows(r.kernels);
  sort_rows(r.graph_kernels);
  sort_rows(r.details);
  return r;
}

std::map<std::string, PassTraffic> fused_pass_traffic(const plan::CompiledPlan& p, bool stats_from_convs) {
  std::map<std::string, PassTraffic> out;
  if (!p.config.fuse_kernels) return out;
  const plan::MemoryPlan& m = p.plan(plan::Variant::TRAIN_BASE);
  std::set<std::vector<TensorId>> seen;  // (kind, operands): the A/B copies of the first layer's passes once
  for (int gi = 0; gi < plan::kGraphIds; ++gi) {
    for (const plan::Node& n : p.train.bucket(static_cast<plan::GraphId>(gi))) {
      for (const plan::FusedPass& f : n.fusions) {
        if (f.fallback_only || (stats_from_convs && f.kind == ops::FusedKind::BN_STATS)) continue;
        std::vector<TensorId> key{static_cast<TensorId>(f.kind)};
        double bytes = 0;
        for (const auto* v : {&f.inputs, &f.outputs})
          for (const plan::FusedOperand& o : *v) {
            key.push_back(o.id);
            if (o.id != kNoTensor) bytes += static_cast<double>(m.tensor(o.id).bytes());
          }
        if (!seen.insert(key).second) continue;
        PassTraffic& t = out[ops::fused_kind_label(f.kind)];
        ++t.passes;
        t.bytes += bytes;
      }
    }
  }
  return out;
}

}  // namespace renaissance::runtime
