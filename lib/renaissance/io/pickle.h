// A bounded reader of Python pickles (protocols 0-5, binary opcodes) into a tree of plain values, for the CIFAR
// tarballs (issue 12). Nothing is executed: GLOBAL/REDUCE/BUILD/NEWOBJ become "object" nodes holding the callable's
// name, its arguments and its state, which the caller interprets (numpy's _reconstruct, _codecs.encode). Every length
// is checked against the bytes that remain, and the value count is bounded, so a corrupt or hostile file is an Error
// naming the file and the byte offset, never a crash or an unbounded allocation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::io::pickle {

struct Value {
  enum class Kind { none, boolean, integer, floating, bytes, str, list, tuple, dict, global, object };
  Kind kind = Kind::none;
  std::int64_t i = 0;  ///< boolean, integer
  double f = 0;        ///< floating
  /// bytes: the bytes (Python 2 str, Python 3 bytes); str: UTF-8; global: "module.name"
  std::string s;
  /// list, tuple; dict: key, value, key, value, ... Not owning: every value belongs to its Document (a pickle may
  /// refer to a value from inside itself, a list that holds itself: cycles are legal).
  std::vector<Value*> items;
  Value* callable = nullptr;  ///< object: the callable (a global)
  Value* args = nullptr;      ///< object: its arguments (a tuple)
  Value* state = nullptr;     ///< object: BUILD's state

  bool is(Kind k) const { return kind == k; }
  /// bytes or str (or an as_bytes() object) equal to `text`: Python 2 pickles have str keys where Python 3 ones have
  /// bytes or str.
  bool text_equals(const std::string& text) const;
  /// dict lookup by a text key (text_equals); nullptr when absent, the last entry when the key is set more than once
  /// (a later SETITEM replaces an earlier one in Python; see count()).
  const Value* get(const std::string& key) const;
  /// How many of a dict's entries have this text key: more than one is a dict Python would hold differently (one str
  /// and one bytes key) or a pickle made to be read two ways.
  std::size_t count(const std::string& key) const;
};
/// The values of one pickle, owned together.
class Document {
 public:
  const Value& root() const { return *m_root; }
  Value* make(Value::Kind k);

 private:
  friend class Reader;
  std::vector<std::unique_ptr<Value>> m_values;
  Value* m_root = nullptr;
  friend Document load(const std::uint8_t* data, std::size_t size, const std::string& name);
};

const char* kind_name(Value::Kind k);

/// Parses one pickle; `name` prefixes every error ("cifar-10-python.tar.gz: data_batch_1").
Document load(const std::uint8_t* data, std::size_t size, const std::string& name);

/// A byte string: `bytes`, or `_codecs.encode(str, 'latin1')` (how Python 3's protocol 2 pickles bytes), or
/// `builtins.bytearray(...)`/`bytes(...)` of one of those (nested at most 8 deep: a pickle can make an object its own
/// argument). False when `v` is none of these.
bool as_bytes(const Value& v, std::string& out);

}  // namespace renaissance::io::pickle
