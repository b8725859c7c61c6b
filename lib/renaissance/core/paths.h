// Checks on the files a command reads and writes, made before any work is spent (issue 13): an input that is a
// directory or missing is named as such; an output is never an input (or another output), never a device or a
// directory, and its directory exists and is writable. Errors name the option and the path.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace renaissance {

/// `path` must exist and be a regular file (or a link to one) that this process can read. `what` names it in the
/// error ("model file", "--config", "checkpoint").
void require_input_file(const std::string& path, const std::string& what);

/// An output file a command will create or replace. Refused: an existing path that is not a regular file (a
/// directory, a device such as /dev/null, a FIFO or socket), a dangling symlink, a directory that does not exist or
/// is not writable (a file is created there and removed: the permission bits do not tell for root on a read-only or
/// special file system). Returns the path to write and rename onto: `path` itself, or the file a symlink points to (the
/// link stays a link; it is never replaced by a rename).
/// `probe` false: the directory is not probed with a file of its own (a writer that creates its temporary there next
/// learns the same at once).
std::string resolve_output_file(const std::string& path, const std::string& option, bool probe = true);

/// The directory `dir` will be created in (or exists and is a writable directory).
void require_writable_dir(const std::string& dir, const std::string& option);

/// True when both paths exist and are the same file (the same inode: also through symlinks or hard links), or
/// name the same place.
bool same_file(const std::string& a, const std::string& b);

/// Refuses any output that is the same file as an input or as another output: {option, path} pairs, empty paths
/// ignored. "--save run.h5 is the same file as --data run.h5: writing it would destroy the input".
void require_distinct_files(const std::vector<std::pair<std::string, std::string>>& inputs,
                            const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace renaissance
