// ArchPlan <-> YAML: the plan is inspectable and versionable; the round trip is exact.
#include <renaissance/blueprint/yaml.h>
#include <renaissance/core/error.h>
#include <renaissance/plan/arch_plan.h>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <type_traits>
#include <variant>

namespace renaissance::plan {

namespace {

constexpr const char* kFormat = "renaissance-arch-plan";
constexpr int kVersion = 1;

/// The parameters a layer kind has, default-valued (their fields: ops/params.h).
LayerParams default_params(LayerKind k) {
  switch (k) {
    case LayerKind::Conv:
    case LayerKind::CBR: return ConvParams{};
    case LayerKind::MaxPool: return PoolParams{};
    case LayerKind::Fc:
    case LayerKind::GapFC:
    case LayerKind::SoftmaxCE:
    case LayerKind::ChannelPadding: return FcParams{};
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection:
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection:
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity: return BlockParams{};
    default: return NoParams{};
  }
}

void emit_shape(YAML::Emitter& out, const Shape& s) {
  out << YAML::Flow << YAML::BeginSeq << s.n << s.h << s.w << s.c << YAML::EndSeq;
}

std::string where(const YAML::Node& n, const std::string& source) {
  if (!n.IsDefined()) return source;  // a missing map (e.g. no 'params'): Mark() would throw
  const YAML::Mark m = n.Mark();
  return m.is_null() ? source : fmt::format("{}:{}", source, m.line + 1);
}

template <typename T>
T get(const YAML::Node& parent, const char* key, const std::string& source, const std::string& path) {
  // A missing parent (e.g. no 'params') is an invalid node: indexing it would throw a yaml-cpp exception.
  RN_CHECK_CTX(parent.IsDefined() && parent.IsMap(), where(parent, source),
               "{}: missing or not a map (needs field '{}')", path, key);
  const YAML::Node n = parent[key];
  RN_CHECK_CTX(n.IsDefined() && !n.IsNull(), where(parent, source), "{}: missing field '{}'", path, key);
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    RN_FAIL_CTX(where(n, source), "{}: field '{}' has the wrong type", path, key);
  }
}

Shape read_shape(const YAML::Node& parent, const char* key, const std::string& source, const std::string& path) {
  const auto v = get<std::vector<std::int64_t>>(parent, key, source, path);
  RN_CHECK_CTX(v.size() == 4, where(parent[key], source), "{}: field '{}' must be [n, h, w, c]", path, key);
  return Shape{v[0], v[1], v[2], v[3]};
}

}  // namespace

std::string ArchPlan::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format" << YAML::Value << kFormat;
  out << YAML::Key << "version" << YAML::Value << kVersion;
  out << YAML::Key << "model" << YAML::Value << model_name;
  out << YAML::Key << "input" << YAML::Value;
  emit_shape(out, input);
  out << YAML::Key << "input_channels" << YAML::Value << input_channels;
  out << YAML::Key << "num_classes" << YAML::Value << num_classes;
  out << YAML::Key << "amp" << YAML::Value << amp;
  out << YAML::Key << "fuse" << YAML::Value << fuse;
  out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
  for (const ArchLayer& l : layers) {
    out << YAML::BeginMap;
    out << YAML::Key << "kind" << YAML::Value << layer_kind_name(l.kind);
    out << YAML::Key << "name" << YAML::Value << l.name;
    // Every field of the kind's parameters (ops/params.h), in field-list order, as one flow map.
    std::visit(
        [&out](const auto& p) {
          if (std::is_same_v<std::decay_t<decltype(p)>, NoParams>) return;
          out << YAML::Key << "params" << YAML::Value << YAML::Flow << YAML::BeginMap;
          ops::for_each_field(p,
                              [&out](const char* key, const auto& v) { out << YAML::Key << key << YAML::Value << v; });
          out << YAML::EndMap;
        },
        l.params);
    out << YAML::Key << "in" << YAML::Value;
    emit_shape(out, l.in_shape);
    out << YAML::Key << "out" << YAML::Value;
    emit_shape(out, l.out_shape);
    if (l.is_first_layer) out << YAML::Key << "first" << YAML::Value << true;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

ArchPlan ArchPlan::from_yaml(const std::string& text, const std::string& source) {
  blueprint::check_yaml_limits(text, source);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    RN_FAIL_CTX(fmt::format("{}:{}", source, e.mark.line + 1), "malformed YAML: {}", blueprint::printable(e.msg));
  }
  RN_CHECK_CTX(root.IsMap(), source, "an arch plan must be a YAML map");
  RN_CHECK_CTX(get<std::string>(root, "format", source, "plan") == kFormat, source,
               "not an arch plan (format must be '{}')", kFormat);
  const int version = get<int>(root, "version", source, "plan");
  RN_CHECK_CTX(version == kVersion, source, "unsupported arch plan version {} (this build reads {})", version,
               kVersion);
  ArchPlan plan;
  plan.model_name = get<std::string>(root, "model", source, "plan");
  plan.input = read_shape(root, "input", source, "plan");
  plan.input_channels = get<std::int64_t>(root, "input_channels", source, "plan");
  plan.num_classes = get<std::int64_t>(root, "num_classes", source, "plan");
  plan.amp = get<bool>(root, "amp", source, "plan");
  plan.fuse = get<bool>(root, "fuse", source, "plan");
  const YAML::Node layers = root["layers"];
  RN_CHECK_CTX(layers.IsSequence(), where(root, source), "plan: 'layers' must be a list");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const YAML::Node n = layers[i];
    const std::string path = fmt::format("layers[{}]", i);
    ArchLayer l;
    try {
      l.kind = layer_kind_from_name(get<std::string>(n, "kind", source, path));
    } catch (const Error& e) {
      throw e.with_context(where(n, source) + ": " + path);
    }
    l.name = get<std::string>(n, "name", source, path);
    const std::string ppath = path + ".params";
    l.params = default_params(l.kind);
    std::visit(
        [&](auto& p) {
          if (std::is_same_v<std::decay_t<decltype(p)>, NoParams>) return;
          const YAML::Node pn = n["params"];
          ops::for_each_field(
              p, [&](const char* key, auto& v) { v = get<std::decay_t<decltype(v)>>(pn, key, source, ppath); });
        },
        l.params);
    l.in_shape = read_shape(n, "in", source, path);
    l.out_shape = read_shape(n, "out", source, path);
    l.is_first_layer = n["first"].IsDefined() && get<bool>(n, "first", source, path);
    plan.layers.push_back(std::move(l));
  }
  return plan;
}

}  // namespace renaissance::plan
