// The convolution engine cache (kernels/cuda/engine_cache.h) and its file (runtime/engine_cache_file.h): text round
// trip, malformed files refused with the line named and nothing half-loaded, entries already present winning, and
// the file written atomically beside a run. No GPU needed: runs in CI with every CUDA build.
#include <kernels/cuda/engine_cache.h>
#include <renaissance/runtime/engine_cache_file.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace {

using renaissance::cuda::EngineCache;
using renaissance::cuda::EngineChoice;
namespace fs = std::filesystem;

EngineChoice graph_choice(std::int64_t engine, float ms) {
  EngineChoice c;
  c.api = EngineChoice::Api::Graph;
  c.graph.engine = engine;
  c.graph.knobs = {{2, 4}, {25, 1}};
  c.graph.name = fmt::format("eng{}_k2=4_k25=1", engine);
  c.time_ms = ms;
  c.workspace = 1 << 20;
  return c;
}

EngineChoice legacy_choice() {
  EngineChoice c;
  c.api = EngineChoice::Api::Legacy;
  c.algo = 1;
  c.math = 1;
  c.staged = true;
  c.fallback = true;
  c.deterministic = true;
  return c;
}

EngineChoice own_choice() {
  EngineChoice c;
  c.api = EngineChoice::Api::Own;
  c.deterministic = true;
  c.time_ms = 0.25f;
  return c;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EngineCache, TextRoundTrip) {
  EngineCache a;
  a.put("NVIDIA H200 sm90 x132 cudnn91400 fwd k3", graph_choice(62, 0.128f));
  a.put("NVIDIA H200 sm90 x132 cudnn91400 dgrad acc", legacy_choice());
  a.put("NVIDIA H200 sm90 x132 cudnn91400 g96 dgrad own=dw1", own_choice());
  EngineCache b;
  std::string error;
  ASSERT_TRUE(b.merge(a.serialize(), &error)) << error;
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b.unsaved(), 0u) << "loaded entries are not new";
  const auto g = b.find("NVIDIA H200 sm90 x132 cudnn91400 fwd k3");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->api, EngineChoice::Api::Graph);
  EXPECT_EQ(g->graph.engine, 62);
  EXPECT_EQ(g->graph.knobs, graph_choice(62, 0).graph.knobs);
  EXPECT_EQ(g->graph.name, "eng62_k2=4_k25=1");
  EXPECT_FLOAT_EQ(g->time_ms, 0.128f);
  const auto l = b.find("NVIDIA H200 sm90 x132 cudnn91400 dgrad acc");
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->api, EngineChoice::Api::Legacy);
  EXPECT_TRUE(l->staged && l->fallback);
  EXPECT_EQ(l->algo, 1);
  const auto o = b.find("NVIDIA H200 sm90 x132 cudnn91400 g96 dgrad own=dw1");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->api, EngineChoice::Api::Own);
  EXPECT_EQ(o->str(), "own depthwise (0.250 ms)");
  EXPECT_EQ(b.serialize(), a.serialize());
}

// cudnn-frontend reports backend knob types it has no name for (LDGB, LDGC, ...) as NOT_SET (0): such a config is
// not exact (no create_execution_plan rebuild; the cache finds it again by cuDNN's tag), and stays so through the file.
TEST(EngineCache, AConfigWithAnUnnamedKnobStaysInexactThroughTheFile) {
  EngineChoice c = graph_choice(47, 0.05f);
  EXPECT_TRUE(c.graph.exact());
  c.graph.knobs = {{0, 2}, {2, 2}, {6, 1}, {7, 0}};  // eng47_k2=2_k6=2_k13=1_k14=0_k22=2 as cudnn-frontend 1.32 lists it
  c.graph.name = "eng47_k2=2_k6=2_k13=1_k14=0_k22=2";
  EXPECT_FALSE(c.graph.exact());
  EngineCache a;
  a.put("stem fwd", c);
  EngineCache b;
  std::string error;
  ASSERT_TRUE(b.merge(a.serialize(), &error)) << error;
  const auto g = b.find("stem fwd");
  ASSERT_TRUE(g.has_value());
  EXPECT_FALSE(g->graph.exact());
  EXPECT_EQ(g->graph.name, c.graph.name);
  EXPECT_EQ(g->graph.knobs, c.graph.knobs);
}

TEST(EngineCache, MalformedTextIsRefusedWithTheLineAndNothingLoaded) {
  EngineCache a;
  a.put("k1", graph_choice(1, 1.0f));
  a.put("k2", graph_choice(2, 2.0f));
  const std::string good = a.serialize();
  struct Case {
    const char* what;
    std::string text;
    const char* expect;
  };
  std::string no_engine = good;
  no_engine.replace(no_engine.find("\t1\t"), 3, "\tx\t");
  const std::vector<Case> cases = {
      {"empty", "", "empty"},
      {"no header", "k\tgraph\n", "header"},
      {"short line", good + "k3\tgraph\t0\n", "line 4"},
      {"bad api", good + "k3\tcuda\t0\t1\t-\t-\t-1\t0\t1\t0.1\t0\t0\n", "api"},
      {"bad number", no_engine, "engine"},
      {"graph without engine", good + "k3\tgraph\t0\t-1\t-\t-\t-1\t0\t1\t0.1\t0\t0\n", "without an engine"},
      {"own with workspace", good + "k3\town\t0\t-1\t-\t-\t-1\t0\t1\t0.1\t4096\t0\n", "own-kernel"},
      {"binary junk", std::string(3, '\0') + "\xff\xfe", "header"},
  };
  for (const Case& c : cases) {
    EngineCache b;
    std::string error;
    EXPECT_FALSE(b.merge(c.text, &error)) << c.what;
    EXPECT_NE(error.find(c.expect), std::string::npos) << c.what << ": " << error;
    EXPECT_EQ(b.size(), 0u) << c.what << ": nothing may be half-loaded";
  }
}

TEST(EngineCache, EntriesAlreadyPresentKeepTheirValue) {
  EngineCache a;
  a.put("k", graph_choice(7, 1.0f));
  EngineCache b;
  b.put("k", graph_choice(9, 0.5f));
  std::string error;
  ASSERT_TRUE(b.merge(a.serialize(), &error)) << error;
  EXPECT_EQ(b.find("k")->graph.engine, 9);
}

TEST(EngineCacheFile, SavedBesideTheRunAndLoadedBack) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rn_engine_cache_{}", ::getpid());
  fs::remove_all(dir);
  const fs::path file = dir / "sub" / "engines.txt";
  EngineCache& g = EngineCache::global();
  g.clear();
  EXPECT_NE(renaissance::runtime::load_engine_cache(file.string()).find("none yet"), std::string::npos);
  g.put("mine", graph_choice(3, 0.3f));
  const std::string saved = renaissance::runtime::save_engine_cache(file.string());
  EXPECT_NE(saved.find("1 new entries saved"), std::string::npos) << saved;
  EXPECT_EQ(g.unsaved(), 0u);
  EXPECT_EQ(renaissance::runtime::save_engine_cache(file.string()), "") << "nothing new: nothing written";
  // Another process added "theirs" and its own "mine" meanwhile: the file's entries win, ours are added.
  {
    EngineCache other;
    other.put("mine", graph_choice(4, 0.1f));
    other.put("theirs", graph_choice(5, 0.2f));
    std::ofstream(file) << other.serialize();
  }
  g.put("new", graph_choice(6, 0.4f));
  renaissance::runtime::save_engine_cache(file.string());
  EngineCache back;
  std::string error;
  ASSERT_TRUE(back.merge(slurp(file), &error)) << error;
  EXPECT_EQ(back.size(), 3u);
  EXPECT_EQ(back.find("mine")->graph.engine, 4);
  EXPECT_EQ(back.find("new")->graph.engine, 6);
  // Loading into an empty process cache.
  g.clear();
  std::size_t n = 0;
  EXPECT_NE(renaissance::runtime::load_engine_cache(file.string(), &n).find("3 entries"), std::string::npos);
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(g.find("theirs")->graph.engine, 5);
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(file.parent_path()))
    EXPECT_TRUE(e.path().filename() == "engines.txt" || e.path().filename() == "engines.txt.lock") << e.path();
  g.clear();
  fs::remove_all(dir);
}

TEST(EngineCacheFile, ABadFileIsIgnoredWithAWarningNeverFatal) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rn_engine_cache_bad_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  EngineCache& g = EngineCache::global();
  g.clear();
  std::ofstream(dir / "junk.txt") << "not an engine cache\n";
  const std::string junk = renaissance::runtime::load_engine_cache((dir / "junk.txt").string());
  EXPECT_NE(junk.find("warning:"), std::string::npos) << junk;
  EXPECT_NE(junk.find("junk.txt"), std::string::npos) << junk;
  EXPECT_EQ(g.size(), 0u);
  const std::string d = renaissance::runtime::load_engine_cache(dir.string());
  EXPECT_NE(d.find("not a regular file"), std::string::npos) << d;
  g.put("k", graph_choice(1, 1.0f));
  const std::string w = renaissance::runtime::save_engine_cache(dir.string());
  EXPECT_NE(w.find("warning:"), std::string::npos) << w;
  // A file that is not an engine cache (a dataset named by mistake) is never overwritten.
  const std::string before = slurp(dir / "junk.txt");
  const std::string j = renaissance::runtime::save_engine_cache((dir / "junk.txt").string());
  EXPECT_NE(j.find("not overwritten"), std::string::npos) << j;
  EXPECT_EQ(slurp(dir / "junk.txt"), before);
  g.clear();
  fs::remove_all(dir);
}

// The start-up lock (lock_engine_cache): one holder at a time (flock on PATH.lock, which also parts two descriptors of
// one process), a bounded wait that says it ran out, a waiter that gets it once the holder lets go and says how long
// it waited, and save_engine_cache under the held lock (it must not take the lock a second time: that would wait on
// itself).
TEST(EngineCacheFile, TheStartUpLockIsHeldByOneAndWaitedForWithABound) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rn_engine_cache_lock_{}", ::getpid());
  fs::remove_all(dir);
  const std::string file = (dir / "sub" / "engines.txt").string();
  std::string log;
  EXPECT_EQ(renaissance::runtime::lock_engine_cache("", 1.0, &log), nullptr) << "--engine-cache off: no lock";
  auto held = renaissance::runtime::lock_engine_cache(file, 1.0, &log);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(log, "") << "nobody else held it: nothing to say";
  EXPECT_TRUE(fs::exists(file + ".lock"));
  // A second start-up waits its bound out and goes on without the lock, saying so.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(renaissance::runtime::lock_engine_cache(file, 0.3, &log), nullptr);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.3);
  EXPECT_NE(log.find("another start-up held it"), std::string::npos) << log;
  // Saving under the held lock: the entries reach the file, and the call returns (no wait on our own lock).
  EngineCache& g = EngineCache::global();
  g.clear();
  g.put("mine", graph_choice(3, 0.3f));
  const std::string saved = renaissance::runtime::save_engine_cache(file, held.get());
  EXPECT_NE(saved.find("1 new entries saved"), std::string::npos) << saved;
  // A waiter gets the lock when the holder lets go, and says it waited.
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    held.reset();
  });
  auto next = renaissance::runtime::lock_engine_cache(file, 30.0, &log);
  release.join();
  ASSERT_NE(next, nullptr);
  EXPECT_NE(log.find("waited"), std::string::npos) << log;
  // ... and reads what the first saved: the second start-up takes the first's engines.
  g.clear();
  std::size_t n = 0;
  renaissance::runtime::load_engine_cache(file, &n);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(g.find("mine")->graph.engine, 3);
  next.reset();
  g.clear();
  fs::remove_all(dir);
}

}  // namespace
