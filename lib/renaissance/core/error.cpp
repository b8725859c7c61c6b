#include <renaissance/core/error.h>

namespace renaissance {

namespace {
std::string compose(const std::string& message, const std::string& context, const std::string& hint) {
  std::string s = context.empty() ? message : context + ": " + message;
  if (!hint.empty()) s += " (hint: " + hint + ")";
  return s;
}
}  // namespace

Error::Error(std::string message, std::string context, std::string hint, std::string where)
    : std::runtime_error(compose(message, context, hint)),
      m_message(std::move(message)),
      m_context(std::move(context)),
      m_hint(std::move(hint)),
      m_where(std::move(where)) {}

Error Error::with_context(const std::string& outer) const {
  std::string ctx = m_context.empty() ? outer : outer + ": " + m_context;
  return Error(m_message, ctx, m_hint, m_where);
}

namespace detail {
void throw_error(const char* file, int line, std::string message, std::string context, std::string hint) {
  throw Error(std::move(message), std::move(context), std::move(hint), fmt::format("{}:{}", file, line));
}
}  // namespace detail

}  // namespace renaissance
