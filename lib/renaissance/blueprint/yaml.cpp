// The YAML model format (see models/*.yaml). Parsing is strict and structural only: every error
// names the file, the 1-based line, the path in the tree and the reason, so a CLI user can fix a
// model without reading C++. Shapes are checked later by the planner.
#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace renaissance::blueprint {

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
  return out;
}

namespace {

constexpr const char* kKnownKinds =
    "seq, repeat, conv, dwconv, bn, relu, tanh, identity, cbr, maxpool, gap, flatten, fc, gap_fc, add2, block, "
    "softmax_ce"
#define RN_BP_ACT_KNOWN(F, P, key) ", " #key
    RN_ACTIVATIONS(RN_BP_ACT_KNOWN);
#undef RN_BP_ACT_KNOWN

/// Kinds without parameters: the only ones that may be written as a bare scalar.
bool is_parameterless(const std::string& kind, NodeKind* out) {
  static const std::pair<const char*, NodeKind> kTable[] = {
      {"bn", NodeKind::Bn},   {"relu", NodeKind::Relu},       {"tanh", NodeKind::Tanh},
      {"gap", NodeKind::Gap}, {"flatten", NodeKind::Flatten}, {"identity", NodeKind::Identity},
#define RN_BP_ACT_KEY(F, P, key) {#key, NodeKind::F},
      RN_ACTIVATIONS(RN_BP_ACT_KEY)
#undef RN_BP_ACT_KEY
  };
  for (const auto& [name, k] : kTable) {
    if (kind == name) {
      *out = k;
      return true;
    }
  }
  return false;
}

bool is_known_kind(const std::string& kind) {
  NodeKind k;
  if (is_parameterless(kind, &k)) return true;
  for (const char* s : {"seq", "repeat", "conv", "dwconv", "cbr", "maxpool", "fc", "gap_fc", "add2", "block",
                        "softmax_ce"})
    if (kind == s) return true;
  return false;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    default: return "an undefined node";
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

enum class Bound { Positive, NonNegative };

class Parser {
 public:
  explicit Parser(std::string source) : m_source(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& path, const std::string& reason) const {
    fail_line(line_of(at), path, reason);
  }
  [[noreturn]] void fail_line(int line, const std::string& path, const std::string& reason) const {
    std::string ctx = fmt::format("{}:{}", m_source, line);
    if (!path.empty()) ctx += ": " + path;
    RN_FAIL_CTX(ctx, "{}", reason);
  }

  static int line_of(const YAML::Node& n) {
    const YAML::Mark m = n.Mark();
    return m.line < 0 ? 1 : m.line + 1;
  }

  BluePrint parse_document(const YAML::Node& doc);

  // A field value that is a layer: a list is an unnamed seq, anything else one node.
  Layer parse_layer_value(const YAML::Node& n, const std::string& path);
  Layer parse_node(const YAML::Node& n, const std::string& path);
  std::vector<Layer> parse_layer_list(const YAML::Node& n, const std::string& path);

  std::int64_t parse_int(const YAML::Node& v, const std::string& path, const std::string& field, Bound b,
                         const char* want = nullptr) const;
  bool parse_bool(const YAML::Node& v, const std::string& path, const std::string& field) const;
  std::string parse_string(const YAML::Node& v, const std::string& path, const std::string& field) const;

 private:
  std::string m_source;
};

/// The parameter map of one node: rejects unknown and duplicate keys up front, then hands out
/// typed, validated fields.
class Fields {
 public:
  Fields(const Parser& p, const YAML::Node& map, std::string path, std::string kind,
         std::vector<std::string> allowed)
      : m_parser(p), m_map(map), m_path(std::move(path)), m_kind(std::move(kind)), m_allowed(std::move(allowed)) {
    if (map.IsNull()) return;  // `bn:` with nothing after it
    if (!map.IsMap())
      p.fail(map, m_path, fmt::format("parameters of {} must be a map {{{}}}, got {}", m_kind, join(m_allowed),
                                      describe(map)));
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) p.fail(key, m_path, fmt::format("field names must be plain strings, got {}", describe(key)));
      const std::string k = key.Scalar();
      bool ok = false;
      for (const auto& a : m_allowed) ok = ok || a == k;
      if (!ok) p.fail(key, m_path, fmt::format("unknown field '{}' (fields of {}: {})", k, m_kind, join(m_allowed)));
      for (const auto& e : m_entries)
        if (e.first == k) p.fail(key, m_path, fmt::format("duplicate field '{}'", k));
      m_entries.emplace_back(k, it->second);
    }
  }

  const YAML::Node* find(const std::string& key) const {
    for (const auto& e : m_entries)
      if (e.first == key) return &e.second;
    return nullptr;
  }
  const YAML::Node& require(const std::string& key) const {
    if (const YAML::Node* v = find(key)) return *v;
    m_parser.fail(m_map, m_path, fmt::format("missing field '{}' (fields of {}: {})", key, m_kind, join(m_allowed)));
  }
  std::int64_t int_req(const std::string& key, Bound b) const {
    return m_parser.parse_int(require(key), m_path, key, b);
  }
  std::int64_t int_opt(const std::string& key, Bound b, std::int64_t dflt) const {
    const YAML::Node* v = find(key);
    return v ? m_parser.parse_int(*v, m_path, key, b) : dflt;
  }
  bool bool_opt(const std::string& key, bool dflt) const {
    const YAML::Node* v = find(key);
    return v ? m_parser.parse_bool(*v, m_path, key) : dflt;
  }
  /// Every node may be named; an absent name stays empty so the planner names it.
  std::string name() const {
    const YAML::Node* v = find("name");
    if (!v) return std::string();
    const std::string n = m_parser.parse_string(*v, m_path, "name");
    // Names become tensor names (NAME.w) and HDF5 paths (/params/NAME.w) of weights and checkpoints: a '/' made the
    // save fail after the whole training, a NUL cut the path short.
    for (const char c : n)
      if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        m_parser.fail(*v, m_path,
                      fmt::format("name '{}': {} is not allowed in a layer name (names become tensor names NAME.w "
                                  "and HDF5 paths /params/NAME.w; use letters, digits, '_', '-' or '.')",
                                  printable(n), c == '/' ? std::string("'/'")
                                                         : fmt::format("the control character 0x{:02x}",
                                                                       static_cast<unsigned char>(c))));
    return n;
  }
  /// groups: a positive integer or "depthwise".
  std::int64_t groups() const {
    const YAML::Node* v = find("groups");
    if (!v) return 1;
    if (v->IsScalar() && v->Scalar() == "depthwise") return kDepthwise;
    return m_parser.parse_int(*v, m_path, "groups", Bound::Positive, "a positive integer or 'depthwise'");
  }
 private:
  const Parser& m_parser;
  YAML::Node m_map;
  std::string m_path, m_kind;
  std::vector<std::string> m_allowed;
  std::vector<std::pair<std::string, YAML::Node>> m_entries;
};

std::int64_t Parser::parse_int(const YAML::Node& v, const std::string& path, const std::string& field, Bound b,
                               const char* want) const {
  if (!want) want = b == Bound::Positive ? "a positive integer" : "a non-negative integer";
  if (!v.IsScalar()) fail(v, path, fmt::format("field '{}' must be {}, got {}", field, want, describe(v)));
  // Our own strict decimal parse: yaml-cpp's conversion would read "010" as octal.
  const std::string& s = v.Scalar();
  const char* first = s.data() + (s.size() > 1 && s[0] == '+' ? 1 : 0);
  const char* last = s.data() + s.size();
  std::int64_t x = 0;
  auto [ptr, ec] = std::from_chars(first, last, x);
  if (s.empty() || ec != std::errc() || ptr != last)
    fail(v, path, fmt::format("field '{}' must be {}, got {}", field, want, describe(v)));
  if (b == Bound::Positive && x < 1) fail(v, path, fmt::format("field '{}' must be {}, got {}", field, want, x));
  if (b == Bound::NonNegative && x < 0) fail(v, path, fmt::format("field '{}' must be {}, got {}", field, want, x));
  return x;
}

bool Parser::parse_bool(const YAML::Node& v, const std::string& path, const std::string& field) const {
  if (v.IsScalar()) {
    const std::string& s = v.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  fail(v, path, fmt::format("field '{}' must be true or false, got {}", field, describe(v)));
}

std::string Parser::parse_string(const YAML::Node& v, const std::string& path, const std::string& field) const {
  if (!v.IsScalar()) fail(v, path, fmt::format("field '{}' must be a string, got {}", field, describe(v)));
  return v.Scalar();
}

std::vector<Layer> Parser::parse_layer_list(const YAML::Node& n, const std::string& path) {
  if (!n.IsSequence()) fail(n, path, fmt::format("expected a list of layers, got {}", describe(n)));
  std::vector<Layer> out;
  out.reserve(n.size());
  for (std::size_t i = 0; i < n.size(); ++i) out.push_back(parse_node(n[i], fmt::format("{}[{}]", path, i)));
  return out;
}

Layer Parser::parse_layer_value(const YAML::Node& n, const std::string& path) {
  if (n.IsSequence()) return seq(parse_layer_list(n, path));
  return parse_node(n, path);
}

Layer Parser::parse_node(const YAML::Node& n, const std::string& path) {
  NodeKind simple;
  if (n.IsScalar()) {
    const std::string& kind = n.Scalar();
    if (is_parameterless(kind, &simple)) {
      Layer l;
      l.kind = simple;
      return l;
    }
    if (is_known_kind(kind))
      fail(n, path, fmt::format("layer '{}' needs parameters (write `{}: {{...}}`)", kind, kind));
    fail(n, path, fmt::format("unknown layer kind '{}' (known: {})", kind, kKnownKinds));
  }
  if (n.IsNull()) fail(n, path, "empty layer (expected a kind name or a one-key map)");
  if (!n.IsMap())
    fail(n, path, fmt::format("a layer must be a kind name or a one-key map, got {} (write `seq: [...]`)",
                              describe(n)));
  if (n.size() != 1) {
    std::vector<std::string> keys;
    for (auto it = n.begin(); it != n.end(); ++it) keys.push_back(it->first.IsScalar() ? it->first.Scalar() : "?");
    fail(n, path, fmt::format("a layer must be a map with exactly one key (its kind), got keys: {}{}", join(keys),
                              " (a name goes inside the parameters: `conv: {out: 8, k: 3, name: c1}`)"));
  }
  const auto it = n.begin();
  const YAML::Node key = it->first;
  const YAML::Node val = it->second;
  if (!key.IsScalar()) fail(key, path, fmt::format("a layer kind must be a string, got {}", describe(key)));
  const std::string kind = key.Scalar();
  const std::string p = path + "." + kind;

  if (is_parameterless(kind, &simple)) {
    Fields f(*this, val, p, kind, {"name"});
    Layer l;
    l.kind = simple;
    return l.named(f.name());
  }
  if (kind == "seq") {
    if (val.IsSequence()) return seq(parse_layer_list(val, p));
    Fields f(*this, val, p, kind, {"layers", "name"});
    return seq(parse_layer_list(f.require("layers"), p + ".layers")).named(f.name());
  }
  if (!is_known_kind(kind)) fail(key, path, fmt::format("unknown layer kind '{}' (known: {})", kind, kKnownKinds));
  // A null value's mark points past it, so report the layer's own line.
  if (val.IsNull()) fail(n, p, fmt::format("layer '{}' needs parameters (write `{}: {{...}}`)", kind, kind));

  if (kind == "conv" || kind == "cbr") {
    Fields f(*this, val, p, kind, {"out", "k", "stride", "pad", "groups", "bias", "name"});
    const std::int64_t groups = f.groups();
    // Depthwise output channels default to the input channels, resolved at shape inference.
    const std::int64_t out = groups == kDepthwise && !f.find("out") ? 0 : f.int_req("out", Bound::Positive);
    if (groups > 1 && out % groups != 0)
      fail(*f.find("groups"), p, fmt::format("field 'out' ({}) must be divisible by 'groups' ({})", out, groups));
    Layer l = conv(out, f.int_req("k", Bound::Positive), f.int_opt("stride", Bound::Positive, 1),
                   f.int_opt("pad", Bound::NonNegative, 0), groups, f.bool_opt("bias", false));
    if (kind == "cbr") l.kind = NodeKind::Cbr;
    return l.named(f.name());
  }
  if (kind == "dwconv") {
    Fields f(*this, val, p, kind, {"k", "stride", "pad", "bias", "name"});
    Layer l = dwconv(f.int_req("k", Bound::Positive), f.int_opt("stride", Bound::Positive, 1),
                     f.int_opt("pad", Bound::NonNegative, 0));
    l.bias = f.bool_opt("bias", false);
    return l.named(f.name());
  }
  if (kind == "maxpool") {
    Fields f(*this, val, p, kind, {"k", "stride", "pad", "name"});
    const std::int64_t k = f.int_req("k", Bound::Positive);
    // As in PyTorch, the stride defaults to the kernel size.
    return maxpool(k, f.int_opt("stride", Bound::Positive, k), f.int_opt("pad", Bound::NonNegative, 0))
        .named(f.name());
  }
  if (kind == "fc" || kind == "gap_fc") {
    Fields f(*this, val, p, kind, {"out", "name"});
    const std::int64_t out = f.int_req("out", Bound::Positive);
    return (kind == "fc" ? fc(out) : gap_fc(out)).named(f.name());
  }
  if (kind == "softmax_ce") {
    Fields f(*this, val, p, kind, {"classes", "name"});
    return softmax_ce(f.int_req("classes", Bound::Positive)).named(f.name());
  }
  if (kind == "repeat") {
    Fields f(*this, val, p, kind, {"n", "layer", "name"});
    const std::int64_t count = f.int_req("n", Bound::Positive);
    return repeat(count, parse_layer_value(f.require("layer"), p + ".layer")).named(f.name());
  }
  if (kind == "add2") {
    Fields f(*this, val, p, kind, {"main", "shortcut", "name"});
    Layer main = parse_layer_value(f.require("main"), p + ".main");
    const YAML::Node* sc = f.find("shortcut");
    Layer shortcut = sc ? parse_layer_value(*sc, p + ".shortcut") : seq(std::vector<Layer>{});
    return add2(std::move(main), std::move(shortcut)).named(f.name());
  }
  // block
  Fields f(*this, val, p, kind, {"mid", "out", "kind", "stride", "name"});
  const YAML::Node& kn = f.require("kind");
  if (!kn.IsScalar())
    fail(kn, p, fmt::format("field 'kind' must be one of RESNET_1_3_1, RESNET_3_3, MBV2_INV_RESIDUAL, got {}",
                            describe(kn)));
  BlockKind bk;
  try {
    bk = block_kind_from_name(kn.Scalar());
  } catch (const Error& e) {
    fail(kn, p, "field 'kind': " + e.message());
  }
  const std::int64_t out = f.int_req("out", Bound::Positive);
  // A basic block has no separate middle width; let users leave it out.
  const std::int64_t mid = bk == BlockKind::RESNET_3_3 && !f.find("mid") ? out : f.int_req("mid", Bound::Positive);
  return block(mid, out, bk, f.int_opt("stride", Bound::Positive, 1)).named(f.name());
}

BluePrint Parser::parse_document(const YAML::Node& doc) {
  if (doc.IsNull() || !doc.IsDefined()) fail_line(1, "", "empty model (expected the keys name, input, layers)");
  if (!doc.IsMap()) fail(doc, "", fmt::format("a model must be a map with keys name, input, layers, got {}",
                                              describe(doc)));
  Fields f(*this, doc, "", "a model", {"name", "input", "layers"});
  BluePrint bp;
  bp.name = parse_string(f.require("name"), "", "name");
  const YAML::Node& in = f.require("input");
  if (!in.IsSequence() || in.size() != 3)
    fail(in, "", fmt::format("field 'input' must be a list [H, W, C] of 3 positive integers, got {}{}",
                                  describe(in), in.IsSequence() ? fmt::format(" of {} items", in.size()) : ""));
  bp.in_h = parse_int(in[0], "", "input[0] (H)", Bound::Positive);
  bp.in_w = parse_int(in[1], "", "input[1] (W)", Bound::Positive);
  bp.in_c = parse_int(in[2], "", "input[2] (C)", Bound::Positive);
  // What the planner and the input pipeline take, said here with the file and line.
  if (const std::string problem = input_shape_problem(bp.in_h, bp.in_w, bp.in_c); !problem.empty())
    fail(in, "", problem);
  bp.root = parse_layer_value(f.require("layers"), "layers");
  return bp;
}

// ---- emitter -----------------------------------------------------------------------------------

bool is_reserved_scalar(const std::string& s) {
  std::string l;
  for (char c : s) l += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (const char* r : {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "depthwise"})
    if (l == r) return true;
  return false;
}

/// Plain when unambiguous (identifier-like), else double-quoted with escapes, so any name round-trips.
std::string yaml_string(const std::string& s) {
  bool plain = !s.empty() && !is_reserved_scalar(s) &&
               ((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_');
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-' || c == '/';
    plain = plain && ok;
  }
  if (plain) return s;
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"') q += "\\\"";
    else if (c == '\\') q += "\\\\";
    else if (c < 0x20 || c == 0x7f) q += fmt::format("\\x{:02x}", c);
    else q += static_cast<char>(c);
  }
  return q + "\"";
}

bool is_unnamed_seq(const Layer& l) { return l.kind == NodeKind::Seq && l.name.empty(); }
bool is_composite(const Layer& l) {
  return l.kind == NodeKind::Seq || l.kind == NodeKind::Repeat || l.kind == NodeKind::Add2;
}

class Emitter {
 public:
  std::string& out() { return m_out; }

  /// A leaf node on one line: `bn`, `conv: {out: 64, k: 7, stride: 2, pad: 3}`.
  std::string inline_leaf(const Layer& l) {
    std::vector<std::string> f;
    auto kv = [&f](const char* k, const std::string& v) { f.push_back(fmt::format("{}: {}", k, v)); };
    auto num = [&kv](const char* k, std::int64_t v) { kv(k, std::to_string(v)); };
    std::string kind = node_kind_name(l.kind);
    switch (l.kind) {
      case NodeKind::Conv:
      case NodeKind::Cbr:
        if (l.kind == NodeKind::Conv && l.groups == kDepthwise && l.out_c == 0) {
          kind = "dwconv";
        } else if (!(l.groups == kDepthwise && l.out_c == 0)) {
          num("out", l.out_c);
        }
        num("k", l.k);
        num("stride", l.stride);
        num("pad", l.pad);
        if (kind != "dwconv" && l.groups != 1)
          kv("groups", l.groups == kDepthwise ? "depthwise" : std::to_string(l.groups));
        if (l.bias) kv("bias", "true");
        break;
      case NodeKind::MaxPool:
        num("k", l.k);
        num("stride", l.stride);
        num("pad", l.pad);
        break;
      case NodeKind::Fc:
      case NodeKind::GapFc: num("out", l.out_c); break;
      case NodeKind::SoftmaxCE: num("classes", l.count); break;
      case NodeKind::Block:
        num("mid", l.mid_c);
        num("out", l.out_c);
        kv("kind", block_kind_name(l.block));
        num("stride", l.stride);
        break;
      default: break;  // parameterless
    }
    if (!l.name.empty()) kv("name", yaml_string(l.name));
    if (f.empty()) return kind;
    return kind + ": {" + join(f) + "}";
  }

  void indent(int col) { m_out.append(static_cast<std::size_t>(col), ' '); }

  /// `key: value` at column col, where the value is a layer (list = unnamed seq).
  void layer_field(const char* key, const Layer& l, int col) {
    indent(col);
    m_out += key;
    if (is_unnamed_seq(l)) {
      if (l.children.empty()) {
        m_out += ": []\n";
        return;
      }
      m_out += ":\n";
      for (const Layer& c : l.children) item(c, col + 2);
    } else if (!is_composite(l)) {
      m_out += ": " + flow_node(l) + "\n";
    } else {
      m_out += ":\n";
      indent(col + 2);
      node(l, col + 2);
    }
  }

  /// A leaf as a flow value: a scalar kind stays a scalar, a parameterised one becomes `{kind: {...}}`.
  std::string flow_node(const Layer& l) {
    const std::string s = inline_leaf(l);
    return s.find(':') == std::string::npos ? s : "{" + s + "}";
  }

  /// A list item `- node` with the dash at column col.
  void item(const Layer& l, int col) {
    indent(col);
    m_out += "- ";
    node(l, col + 2);
  }

  /// A node whose first line is already indented to col.
  void node(const Layer& l, int col) {
    switch (l.kind) {
      case NodeKind::Seq:
        if (l.children.empty() && l.name.empty()) {
          m_out += "seq: []\n";
        } else if (l.name.empty()) {
          m_out += "seq:\n";
          for (const Layer& c : l.children) item(c, col + 2);
        } else {
          m_out += "seq:\n";
          name_field(l, col + 2);
          layer_field("layers", seq(l.children), col + 2);
        }
        return;
      case NodeKind::Repeat:
        RN_CHECK(l.children.size() == 1, "repeat node must have exactly one child, has {}", l.children.size());
        if (!is_composite(l.children[0])) {  // the common `repeat: {n: 2, layer: {block: {...}}}` on one line
          m_out += fmt::format("repeat: {{n: {}, layer: {}", l.count, flow_node(l.children[0]));
          if (!l.name.empty()) m_out += ", name: " + yaml_string(l.name);
          m_out += "}\n";
          return;
        }
        m_out += "repeat:\n";
        name_field(l, col + 2);
        indent(col + 2);
        m_out += fmt::format("n: {}\n", l.count);
        layer_field("layer", l.children[0], col + 2);
        return;
      case NodeKind::Add2:
        RN_CHECK(l.children.size() == 2, "add2 node must have exactly two children, has {}", l.children.size());
        m_out += "add2:\n";
        name_field(l, col + 2);
        layer_field("main", l.children[0], col + 2);
        layer_field("shortcut", l.children[1], col + 2);
        return;
      default: m_out += inline_leaf(l) + "\n"; return;
    }
  }

  void name_field(const Layer& l, int col) {
    if (l.name.empty()) return;
    indent(col);
    m_out += "name: " + yaml_string(l.name) + "\n";
  }

 private:
  std::string m_out;
};

}  // namespace

namespace {

/// Counts the documents of a YAML text, stopping at `cap`. yaml-cpp 0.7's LoadAll never returns on some inputs
/// (a lone ',' makes HandleNextDocument report an empty document forever; found by tests/fuzz), so the documents
/// are counted with a bounded loop and only the first is built, by YAML::Load.
class DocumentCounter : public YAML::EventHandler {
 public:
  int documents = 0;
  int second_line = 0;  ///< 1-based line of the second document's root node (as a YAML::Node mark would say)
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents == 2) second_line = mark.line + 1;
    m_root_seen = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { node(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnMapEnd() override {}

 private:
  bool m_root_seen = false;
  void node(const YAML::Mark& m) {
    if (documents == 2 && !m_root_seen) second_line = m.line + 1;
    m_root_seen = true;
  }
};

/// The bounded pass behind check_yaml_limits: the depth of every collection, and the expanded size of every
/// anchored node, so each alias adds what it stands for. Throws as soon as a limit is crossed, before any number
/// can grow further.
class LimitScanner : public YAML::EventHandler {
 public:
  explicit LimitScanner(const std::string& source) : m_source(source) {}
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t a) override { leaf(m, a); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t a, const std::string&) override { leaf(m, a); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t a) override {
    // yaml-cpp registers an anchor when its list or map opens, so an alias inside that collection makes the
    // built node contain itself: every walk over it would recurse without end.
    for (const Open& o : m_stack)
      if (o.anchor != YAML::NullAnchor && o.anchor == a)
        RN_FAIL_CTX(fmt::format("{}:{}", m_source, m.line + 1),
                    "YAML alias refers to a list or map that contains it (a cycle); an alias may only repeat "
                    "a node that is complete");
    const Anchored size = a < m_anchors.size() ? m_anchors[a] : Anchored{};
    m_alias_nodes += size.nodes;
    m_nodes += size.nodes;
    if (m_alias_nodes > kMaxYamlAliasNodes)
      RN_FAIL_CTX(fmt::format("{}:{}", m_source, m.line + 1),
                  "YAML aliases expand to more than {} nodes (the limit; anchors that alias anchors grow "
                  "exponentially: a \"billion laughs\" file?)",
                  kMaxYamlAliasNodes);
    if (static_cast<std::int64_t>(m_stack.size()) + size.height > kMaxYamlDepth)
      RN_FAIL_CTX(fmt::format("{}:{}", m_source, m.line + 1),
                  "YAML nesting, with this alias expanded, is deeper than {} levels of lists and maps (the limit)",
                  kMaxYamlDepth);
    below(size.height);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t a, YAML::EmitterStyle::value) override {
    open(m, a);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t a, YAML::EmitterStyle::value) override {
    open(m, a);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Anchored {
    std::int64_t nodes = 1;   ///< expanded node count
    std::int64_t height = 0;  ///< levels of lists/maps inside, itself included
  };
  struct Open {
    YAML::anchor_t anchor;
    std::int64_t nodes_before;
    std::int64_t height_below = 0;
  };
  void record(YAML::anchor_t a, Anchored v) {
    if (a == YAML::NullAnchor) return;
    if (m_anchors.size() <= a) m_anchors.resize(a + 1);
    m_anchors[a] = v;
  }
  void below(std::int64_t height) {
    if (!m_stack.empty()) m_stack.back().height_below = std::max(m_stack.back().height_below, height);
  }
  void leaf(const YAML::Mark&, YAML::anchor_t a) {
    ++m_nodes;
    record(a, Anchored{1, 0});
  }
  void open(const YAML::Mark& m, YAML::anchor_t a) {
    if (static_cast<int>(m_stack.size()) >= kMaxYamlDepth)
      RN_FAIL_CTX(fmt::format("{}:{}", m_source, m.line + 1),
                  "YAML nesting is deeper than {} levels of lists and maps (the limit)", kMaxYamlDepth);
    m_stack.push_back({a, m_nodes});
    ++m_nodes;
  }
  void close() {
    if (m_stack.empty()) return;
    const Open o = m_stack.back();
    m_stack.pop_back();
    const std::int64_t height = 1 + o.height_below;
    record(o.anchor, Anchored{m_nodes - o.nodes_before, height});
    below(height);
  }

  const std::string& m_source;
  std::vector<Open> m_stack;
  std::vector<Anchored> m_anchors;  ///< per anchor id (yaml-cpp numbers anchors 1, 2, ... in order)
  std::int64_t m_nodes = 0, m_alias_nodes = 0;
};

}  // namespace

void check_yaml_limits(const std::string& text, const std::string& source) {
  RN_CHECK_CTX(static_cast<std::int64_t>(text.size()) <= kMaxYamlBytes, source,
               "{} bytes of YAML is more than the {} MiB a model, run configuration or plan may have", text.size(),
               kMaxYamlBytes >> 20);
  std::istringstream in(text);
  LimitScanner scan(source);
  try {
    YAML::Parser events(in);
    events.HandleNextDocument(scan);  // the first document: what YAML::Load builds
  } catch (const YAML::Exception&) {
    // Malformed YAML: the caller's own parse reports it with its context.
  }
}

int second_yaml_document_line(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser events(in);
  DocumentCounter counter;
  for (int i = 0; i < 2 && events.HandleNextDocument(counter); ++i) {
  }
  return counter.documents > 1 ? std::max(1, counter.second_line) : 0;
}

BluePrint blueprint_from_yaml(const std::string& text, const std::string& source) {
  Parser parser(source);
  check_yaml_limits(text, source);
  try {
    // A second document would otherwise be ignored silently.
    if (const int second = second_yaml_document_line(text))
      parser.fail_line(second, "", "a model file holds one YAML document, found a second one");
    return parser.parse_document(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    // Malformed YAML, or yaml-cpp refusing an operation on a node: both point at a mark.
    const int line = e.mark.line < 0 ? 1 : e.mark.line + 1;
    parser.fail_line(line, "", fmt::format("malformed YAML: {}", printable(e.msg)));
  }
}

std::string read_yaml_file(const std::string& path, const std::string& what) {
  require_input_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) RN_FAIL_CTX(path, "cannot open the {}: {}", what, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  RN_CHECK_CTX(size >= 0 && size <= kMaxYamlBytes, path, "{}: {} bytes is more than the {} MiB a YAML input may have",
               what, static_cast<long long>(size), kMaxYamlBytes >> 20);
  in.seekg(0, std::ios::beg);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) RN_FAIL_CTX(path, "cannot read the {}: {}", what, std::strerror(errno));
  return ss.str();
}

BluePrint load_blueprint_file(const std::string& path) {
  return blueprint_from_yaml(read_yaml_file(path, "model file"), path);
}

std::string blueprint_to_yaml(const BluePrint& bp) {
  Emitter e;
  e.out() += "name: " + yaml_string(bp.name) + "\n";
  e.out() += fmt::format("input: [{}, {}, {}]\n", bp.in_h, bp.in_w, bp.in_c);
  e.layer_field("layers", bp.root, 0);
  return e.out();
}

}  // namespace renaissance::blueprint
