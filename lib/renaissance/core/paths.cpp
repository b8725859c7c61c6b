#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace renaissance {

namespace fs = std::filesystem;

namespace {

const char* kind_of(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISREG(st.st_mode)) return "a file";
  return "not a regular file";
}

/// Why a symbolic link cannot be followed, from the errno of stat(2) through it.
const char* unfollowable_link(int err) {
  return err == ELOOP    ? "a symlink loop (too many levels of symbolic links)"
         : err == ENOENT ? "a dangling symlink"
                         : std::strerror(err);
}

/// 0 when a file can be created in `dir` (made and removed again: access(2) answers from the mode bits, so it says
/// yes for root on a read-only mount, on /proc, or on NFS with root_squash, and the write failed after the run's work);
/// else the errno of the attempt.
int create_probe(const std::string& dir) {
  std::string probe = (fs::path(dir) / ".renaissance-write-probe-XXXXXX").string();
  const int fd = ::mkostemp(probe.data(), O_CLOEXEC);  // a unique name (O_EXCL), whoever else probes there
  if (fd < 0) return errno;
  ::close(fd);
  if (::unlink(probe.c_str()) != 0)
    RN_FAIL_CTX(probe,
                "created to check that the directory is writable, and it cannot be removed: {} (remove it by "
                "hand)",
                std::strerror(errno));
  return 0;
}

std::string parent_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

}  // namespace

void require_input_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    struct stat lst {};
    if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
      RN_FAIL_CTX(path, "{}: {}", what, unfollowable_link(err));
    RN_FAIL_CTX(path, "{}: {}", what, err == ENOENT ? "no such file" : std::strerror(err));
  }
  if (!S_ISREG(st.st_mode))
    RN_FAIL_CTX(path, "{}: is {}, not a file", what, kind_of(st));
  if (::access(path.c_str(), R_OK) != 0) RN_FAIL_CTX(path, "{}: cannot read it: {}", what, std::strerror(errno));
}

void require_writable_dir(const std::string& dir, const std::string& option) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    // A directory that will be created: its nearest existing ancestor must be a writable directory.
    const int err = errno;
    RN_CHECK_CTX(err == ENOENT || err == ENOTDIR, dir, "{}: {}", option, std::strerror(err));
    fs::path up = fs::path(dir).parent_path();
    while (!up.empty() && ::stat(up.c_str(), &st) != 0) up = up.parent_path();
    const std::string anc = up.empty() ? std::string(".") : up.string();
    RN_CHECK_CTX(::stat(anc.c_str(), &st) == 0, dir, "{}: {}", option, std::strerror(errno));
    RN_CHECK_CTX(S_ISDIR(st.st_mode), dir, "{}: cannot create the directory: '{}' is {}", option, anc, kind_of(st));
    const int err_create = create_probe(anc);
    RN_CHECK_CTX(err_create == 0, dir, "{}: cannot create the directory in '{}': {}", option, anc,
                 std::strerror(err_create));
    return;
  }
  RN_CHECK_CTX(S_ISDIR(st.st_mode), dir, "{}: is {}, not a directory", option, kind_of(st));
  const int err_create = create_probe(dir);
  RN_CHECK_CTX(err_create == 0, dir, "{}: the directory is not writable: {}", option, std::strerror(err_create));
}

std::string resolve_output_file(const std::string& path, const std::string& option, bool probe) {
  RN_CHECK_CTX(!path.empty(), option, "an empty file name");
  std::string target = path;
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) == 0) {
    if (S_ISLNK(lst.st_mode)) {
      std::error_code ec;
      const fs::path resolved = fs::canonical(path, ec);
      if (ec) {
        // A link that names no path but an open object (/dev/stdout on a pipe: /proc/self/fd/1 reads "pipe:[N]").
        struct stat st {};
        RN_CHECK_CTX(::stat(path.c_str(), &st) != 0, path,
                     "{}: is {}; refusing to replace it (write to a regular file)", option, kind_of(st));
        const int err = errno;
        RN_FAIL_CTX(path, "{}: {} (refusing to write through it)", option, unfollowable_link(err));
      }
      target = resolved.string();
    }
    struct stat st {};
    RN_CHECK_CTX(::stat(target.c_str(), &st) == 0, path, "{}: {}", option, std::strerror(errno));
    RN_CHECK_CTX(S_ISREG(st.st_mode), path,
                 "{}: is {}; refusing to replace it (write to a regular file)", option, kind_of(st));
    // The process's own stdout or stderr (`--out /dev/stdout > f.h5`): the rename put the file in place of the one
    // the command's output goes to, and that output went to the replaced, unlinked file.
    for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
      struct stat own {};
      RN_CHECK_CTX(::fstat(fd, &own) != 0 || own.st_dev != st.st_dev || own.st_ino != st.st_ino, path,
                   "{}: is this process's standard {}; refusing to replace it (write to a file of its own)", option,
                   fd == STDOUT_FILENO ? "output" : "error");
    }
  } else {
    RN_CHECK_CTX(errno == ENOENT, path, "{}: {}", option, std::strerror(errno));
  }
  const std::string dir = parent_of(target);
  struct stat dst {};
  RN_CHECK_CTX(::stat(dir.c_str(), &dst) == 0, path, "{}: the directory '{}' does not exist", option, dir);
  RN_CHECK_CTX(S_ISDIR(dst.st_mode), path, "{}: '{}' is {}, not a directory", option, dir, kind_of(dst));
  const int err_create = probe ? create_probe(dir) : 0;
  RN_CHECK_CTX(err_create == 0, path, "{}: cannot write in the directory '{}': {}", option, dir,
               std::strerror(err_create));
  return target;
}

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  if (fs::equivalent(a, b, ec) && !ec) return true;
  // Absolute first: weakly_canonical leaves a relative path relative when nothing of it exists yet, so "m.h5" and
  // "$PWD/m.h5" (or "l.jsonl" and "./l.jsonl") compared unequal.
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ec), ec);
  if (ec) return false;
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, ec), ec);
  return !ec && ca == cb;
}

void require_distinct_files(const std::vector<std::pair<std::string, std::string>>& inputs,
                            const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [oopt, out] = outputs[i];
    if (out.empty()) continue;
    for (const auto& [iopt, in] : inputs) {
      if (in.empty()) continue;
      if (same_file(out, in))
        RN_FAIL_CTX(out, "{} is the same file as {} {}: writing it would destroy that input", oopt, iopt, in);
      // The writer of `out` removes its dead writers' temporaries "<out>.tmp-<host>-<pid>" beside it.
      // Against --out as written and as the writer resolves it (a link's target), by directory (links resolved) and
      // by the input's own name (an input that is a link has that name).
      std::error_code ec;
      const fs::path i = fs::absolute(in, ec), i_dir = fs::weakly_canonical(i.parent_path(), ec);
      bool temporary_of_out = false;
      for (const fs::path& o : {fs::absolute(out, ec), fs::weakly_canonical(fs::absolute(out, ec), ec)})
        temporary_of_out = temporary_of_out || (i.filename().string().rfind(o.filename().string() + ".tmp-", 0) == 0 &&
                                                fs::weakly_canonical(o.parent_path(), ec) == i_dir);
      if (temporary_of_out)
        RN_FAIL_CTX(in,
                    "{} is named like a temporary file of {} {}, and writing that removes the ones dead writers "
                    "left: rename the input",
                    iopt, oopt, out);
    }
    for (std::size_t j = 0; j < i; ++j)
      if (same_file(out, outputs[j].second))
        RN_FAIL_CTX(out, "{} and {} name the same file", outputs[j].first, oopt);
  }
}

}  // namespace renaissance
