// Named FP32 tensors in HDF5: /params (masters), /bn (running statistics), /ema (EMA weights), one dataset per
// tensor named "<layer>.<tensor>", readable by h5py. Written to a temporary file, fsynced and renamed, so a
// crash never leaves a broken file. (The checkpoint format of issue 6 extends this file.)
#pragma once

#include <renaissance/core/shape.h>

#include <map>
#include <string>
#include <vector>

namespace renaissance::io {

inline constexpr const char* kWeightsFormat = "renaissance-weights";
/// Version 2: HDF5 1.8+ checksummed metadata and the checksum header (hdf5_util.h); version 1 stays readable.
inline constexpr int kWeightsVersion = 2;

struct NamedTensor {
  std::string group;  ///< "params", "bn", "ema"
  std::string name;   ///< "<layer>.<tensor>"
  Shape shape;
  std::vector<float> values;
};

/// Writes the tensors and string attributes (model, step, ...) atomically to `path`.
void write_weights(const std::string& path, const std::vector<NamedTensor>& tensors,
                   const std::map<std::string, std::string>& attributes);

/// The tensor `group/name` in `tensors`, or nullptr.
const NamedTensor* find_tensor(const std::vector<NamedTensor>& tensors, const std::string& group,
                               const std::string& name);

struct WeightsFile {
  std::map<std::string, std::string> attributes;
  std::vector<NamedTensor> tensors;
  /// The tensor `group/name`, or nullptr.
  const NamedTensor* find(const std::string& group, const std::string& name) const;
};
/// Reads and validates (format, version, checksums); errors name the file and the tensor.
WeightsFile read_weights(const std::string& path);

}  // namespace renaissance::io
