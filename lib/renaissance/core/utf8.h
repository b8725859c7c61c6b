// UTF-8 checks for text that files and folders hand us as bytes (class folder names, pickled label names).
#pragma once

#include <cstddef>
#include <string>

namespace renaissance {

/// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no surrogates, at most
/// U+10FFFF), or 0 where the bytes are not one.
inline std::size_t utf8_sequence(const std::string& s, std::size_t i) {
  const auto at = [&](std::size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = at(0);
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) { return at(k) >= lo && at(k) <= hi; };
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if (c == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (c >= 0xe1 && c <= 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

/// Whether all of `s` is well-formed UTF-8.
inline bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// The code points Python gives a file name it reads as bytes (os.fsdecode: UTF-8 with surrogateescape, a byte that
/// is no part of a well-formed sequence becoming U+DC00 + byte): the order Python's sorted() puts names in, which is
/// the bytes' order for well-formed UTF-8 and not otherwise ("\xff" sorts before an emoji there, after it as bytes).
inline std::u32string python_code_points(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
    switch (utf8_sequence(s, i)) {
      case 1:
        out.push_back(b(0));
        i += 1;
        break;
      case 2:
        out.push_back(((b(0) & 0x1f) << 6) | (b(1) & 0x3f));
        i += 2;
        break;
      case 3:
        out.push_back(((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f));
        i += 3;
        break;
      case 4:
        out.push_back(((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f));
        i += 4;
        break;
      default:
        out.push_back(0xdc00 + b(0));
        i += 1;
        break;
    }
  }
  return out;
}

/// `s` safe to print on a terminal: control characters (ESC sequences that clear the screen or retitle it, carriage
/// returns, ...) other than newline and tab become \xNN. For names and attributes read from files.
inline std::string terminal_text(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  static const char* hex = "0123456789abcdef";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      o += "\\x";
      o += hex[c >> 4];
      o += hex[c & 15];
    } else {
      o += ch;
    }
  }
  return o;
}

}  // namespace renaissance
