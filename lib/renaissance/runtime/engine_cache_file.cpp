#include <renaissance/runtime/engine_cache_file.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/conv.h>
#include <kernels/cuda/engine_cache.h>
#endif

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace renaissance::runtime {

namespace fs = std::filesystem;

std::string default_engine_cache_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "renaissance" / "engines.txt").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "renaissance" / "engines.txt").string();
  return "renaissance-engines.txt";
}

#ifdef RENAISSANCE_HAVE_CUDA

namespace {

/// The whole file, or nullopt-like empty with ok=false when it cannot be read.
bool read_file(const std::string& path, std::string* text, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = std::strerror(errno);
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    *error = "read error";
    return false;
  }
  *text = ss.str();
  return true;
}

}  // namespace

std::string load_engine_cache(const std::string& path, std::size_t* entries) {
  if (entries) *entries = 0;
  if (path.empty()) return "";
  std::error_code ec;
  if (!fs::exists(path, ec)) return fmt::format("engine cache {}: none yet (engines are timed and saved there)", path);
  if (!fs::is_regular_file(path, ec)) return fmt::format("warning: engine cache {} is not a regular file: ignored", path);
  std::string text, error;
  if (!read_file(path, &text, &error)) return fmt::format("warning: engine cache {}: {}: ignored", path, error);
  cuda::EngineCache loaded;
  if (!loaded.merge(text, &error))
    return fmt::format("warning: {} is not an engine cache of this version ({}): ignored, engines are timed again",
                       path, error);
  cuda::EngineCache& global = cuda::EngineCache::global();
  const std::size_t before = global.size();
  std::string unused;
  global.merge(loaded.serialize(), &unused);
  if (entries) *entries = loaded.size();
  return fmt::format("engine cache {}: {} entries ({} new to this process)", path, loaded.size(),
                     global.size() - before);
}

EngineStats engine_stats() {
  const cuda::EngineCache& c = cuda::EngineCache::global();
  return EngineStats{cuda::ConvOp::choose_seconds(), c.hits(), c.misses(), c.rejected(), c.first_rejection()};
}

EngineCacheLock::~EngineCacheLock() {
  if (m_fd >= 0) ::close(m_fd);  // closing the descriptor releases the flock
}

std::unique_ptr<EngineCacheLock> lock_engine_cache(const std::string& path, double wait_s, std::string* log) {
  if (log) log->clear();
  if (path.empty()) return nullptr;
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const int fd = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;  // an unwritable place: save_engine_cache will say so
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      ::close(fd);
      return nullptr;
    }
    if (waited() >= wait_s) {
      ::close(fd);
      if (log)
        *log = fmt::format(
            "warning: engine cache {}: another start-up held it for {:.0f} s; going on without waiting for its "
            "engines (this run times its own, which may differ from that run's)",
            path, waited());
      return nullptr;
    }
    ::usleep(20000);
  }
  if (log && waited() >= 0.5)
    *log = fmt::format("engine cache {}: waited {:.1f} s for another start-up to save its engines", path, waited());
  return std::unique_ptr<EngineCacheLock>(new EngineCacheLock(path, fd));
}

std::string save_engine_cache(const std::string& path, const EngineCacheLock* held) {
  cuda::EngineCache& global = cuda::EngineCache::global();
  if (path.empty() || global.unsaved() == 0) return "";
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (fs::exists(p, ec) && !fs::is_regular_file(fs::symlink_status(p, ec)))
    return fmt::format("warning: engine cache {} is not a regular file: not written", path);
  // The write under PATH.lock (waiting as long as it takes), unless this process holds it already.
  std::unique_ptr<EngineCacheLock> lock;
  if (!held || held->path() != path) lock = lock_engine_cache(path, std::numeric_limits<double>::infinity(), nullptr);
  // What the file holds now (another process may have added to it since we loaded it) wins over our entries.
  cuda::EngineCache merged;
  std::string text, error;
  if (fs::exists(p, ec)) {
    // Never replace a file that is not an engine cache (a dataset or checkpoint named by mistake stays as it is).
    if (!read_file(path, &text, &error) || !merged.merge(text, &error))
      return fmt::format("warning: {} exists and is not an engine cache of this version ({}): not overwritten",
                         path, error);
  }
  const std::size_t had = merged.size();
  merged.merge(global.serialize(), &error);
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << merged.serialize();
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return fmt::format("warning: engine cache {} could not be written ({}); the next start-up times again", path,
                         std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return fmt::format("warning: engine cache {} could not be replaced ({})", path, why);
  }
  global.mark_saved();
  return fmt::format("engine cache {}: {} new entries saved ({} in all)", path, merged.size() - had, merged.size());
}

#else

std::string load_engine_cache(const std::string&, std::size_t* entries) {
  if (entries) *entries = 0;
  return "";
}
std::string save_engine_cache(const std::string&, const EngineCacheLock*) { return ""; }
EngineCacheLock::~EngineCacheLock() = default;
std::unique_ptr<EngineCacheLock> lock_engine_cache(const std::string&, double, std::string* log) {
  if (log) log->clear();
  return nullptr;
}
EngineStats engine_stats() { return {}; }

#endif

}  // namespace renaissance::runtime
