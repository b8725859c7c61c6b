#include <kernels/cuda/engine_cache.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace renaissance::cuda {

namespace {

constexpr const char* kHeader = "# renaissance engine cache, format 1";
constexpr int kFields = 12;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool to_i64(const std::string& s, std::int64_t* v) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *v = x;
  return true;
}

bool to_float(const std::string& s, float* v) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const float x = std::strtof(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *v = x;
  return true;
}

const char* api_name(EngineChoice::Api a) {
  switch (a) {
    case EngineChoice::Api::Graph: return "graph";
    case EngineChoice::Api::Legacy: return "legacy";
    case EngineChoice::Api::Own: return "own";
  }
  return "?";
}

}  // namespace

std::string EngineChoice::str() const {
  std::string s = api == Api::Graph ? fmt::format("graph {}", graph.name.empty() ? "?" : graph.name)
                  : api == Api::Own ? std::string("own depthwise")
                                    : fmt::format("legacy algo {}{}", algo, fallback ? " (fallback)" : "");
  if (staged) s += " staged";
  if (time_ms >= 0) s += fmt::format(" ({:.3f} ms)", time_ms);
  return s;
}

EngineCache& EngineCache::global() {
  static EngineCache* cache = new EngineCache();  // never destroyed: used until exit
  return *cache;
}

std::optional<EngineChoice> EngineCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_entries.find(key);
  if (it == m_entries.end()) return std::nullopt;
  return it->second;
}

void EngineCache::put(const std::string& key, const EngineChoice& choice) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_entries[key] = choice;
  ++m_unsaved;
}

std::size_t EngineCache::size() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_entries.size();
}

std::size_t EngineCache::unsaved() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_unsaved;
}

void EngineCache::mark_saved() {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_unsaved = 0;
}

void EngineCache::clear() {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_entries.clear();
  m_unsaved = m_hits = m_misses = m_rejected = 0;
  m_first_rejection.clear();
}

std::size_t EngineCache::hits() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_hits;
}
std::size_t EngineCache::misses() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_misses;
}
void EngineCache::reject(const std::string& why) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_rejected++ == 0) m_first_rejection = why;
}
std::size_t EngineCache::rejected() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_rejected;
}
std::string EngineCache::first_rejection() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_first_rejection;
}
void EngineCache::count(bool hit) {
  std::lock_guard<std::mutex> lock(m_mutex);
  ++(hit ? m_hits : m_misses);
}

std::string EngineCache::serialize() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  std::string out = std::string(kHeader) + "\n";
  for (const auto& [key, c] : m_entries) {
    std::string knobs;
    for (const auto& [t, v] : c.graph.knobs) knobs += fmt::format("{}{}={}", knobs.empty() ? "" : ",", t, v);
    out += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", key, api_name(c.api), c.staged ? 1 : 0,
                       c.graph.engine, knobs.empty() ? "-" : knobs, c.graph.name.empty() ? "-" : c.graph.name, c.algo,
                       c.math, c.deterministic ? 1 : 0, c.time_ms, c.workspace, c.fallback ? 1 : 0);
  }
  return out;
}

bool EngineCache::merge(const std::string& text, std::string* error) {
  std::map<std::string, EngineChoice> parsed;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto fail = [&](const std::string& why) {
    *error = fmt::format("line {}: {}", lineno, why);
    return false;
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (lineno == 1) {
      if (line != kHeader) return fail(fmt::format("expected the header '{}'", kHeader));
      continue;
    }
    if (line.empty()) continue;
    const std::vector<std::string> f = split(line, '\t');
    if (static_cast<int>(f.size()) != kFields) return fail(fmt::format("{} fields, expected {}", f.size(), kFields));
    EngineChoice c;
    if (f[0].empty()) return fail("empty key");
    if (f[1] == "graph")
      c.api = EngineChoice::Api::Graph;
    else if (f[1] == "legacy")
      c.api = EngineChoice::Api::Legacy;
    else if (f[1] == "own")
      c.api = EngineChoice::Api::Own;
    else
      return fail(fmt::format("api '{}' (graph, legacy or own)", f[1]));
    std::int64_t staged = 0, algo = 0, math = 0, det = 0, fallback = 0;
    if (!to_i64(f[2], &staged) || staged < 0 || staged > 1) return fail("staged must be 0 or 1");
    c.staged = staged == 1;
    if (!to_i64(f[3], &c.graph.engine) || c.graph.engine < -1) return fail("bad engine id");
    if (f[4] != "-")
      for (const std::string& kv : split(f[4], ',')) {
        const std::vector<std::string> p = split(kv, '=');
        std::int64_t t = 0, v = 0;
        if (p.size() != 2 || !to_i64(p[0], &t) || !to_i64(p[1], &v) || t < 0) return fail("bad knob '" + kv + "'");
        c.graph.knobs.emplace_back(t, v);
      }
    c.graph.name = f[5] == "-" ? "" : f[5];
    if (!to_i64(f[6], &algo) || algo < -1 || algo > 64) return fail("bad legacy algorithm");
    if (!to_i64(f[7], &math) || math < 0 || math > 16) return fail("bad math type");
    c.algo = static_cast<int>(algo);
    c.math = static_cast<int>(math);
    if (!to_i64(f[8], &det) || det < 0 || det > 1) return fail("deterministic must be 0 or 1");
    c.deterministic = det == 1;
    if (!to_float(f[9], &c.time_ms)) return fail("bad time");
    if (!to_i64(f[10], &c.workspace) || c.workspace < 0) return fail("bad workspace size");
    if (!to_i64(f[11], &fallback) || fallback < 0 || fallback > 1) return fail("fallback must be 0 or 1");
    c.fallback = fallback == 1;
    if (c.api == EngineChoice::Api::Graph && !c.graph.valid()) return fail("a graph entry without an engine");
    if (c.api == EngineChoice::Api::Legacy && c.algo < 0) return fail("a legacy entry without an algorithm");
    if (c.api == EngineChoice::Api::Own && (c.staged || c.workspace != 0))
      return fail("an own-kernel entry is never staged and needs no workspace");
    parsed[f[0]] = c;
  }
  if (lineno == 0) return fail("empty file");
  std::lock_guard<std::mutex> lock(m_mutex);
  for (auto& [k, v] : parsed) m_entries.emplace(k, v);  // present entries keep their value
  return true;
}

}  // namespace renaissance::cuda
