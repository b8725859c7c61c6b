// The YAML model format: the same tree as the C++ DSL, so CLI users never need C++.
#pragma once

#include <renaissance/blueprint/blueprint.h>

#include <cstdint>
#include <string>

namespace renaissance::blueprint {

/// Limits every YAML reader of ours (model files, run.yaml, arch plans, the YAML inside weights and checkpoints)
/// applies to its input before building a document, so a few KB of text cannot make a parse expensive.
inline constexpr int kMaxYamlDepth = 100;                     ///< nested lists/maps (a real model needs < 20)
inline constexpr std::int64_t kMaxYamlAliasNodes = 1000000;   ///< nodes that aliases (*name) add when expanded
inline constexpr std::int64_t kMaxYamlBytes = 64 << 20;       ///< one input (an arch plan at the layer cap: ~20 MB)

/// Scans the first YAML document of `text` with a bounded event pass: refuses nesting deeper than kMaxYamlDepth
/// and aliases whose expansion ("billion laughs": anchors of anchors) would add more than kMaxYamlAliasNodes
/// nodes, and aliases inside the collection they name (`&a [*a]`, a node that contains itself). Errors name
/// `source`:line and the limit. Malformed YAML is left to the caller's parser.
void check_yaml_limits(const std::string& text, const std::string& source);

/// The text of a YAML input file (`what`: "model file", "--config"), refused before it is read when larger than
/// kMaxYamlBytes (a 3 GB file ended in "std::bad_alloc" naming nothing). Errors name the file.
std::string read_yaml_file(const std::string& path, const std::string& what);

/// The 1-based line where a second YAML document of `text` starts, or 0 when it holds one (or none): yaml-cpp's
/// Load builds the first and ignores the rest without a word. Counted with a bounded loop (LoadAll never returns on
/// some inputs). Malformed YAML throws YAML::Exception.
int second_yaml_document_line(const std::string& text);

/// `s` for a message: control characters (a NUL yaml-cpp quotes from the input) as \xNN.
std::string printable(const std::string& s);

/// Parses a model from YAML text. `source` names the file in error messages
/// ("model.yaml:12: layers[3].conv: field 'k' must be a positive integer").
BluePrint blueprint_from_yaml(const std::string& text, const std::string& source = "<yaml>");
/// Reads and parses a model file; errors name the file.
BluePrint load_blueprint_file(const std::string& path);
/// Emits YAML that blueprint_from_yaml parses back to an equal BluePrint.
std::string blueprint_to_yaml(const BluePrint& bp);

}  // namespace renaissance::blueprint
