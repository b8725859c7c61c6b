#include <renaissance/io/pickle.h>

#include <renaissance/core/error.h>
#include <renaissance/io/hdf5_util.h>

#include <cstring>
#include <map>

namespace renaissance::io::pickle {

namespace {

constexpr std::int64_t kMaxValues = std::int64_t(1) << 24;  // a CIFAR batch has ~10^4 (labels and file names)
constexpr const char* kHint = "the file is corrupt, or not one of the CIFAR python pickles; download it again";

}  // namespace

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size, std::string name, Document& doc)
      : m_p(data), m_n(size), m_name(std::move(name)), m_doc(doc) {}

  Value* run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    RN_IO_FAIL(m_name, kHint, "pickle byte offset {}: {}", m_op_at, what);
  }
  const std::uint8_t* take(std::size_t n) {
    if (n > m_n - m_at) fail(fmt::format("needs {} more bytes, {} remain (truncated?)", n, m_n - m_at));
    const std::uint8_t* p = m_p + m_at;
    m_at += n;
    return p;
  }
  std::uint64_t le(int bytes) {
    const std::uint8_t* p = take(static_cast<std::size_t>(bytes));
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    return v;
  }
  std::string line() {  // text opcodes: up to '\n'
    const std::size_t start = m_at;
    while (m_at < m_n && m_p[m_at] != '\n') ++m_at;
    if (m_at >= m_n) fail("a text argument without its newline (truncated?)");
    std::string s(reinterpret_cast<const char*>(m_p + start), m_at - start);
    ++m_at;
    return s;
  }
  Value* make(Value::Kind k) {
    if (++m_values > kMaxValues) fail(fmt::format("more than {} values", kMaxValues));
    return m_doc.make(k);
  }
  /// Another reference to values that exist (DUP, GET, a MARK, an element put into a list or dict): bounded like the
  /// values, or a few bytes of DUPs (a 390 KB tarball) grew the stack to gigabytes.
  void refs(std::size_t n) {
    m_refs += static_cast<std::int64_t>(n);
    if (m_refs > kMaxValues)
      fail(fmt::format("more than {} references to values (DUP, GET, MARK, APPEND)", kMaxValues));
  }
  Value* pop() {
    if (m_stack.empty() || m_stack.size() <= (m_marks.empty() ? 0 : m_marks.back())) fail("pop from an empty stack");
    Value* v = m_stack.back();
    m_stack.pop_back();
    return v;
  }
  Value*& top() {
    if (m_stack.empty()) fail("the stack is empty");
    return m_stack.back();
  }
  /// The values since the last MARK, which is removed.
  std::vector<Value*> pop_mark() {
    if (m_marks.empty()) fail("no MARK on the stack");
    const std::size_t m = m_marks.back();
    m_marks.pop_back();
    std::vector<Value*> out(m_stack.begin() + static_cast<std::ptrdiff_t>(m), m_stack.end());
    m_stack.resize(m);
    return out;
  }
  Value* text(Value::Kind k, std::size_t n) {
    Value* v = make(k);
    const std::uint8_t* p = take(n);
    v->s.assign(reinterpret_cast<const char*>(p), n);
    return v;
  }
  void memo_put(std::uint64_t key) {
    if (m_memo.size() >= static_cast<std::size_t>(kMaxValues)) fail("too many memo entries");
    m_memo[key] = top();
  }
  Value* memo_get(std::uint64_t key) {
    const auto it = m_memo.find(key);
    if (it == m_memo.end()) fail(fmt::format("memo entry {} was never stored", key));
    return it->second;
  }
  void add_items(Value& container, std::vector<Value*> items) {
    if (container.kind == Value::Kind::list) {
      refs(items.size());
      for (auto& v : items) container.items.push_back(std::move(v));
    } else {
      fail(fmt::format("APPEND to a {}", kind_name(container.kind)));
    }
  }
  void set_items(Value& dict, std::vector<Value*> kv) {
    if (dict.kind != Value::Kind::dict) fail(fmt::format("SETITEM on a {}", kind_name(dict.kind)));
    if (kv.size() % 2) fail("SETITEMS with an odd number of values");
    refs(kv.size());
    for (auto& v : kv) dict.items.push_back(std::move(v));
  }

  const std::uint8_t* m_p;
  std::size_t m_n, m_at = 0, m_op_at = 0;
  std::string m_name;
  std::vector<Value*> m_stack;
  std::vector<std::size_t> m_marks;
  std::map<std::uint64_t, Value*> m_memo;
  std::int64_t m_values = 0, m_refs = 0;
  Document& m_doc;
};

Value* Reader::run() {
  for (;;) {
    m_op_at = m_at;
    const std::uint8_t op = *take(1);
    switch (op) {
      case 0x80: (void)take(1); break;        // PROTO
      case 0x95: (void)le(8); break;          // FRAME (protocol 4): the length of what follows
      case '.': {                             // STOP
        if (m_stack.size() != 1 || !m_marks.empty()) fail("STOP with a stack of more or less than one value");
        return m_stack.back();
      }
      case '(': {  // MARK
        refs(1);
        m_marks.push_back(m_stack.size());
        break;
      }
      case '}': m_stack.push_back(make(Value::Kind::dict)); break;
      case ']': m_stack.push_back(make(Value::Kind::list)); break;
      case ')': m_stack.push_back(make(Value::Kind::tuple)); break;
      case 'd': {  // DICT
        Value* d = make(Value::Kind::dict);
        set_items(*d, pop_mark());
        m_stack.push_back(d);
        break;
      }
      case 'l': {  // LIST
        Value* l = make(Value::Kind::list);
        add_items(*l, pop_mark());
        m_stack.push_back(l);
        break;
      }
      case 't': {  // TUPLE
        Value* t = make(Value::Kind::tuple);
        t->items = pop_mark();
        m_stack.push_back(t);
        break;
      }
      case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        const int n = op - 0x84;
        Value* t = make(Value::Kind::tuple);
        t->items.resize(static_cast<std::size_t>(n));
        for (int k = n - 1; k >= 0; --k) t->items[static_cast<std::size_t>(k)] = pop();
        m_stack.push_back(t);
        break;
      }
      case 's': {  // SETITEM
        Value *v = pop(), *k = pop();
        set_items(*top(), {k, v});
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<Value*> kv = pop_mark();
        set_items(*top(), std::move(kv));
        break;
      }
      case 'a': {  // APPEND
        Value* v = pop();
        add_items(*top(), {v});
        break;
      }
      case 'e': {  // APPENDS
        std::vector<Value*> vs = pop_mark();
        add_items(*top(), std::move(vs));
        break;
      }
      case 'q': memo_put(le(1)); break;      // BINPUT
      case 'r': memo_put(le(4)); break;      // LONG_BINPUT
      case 0x94: memo_put(m_memo.size()); break;  // MEMOIZE
      case 'p': {                            // PUT
        const std::string s = line();
        char* end = nullptr;
        const unsigned long long k = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || *end) fail("PUT with a malformed index");
        memo_put(k);
        break;
      }
      case 'h':  // BINGET
      case 'j': {  // LONG_BINGET
        refs(1);
        m_stack.push_back(memo_get(le(op == 'h' ? 1 : 4)));
        break;
      }
      case 'g': {                                           // GET
        const std::string s = line();
        char* end = nullptr;
        const unsigned long long k = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || *end) fail("GET with a malformed index");
        refs(1);
        m_stack.push_back(memo_get(k));
        break;
      }
      case 'J': {  // BININT
        Value* v = make(Value::Kind::integer);
        v->i = static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)));
        m_stack.push_back(v);
        break;
      }
      case 'K': case 'M': {  // BININT1, BININT2
        Value* v = make(Value::Kind::integer);
        v->i = static_cast<std::int64_t>(le(op == 'K' ? 1 : 2));
        m_stack.push_back(v);
        break;
      }
      case 0x8a: {  // LONG1: n bytes, little-endian two's complement
        const std::size_t n = *take(1);
        if (n > 8) fail(fmt::format("a {}-byte integer (at most 8 are supported)", n));
        Value* v = make(Value::Kind::integer);
        std::uint64_t u = n ? le(static_cast<int>(n)) : 0;
        if (n && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~std::uint64_t(0) << (8 * n);  // sign extension
        v->i = static_cast<std::int64_t>(u);
        m_stack.push_back(v);
        break;
      }
      case 'I': case 'L': {  // INT, LONG (text; "I01\n" is True, "I00\n" False)
        std::string s = line();
        if (op == 'L' && !s.empty() && s.back() == 'L') s.pop_back();
        Value* v = make(Value::Kind::integer);
        if (op == 'I' && (s == "00" || s == "01")) {
          v->kind = Value::Kind::boolean;
          v->i = s == "01";
        } else {
          char* end = nullptr;
          v->i = std::strtoll(s.c_str(), &end, 10);
          if (s.empty() || *end) fail("INT with a malformed value");
        }
        m_stack.push_back(v);
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        const std::uint8_t* p = take(8);
        std::uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | p[i];
        Value* v = make(Value::Kind::floating);
        std::memcpy(&v->f, &u, 8);
        m_stack.push_back(v);
        break;
      }
      case 'N': m_stack.push_back(make(Value::Kind::none)); break;
      case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
        Value* v = make(Value::Kind::boolean);
        v->i = op == 0x88;
        m_stack.push_back(v);
        break;
      }
      case 'U': m_stack.push_back(text(Value::Kind::bytes, le(1))); break;      // SHORT_BINSTRING (py2 str)
      case 'T': m_stack.push_back(text(Value::Kind::bytes, le(4))); break;      // BINSTRING (py2 str)
      case 'C': m_stack.push_back(text(Value::Kind::bytes, le(1))); break;      // SHORT_BINBYTES
      case 'B': m_stack.push_back(text(Value::Kind::bytes, le(4))); break;      // BINBYTES
      case 0x8e: m_stack.push_back(text(Value::Kind::bytes, le(8))); break;     // BINBYTES8
      case 0x96: m_stack.push_back(text(Value::Kind::bytes, le(8))); break;     // BYTEARRAY8
      case 0x8c: m_stack.push_back(text(Value::Kind::str, le(1))); break;       // SHORT_BINUNICODE
      case 'X': m_stack.push_back(text(Value::Kind::str, le(4))); break;        // BINUNICODE
      case 0x8d: m_stack.push_back(text(Value::Kind::str, le(8))); break;       // BINUNICODE8
      case 'c': {  // GLOBAL module\nname\n
        Value* g = make(Value::Kind::global);
        const std::string module = line();
        g->s = module + "." + line();
        m_stack.push_back(g);
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        Value *name = pop(), *module = pop();
        if (!module->is(Value::Kind::str) || !name->is(Value::Kind::str)) fail("STACK_GLOBAL of non-strings");
        Value* g = make(Value::Kind::global);
        g->s = module->s + "." + name->s;
        m_stack.push_back(g);
        break;
      }
      case 'R': case 0x81: {  // REDUCE, NEWOBJ: callable(*args) as a node
        Value *args = pop(), *callable = pop();
        if (!args->is(Value::Kind::tuple)) fail(fmt::format("{} with {} arguments", op == 'R' ? "REDUCE" : "NEWOBJ",
                                                            kind_name(args->kind)));
        Value* o = make(Value::Kind::object);
        o->callable = callable;
        o->args = args;
        m_stack.push_back(o);
        break;
      }
      case 'b': {  // BUILD
        Value* state = pop();
        Value*& obj = top();
        if (!obj->is(Value::Kind::object)) fail(fmt::format("BUILD on a {}", kind_name(obj->kind)));
        obj->state = state;
        break;
      }
      case '0': (void)pop(); break;  // POP
      case '1': (void)pop_mark(); break;  // POP_MARK
      case '2': {  // DUP
        refs(1);
        m_stack.push_back(top());
        break;
      }
      default:
        fail(fmt::format("unsupported opcode 0x{:02x} ('{}')", op, op >= 0x20 && op < 0x7f ? char(op) : '?'));
    }
  }
}

namespace {

/// UTF-8 to code points below 256 (latin-1): false on anything else.
bool utf8_to_latin1(const std::string& in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size();) {
    const auto b = static_cast<unsigned char>(in[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
    } else if ((b & 0xe0) == 0xc0 && i + 1 < in.size()) {
      const auto b2 = static_cast<unsigned char>(in[i + 1]);
      if ((b2 & 0xc0) != 0x80) return false;
      const unsigned cp = ((b & 0x1fu) << 6) | (b2 & 0x3fu);
      if (cp > 0xff) return false;
      out.push_back(static_cast<char>(cp));
      i += 2;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::bytes: return "bytes";
    case Value::Kind::str: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::tuple: return "tuple";
    case Value::Kind::dict: return "dict";
    case Value::Kind::global: return "global";
    case Value::Kind::object: return "object";
  }
  return "?";
}

bool Value::text_equals(const std::string& text) const {
  if (kind == Kind::bytes || kind == Kind::str) return s == text;
  std::string b;  // Python 3's protocol-2 bytes: _codecs.encode(str, 'latin1')
  return kind == Kind::object && as_bytes(*this, b) && b == text;
}

const Value* Value::get(const std::string& key) const {
  if (kind != Kind::dict) return nullptr;
  const Value* found = nullptr;
  for (std::size_t i = 0; i + 1 < items.size(); i += 2)
    if (items[i]->text_equals(key)) found = items[i + 1];
  return found;
}

std::size_t Value::count(const std::string& key) const {
  if (kind != Kind::dict) return 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i + 1 < items.size(); i += 2) n += items[i]->text_equals(key) ? 1 : 0;
  return n;
}

Value* Document::make(Value::Kind k) {
  m_values.push_back(std::make_unique<Value>());
  m_values.back()->kind = k;
  return m_values.back().get();
}

Document load(const std::uint8_t* data, std::size_t size, const std::string& name) {
  Document doc;
  doc.m_root = Reader(data, size, name, doc).run();
  return doc;
}

namespace {
bool as_bytes_at(const Value& v, std::string& out, int depth);
}

bool as_bytes(const Value& v, std::string& out) { return as_bytes_at(v, out, 0); }

namespace {
/// bytes or str equal to `t`, without looking into objects (as_bytes_at must not recurse through a cycle).
bool plain_is(const Value* v, const char* t) {
  return v && (v->kind == Value::Kind::bytes || v->kind == Value::Kind::str) && v->s == t;
}

bool as_bytes_at(const Value& v, std::string& out, int depth) {
  if (depth > 8) return false;
  if (v.is(Value::Kind::bytes)) {
    out = v.s;
    return true;
  }
  if (!v.is(Value::Kind::object) || !v.callable || !v.callable->is(Value::Kind::global) || !v.args) return false;
  const std::string& fn = v.callable->s;
  const auto& a = v.args->items;
  if (fn == "_codecs.encode" && a.size() == 2 && a[0]->is(Value::Kind::str) &&
      (plain_is(a[1], "latin1") || plain_is(a[1], "latin-1")))
    return utf8_to_latin1(a[0]->s, out);
  if (fn == "__builtin__.bytes" || fn == "builtins.bytes" || fn == "__builtin__.bytearray" ||
      fn == "builtins.bytearray") {
    if (a.empty()) {
      out.clear();
      return true;
    }
    if (a.size() == 1) return as_bytes_at(*a[0], out, depth + 1);
    if (a.size() == 2 && a[0]->is(Value::Kind::str) && (plain_is(a[1], "latin1") || plain_is(a[1], "latin-1")))
      return utf8_to_latin1(a[0]->s, out);
  }
  return false;
}
}  // namespace

}  // namespace renaissance::io::pickle
