// core/utf8.h: which bytes are UTF-8 (class folder and label names are stored as UTF-8 strings; RFC 3629's
// boundaries, checked against Python's decoder by hand) and the terminal-safe form of text read from files.
#include <renaissance/core/utf8.h>

#include <gtest/gtest.h>

namespace renaissance {
namespace {

TEST(Utf8, WellFormedSequencesAndTheirBoundaries) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("plain ascii, with\ttab and\nnewline"));
  EXPECT_TRUE(valid_utf8("caf\xc3\xa9"));             // é
  EXPECT_TRUE(valid_utf8("\xe2\x82\xac"));            // €
  EXPECT_TRUE(valid_utf8("\xf0\x9f\x90\x88"));        // U+1F408
  EXPECT_TRUE(valid_utf8("\xf4\x8f\xbf\xbf"));        // U+10FFFF, the last code point
  EXPECT_FALSE(valid_utf8("caf\xe9"));                // Latin-1 é
  EXPECT_FALSE(valid_utf8("\xff\xfe"));               // a UTF-16 byte-order mark
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));               // an overlong '/'
  EXPECT_FALSE(valid_utf8("\xe0\x80\xaf"));           // overlong, three bytes
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));           // a surrogate (U+D800)
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));       // past U+10FFFF
  EXPECT_FALSE(valid_utf8("\xe2\x82"));               // cut short
  EXPECT_FALSE(valid_utf8(std::string("a\x80", 2)));  // a lone continuation byte
}

TEST(Utf8, TerminalTextEscapesControlCharactersOnly) {
  // An attribute that would clear the screen and retitle the terminal, printed as text.
  EXPECT_EQ(terminal_text("\x1b[2J\x1b]0;owned\x07"), "\\x1b[2J\\x1b]0;owned\\x07");
  EXPECT_EQ(terminal_text("a\rb\x7f"), "a\\x0db\\x7f");
  EXPECT_EQ(terminal_text("line one\nline\ttwo caf\xc3\xa9"), "line one\nline\ttwo caf\xc3\xa9");  // kept as they are
}

}  // namespace
}  // namespace renaissance
