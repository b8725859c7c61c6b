// Text to standard output through stdio.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <utility>

namespace renaissance::app {

/// fmt::print(...) to stdout, but never throwing: fmt::print throws on a failed write (a closed pipe ended
/// `plan | head` with exit 1, an error and the broken-pipe warning both), where stdio records it and main's
/// check_stdout says it once, as for every other command (a pipe: a warning; a file or device: exit 1).
template <typename... Args>
void print_stdout(fmt::format_string<Args...> format, Args&&... args) {
  const std::string text = fmt::format(format, std::forward<Args>(args)...);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace renaissance::app
