#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/hdf5_util.h>
#include <renaissance/io/weights.h>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace renaissance::io {

namespace {

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& ctx) {
  return read_attr_text(obj, name, ctx);  // strings of any kind; integers (version 3) as digits
}

}  // namespace

const NamedTensor* find_tensor(const std::vector<NamedTensor>& tensors, const std::string& group,
                               const std::string& name) {
  for (const NamedTensor& t : tensors)
    if (t.group == group && t.name == name) return &t;
  return nullptr;
}

const NamedTensor* WeightsFile::find(const std::string& group, const std::string& name) const {
  return find_tensor(tensors, group, name);
}

void WeightsFile::require_ema(const std::string& path) const {
  const bool has = std::any_of(tensors.begin(), tensors.end(), [](const NamedTensor& t) { return t.group == "ema"; });
  RN_CHECK_CTX(has, path, "--ema: the file has no EMA weights (/ema; its run was without --ema); use it without --ema");
}

void write_weights(const std::string& path, const std::vector<NamedTensor>& tensors, const WeightsMeta& meta) {
  hdf5_init();
  auto lock = hdf5_lock();
  // Built in memory (checksummed HDF5 1.8+ metadata) and written by write_file_atomically: a full disk is a clean
  // error, the previous file stays.
  std::vector<std::uint8_t> bytes;
  {
    MemoryH5File mem(path);
    const hid_t file = mem.file();
    const std::string& tmp = path;
    write_string_attr(file, "format", kWeightsFormat, tmp);
    write_int_attr(file, "version", kWeightsVersion, tmp);
    for (const auto& [k, v] : meta.strings) write_string_attr(file, k, v, tmp);
    for (const auto& [k, v] : meta.ints) write_int_attr(file, k, v, tmp);
    if (!meta.mean.empty()) write_f32_array_attr(file, "mean", meta.mean, tmp);
    if (!meta.std.empty()) write_f32_array_attr(file, "std", meta.std, tmp);
    if (!meta.class_names.empty()) write_string_array_attr(file, "class_names", meta.class_names, tmp);
    std::map<std::string, H5Handle> groups;
    std::vector<std::string> paths;
    for (const NamedTensor& t : tensors) {
      const std::string ctx = fmt::format("{}: /{}/{}", path, t.group, t.name);
      RN_CHECK_CTX(static_cast<std::int64_t>(t.values.size()) == t.shape.elems(), ctx, "{} values for shape {}",
                   t.values.size(), t.shape.str());
      auto g = groups.find(t.group);
      if (g == groups.end())
        g = groups.emplace(t.group, H5Handle(H5_CHECK(H5Gcreate2(file, t.group.c_str(), H5P_DEFAULT,
                                                                  untimed_plist(H5P_GROUP_CREATE, ctx), H5P_DEFAULT),
                                                       ctx, "create group"),
                                             H5Gclose))
                .first;
      write_f32_dataset(g->second, t.name,
                        {static_cast<hsize_t>(t.shape.n), static_cast<hsize_t>(t.shape.h),
                         static_cast<hsize_t>(t.shape.w), static_cast<hsize_t>(t.shape.c)},
                        t.values.data(), ctx, tensor_layout(t.shape.n, t.shape.h, t.shape.w));
      paths.push_back(fmt::format("/{}/{}", t.group, t.name));
    }
    groups.clear();
    bytes = mem.finish(paths);
  }
  write_file_atomically(path, bytes);
}

namespace {
WeightsFile read_weights_from(const std::string& path, const VerifiedFile& verified);
}  // namespace

WeightsFile read_weights(const std::string& path) {
  hdf5_init();
  auto lock = hdf5_lock();
  require_input_file(path, "weights file");
  // Format 2: the whole file and each tensor's bytes verified before HDF5 parses any of it. Format 1 (no header):
  // HDF5 parses unverified metadata, first in a child process, so a corrupt file that crashes HDF5 is an Error.
  const VerifiedFile verified = read_verified_file(path);
  if (!verified.checksummed)
    (void)run_contained(path, [&] {
      (void)read_weights_from(path, verified);
      return std::string("ok");
    });
  return read_weights_from(path, verified);
}

namespace {
WeightsFile read_weights_from(const std::string& path, const VerifiedFile& verified) {
  H5Handle file = open_verified(verified, path);
  WeightsFile out;
  RN_CHECK_CTX(H5Aexists(file, "format") > 0, path, "not a weights file: it has no 'format' attribute");
  const std::string format = read_string_attr(file, "format", path);
  RN_CHECK_CTX(format != "renaissance-checkpoint", path,
               "it is a checkpoint, not a weights file (load it with --checkpoint, or --resume to continue training)");
  RN_CHECK_CTX(format != "renaissance-dataset", path, "it is a Renaissance dataset, not a weights file (it goes to --data)");
  RN_CHECK_CTX(format == kWeightsFormat, path, "not a weights file: format is '{}', not '{}'", format, kWeightsFormat);
  const std::string version = read_string_attr(file, "version", path);
  RN_CHECK_CTX(version == "1" || version == "2" || version == std::to_string(kWeightsVersion), path,
               "unsupported weights version {} (this build reads 1 to {})", version, kWeightsVersion);
  RN_CHECK_CTX(version == "1" || verified.checksummed, path,
               "a version {} weights file without its checksum header (edited or rewritten by another tool?)", version);
  // Attributes: every string attribute of the root.
  H5O_info_t info;
#if H5_VERSION_GE(1, 12, 0)
  H5_CHECK(H5Oget_info3(file, &info, H5O_INFO_NUM_ATTRS), path, "root info");
#else
  H5_CHECK(H5Oget_info2(file, &info, H5O_INFO_NUM_ATTRS), path, "root info");
#endif
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    char name[256];
    H5_CHECK(H5Aget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT), path,
             "attribute name");
    out.attributes[name] = read_string_attr(file, name, path);
  }
  for (const char* group : {"params", "bn", "ema"}) {
    if (H5Lexists(file, group, H5P_DEFAULT) <= 0) continue;
    H5Handle g(H5_CHECK(H5Gopen2(file, group, H5P_DEFAULT), path, "open group /{}", group), H5Gclose);
    H5G_info_t gi;
    H5_CHECK(H5Gget_info(g, &gi), path, "group /{}", group);
    for (hsize_t i = 0; i < gi.nlinks; ++i) {
      char name[512];
      H5_CHECK(H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT), path,
               "name in /{}", group);
      const std::string ctx = fmt::format("{}: /{}/{}", path, group, name);
      require_hard_link(g, name, ctx);
      H5Handle ds(H5_CHECK(H5Dopen2(g, name, H5P_DEFAULT), ctx, "open"), H5Dclose);
      require_plain_stored_tensor(ds, ctx);
      H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "dataspace"), H5Sclose);
      hsize_t dims[4] = {0, 0, 0, 0};
      RN_CHECK_CTX(H5Sget_simple_extent_ndims(space) == 4, ctx, "tensor must have rank 4 (n, h, w, c)");
      H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr), ctx, "dimensions");
      // A corrupt header must not make us allocate what the file cannot hold: no overflow in the element count,
      // and at least one stored byte per element (FP32 takes 4; a compression filter would not beat 4x on weights).
      std::int64_t elems = 1;
      for (hsize_t d : dims) {
        RN_CHECK_CTX(d <= (hsize_t(1) << 40) && (d == 0 || elems <= (std::int64_t(1) << 40) / static_cast<std::int64_t>(d)),
                     ctx, "tensor shape {}x{}x{}x{} is too large (corrupt file?)", dims[0], dims[1], dims[2], dims[3]);
        elems *= static_cast<std::int64_t>(d);
      }
      const hsize_t stored = H5Dget_storage_size(ds);
      RN_CHECK_CTX(static_cast<hsize_t>(elems) <= stored, ctx,
                   "tensor shape {}x{}x{}x{} ({} values) but only {} bytes are stored (truncated or corrupt file?)",
                   dims[0], dims[1], dims[2], dims[3], elems, stored);
      NamedTensor t;
      t.group = group;
      t.name = name;
      t.shape = Shape{static_cast<std::int64_t>(dims[0]), static_cast<std::int64_t>(dims[1]),
                      static_cast<std::int64_t>(dims[2]), static_cast<std::int64_t>(dims[3])};
      t.values.resize(static_cast<std::size_t>(t.shape.elems()));
      H5_CHECK(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.values.data()), ctx,
               "read (checksum mismatch or truncated file?)");
      require_finite(t.values, ctx);
      require_valid_statistics(name, t.values, ctx);
      out.tensors.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace

}  // namespace renaissance::io
