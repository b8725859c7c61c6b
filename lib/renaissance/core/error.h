// Errors that carry context: where in our code, and which file/layer/field of the user's input.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace renaissance {

/// The one exception type of the project. `what()` is a complete, user-facing message:
/// "<context>: <message> (hint: ...)". `where` is our file:line, kept for debugging output.
class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string context = {}, std::string hint = {},
        std::string where = {});

  const std::string& message() const { return m_message; }
  const std::string& context() const { return m_context; }
  const std::string& hint() const { return m_hint; }
  const std::string& where() const { return m_where; }

  /// A copy with an outer context prepended ("model.yaml: layer 'conv3': ...").
  Error with_context(const std::string& outer) const;

 private:
  std::string m_message, m_context, m_hint, m_where;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, std::string message,
                              std::string context = {}, std::string hint = {});
}  // namespace detail

}  // namespace renaissance

/// RN_CHECK(cond, fmt, args...): throw renaissance::Error with the formatted message when cond is false.
#define RN_CHECK(cond, ...)                                                             \
  do {                                                                                  \
    if (!(cond)) ::renaissance::detail::throw_error(__FILE__, __LINE__,                 \
                                                    ::fmt::format(__VA_ARGS__));        \
  } while (0)

/// RN_CHECK_CTX(cond, context, fmt, args...): as RN_CHECK, with a context (file, layer, field).
#define RN_CHECK_CTX(cond, ctx, ...)                                                    \
  do {                                                                                  \
    if (!(cond)) ::renaissance::detail::throw_error(__FILE__, __LINE__,                 \
                                                    ::fmt::format(__VA_ARGS__), (ctx)); \
  } while (0)

#define RN_FAIL(...) ::renaissance::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
#define RN_FAIL_CTX(ctx, ...) \
  ::renaissance::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__), (ctx))
