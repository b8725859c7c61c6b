// A tiny streaming JSON writer for the CLI's machine-readable reports (no third-party JSON library needed).
#pragma once

#include <renaissance/core/utf8.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::app {

using renaissance::utf8_sequence;

/// `s` as the inside of a JSON string: quotes, backslashes and control characters escaped, and every byte that is not
/// part of well-formed UTF-8 (a class folder or path named in Latin-1) as U+FFFD, so the document stays valid JSON
/// for strict readers.
inline std::string json_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) {
      o += "\\ufffd";
      ++i;
      continue;
    }
    if (n > 1) {
      o.append(s, i, n);
      i += n;
      continue;
    }
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) o += fmt::format("\\u{:04x}", c);
        else o += static_cast<char>(c);
    }
    ++i;
  }
  return o;
}

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(const std::string& k) {
    comma();
    m_out += quote(k) + ":";
    m_after_key = true;
    return *this;
  }
  JsonWriter& value(const std::string& s) { return raw(quote(s)); }
  JsonWriter& value(const char* s) { return raw(quote(s)); }
  JsonWriter& value(bool b) { return raw(b ? "true" : "false"); }
  JsonWriter& value(std::int64_t v) { return raw(std::to_string(v)); }
  JsonWriter& value(int v) { return raw(std::to_string(v)); }
  JsonWriter& value(double v) { return raw(std::isfinite(v) ? fmt::format("{}", v) : "null"); }
  /// Text that is already a JSON value (a number, or an array of numbers, as the caller checked).
  JsonWriter& json_value(const std::string& text) { return raw(text); }
  template <typename T>
  JsonWriter& kv(const std::string& k, const T& v) {
    key(k);
    return value(v);
  }
  const std::string& str() const { return m_out; }

  static std::string quote(const std::string& s) { return "\"" + json_escape(s) + "\""; }

 private:
  JsonWriter& open(char c) {
    comma();
    m_out += c;
    m_first.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    m_out += c;
    m_first.pop_back();
    return *this;
  }
  JsonWriter& raw(const std::string& s) {
    comma();
    m_out += s;
    return *this;
  }
  void comma() {
    if (m_after_key) {
      m_after_key = false;
      return;
    }
    if (!m_first.empty()) {
      if (!m_first.back()) m_out += ",";
      m_first.back() = false;
    }
  }
  std::string m_out;
  std::vector<bool> m_first;
  bool m_after_key = false;
};

}  // namespace renaissance::app
