// Named FP32 tensors in HDF5: /params (masters), /bn (running statistics), /ema (EMA weights), one dataset per
// tensor named "<layer>.<tensor>", readable by h5py. Written to a temporary file, fsynced and renamed, so a
// crash never leaves a broken file. (The checkpoint format of issue 6 extends this file.)
#pragma once

#include <renaissance/core/shape.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace renaissance::io {

inline constexpr const char* kWeightsFormat = "renaissance-weights";
/// Version 2: HDF5 1.8+ checksummed metadata and the checksum header (hdf5_util.h). Version 3 (issue 17): `version`
/// and `step` are integer attributes, strings are variable-length UTF-8, every tensor has a `layout` attribute, and
/// the dataset's `mean`, `std` (float arrays) and `class_names` are copied in. Versions 1 and 2 stay readable.
inline constexpr int kWeightsVersion = 3;

struct NamedTensor {
  std::string group;  ///< "params", "bn", "ema"
  std::string name;   ///< "<layer>.<tensor>"
  Shape shape;
  std::vector<float> values;
};

/// What a weights file carries besides its tensors: string and integer attributes, and the training dataset's
/// normalisation and class names (empty: not written).
struct WeightsMeta {
  std::map<std::string, std::string> strings;  ///< model, arch_plan, plan_hash, data (absolute path), ...
  std::map<std::string, std::int64_t> ints;    ///< step, ...
  std::vector<float> mean, std;                ///< per channel, [0,1] pixel units
  std::vector<std::string> class_names;
};

/// Writes the tensors and attributes atomically to `path`.
void write_weights(const std::string& path, const std::vector<NamedTensor>& tensors, const WeightsMeta& meta);

/// The tensor `group/name` in `tensors`, or nullptr.
const NamedTensor* find_tensor(const std::vector<NamedTensor>& tensors, const std::string& group,
                               const std::string& name);

struct WeightsFile {
  /// Every root attribute as text (io::read_attr_text: integers as digits, arrays as "[a, b]").
  std::map<std::string, std::string> attributes;
  std::vector<NamedTensor> tensors;
  /// The tensor `group/name`, or nullptr.
  const NamedTensor* find(const std::string& group, const std::string& name) const;
  /// `--ema` asks for the EMA weights: an Error naming `path` when the file has none (its run was without --ema),
  /// which would otherwise score the plain weights under the EMA's name.
  void require_ema(const std::string& path) const;
};
/// Reads and validates (format, version, checksums); errors name the file and the tensor.
WeightsFile read_weights(const std::string& path);

}  // namespace renaissance::io
