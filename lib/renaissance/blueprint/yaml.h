// The YAML model format: the same tree as the C++ DSL, so CLI users never need C++.
#pragma once

#include <renaissance/blueprint/blueprint.h>

#include <string>

namespace renaissance::blueprint {

/// Parses a model from YAML text. `source` names the file in error messages
/// ("model.yaml:12: layers[3].conv: field 'k' must be a positive integer").
BluePrint blueprint_from_yaml(const std::string& text, const std::string& source = "<yaml>");
/// Reads and parses a model file; errors name the file.
BluePrint load_blueprint_file(const std::string& path);
/// Emits YAML that blueprint_from_yaml parses back to an equal BluePrint.
std::string blueprint_to_yaml(const BluePrint& bp);

}  // namespace renaissance::blueprint
