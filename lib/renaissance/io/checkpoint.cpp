#include <renaissance/core/error.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/hdf5_util.h>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <regex>
#include <thread>

namespace renaissance::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTensorGroups[] = {"params", "bn", "optimizer", "ema"};
constexpr std::size_t kStateSlots = 4;  // loss scale slots; metric slots

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// A file-access list that writes checksummed metadata (superblock v2, object header v2: HDF5 1.8 and later), so
/// a flipped byte in an attribute or a group is detected on open, not only in the tensors' data.
hid_t checksummed_fapl() {
  hid_t fapl = make_file_access_plist();
  if (H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0) {
    H5Pclose(fapl);
    detail::throw_h5_error(__FILE__, __LINE__, "HDF5", "setting the file format version bounds");
  }
  return fapl;
}

template <typename T>
void write_number_attr(hid_t obj, const std::string& name, T value, hid_t file_type, hid_t mem_type,
                       const std::string& ctx) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT), ctx,
                         "create attribute '{}'", name),
                H5Aclose);
  H5_CHECK(H5Awrite(attr, mem_type, &value), ctx, "write attribute '{}'", name);
}

/// A negative answer is an error (a corrupted object header fails its metadata checksum here).
bool attr_exists(hid_t obj, const char* name, const std::string& ctx) {
  return H5_CHECK(H5Aexists(obj, name), ctx, "looking up attribute '{}' (corrupted metadata?)", name) > 0;
}

/// Any scalar attribute as text (strings, integers, floats); small arrays as "[a, b]".
std::string attr_text(hid_t obj, const std::string& name, const std::string& ctx) {
  H5Handle attr(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT), ctx, "open attribute '{}'", name), H5Aclose);
  H5Handle type(H5_CHECK(H5Aget_type(attr), ctx, "attribute '{}' type", name), H5Tclose);
  H5Handle space(H5_CHECK(H5Aget_space(attr), ctx, "attribute '{}' space", name), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  RN_CHECK_CTX(n >= 1 && n <= 4096, ctx, "attribute '{}' has {} elements", name, n);
  switch (H5Tget_class(type)) {
    case H5T_STRING: {
      RN_CHECK_CTX(n == 1, ctx, "attribute '{}' is a string array", name);
      if (H5Tis_variable_str(type) > 0) {
        char* s = nullptr;
        H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(mem, H5T_VARIABLE);
        H5_CHECK(H5Aread(attr, mem, &s), ctx, "read attribute '{}'", name);
        std::string out = s ? s : "";
        H5free_memory(s);
        return out;
      }
      const std::size_t size = H5Tget_size(type);
      std::string buf(size, '\0');
      H5_CHECK(H5Aread(attr, type, buf.data()), ctx, "read attribute '{}'", name);
      return buf.substr(0, buf.find('\0'));
    }
    case H5T_INTEGER: {
      std::vector<std::string> parts;
      if (H5Tget_sign(type) == H5T_SGN_NONE) {
        std::vector<unsigned long long> v(static_cast<std::size_t>(n));
        H5_CHECK(H5Aread(attr, H5T_NATIVE_ULLONG, v.data()), ctx, "read attribute '{}'", name);
        for (auto x : v) parts.push_back(std::to_string(x));
      } else {
        std::vector<long long> v(static_cast<std::size_t>(n));
        H5_CHECK(H5Aread(attr, H5T_NATIVE_LLONG, v.data()), ctx, "read attribute '{}'", name);
        for (auto x : v) parts.push_back(std::to_string(x));
      }
      return n == 1 ? parts[0] : fmt::format("[{}]", fmt::join(parts, ", "));
    }
    case H5T_FLOAT: {
      std::vector<double> v(static_cast<std::size_t>(n));
      H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()), ctx, "read attribute '{}'", name);
      std::vector<std::string> parts;
      for (double x : v) parts.push_back(fmt::format("{}", x));
      return n == 1 ? parts[0] : fmt::format("[{}]", fmt::join(parts, ", "));
    }
    default: return "<unsupported type>";
  }
}

std::string require_string(hid_t obj, const char* name, const std::string& ctx) {
  RN_CHECK_CTX(attr_exists(obj, name, ctx), ctx, "attribute '{}' is missing (not a complete checkpoint)", name);
  return attr_text(obj, name, ctx);
}

std::int64_t require_int(hid_t obj, const char* name, const std::string& ctx, std::int64_t min_value) {
  RN_CHECK_CTX(attr_exists(obj, name, ctx), ctx, "attribute '{}' is missing (not a complete checkpoint)", name);
  H5Handle attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT), ctx, "open attribute '{}'", name), H5Aclose);
  H5Handle type(H5_CHECK(H5Aget_type(attr), ctx, "attribute '{}' type", name), H5Tclose);
  RN_CHECK_CTX(H5Tget_class(type) == H5T_INTEGER, ctx, "attribute '{}' is not an integer", name);
  long long v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_LLONG, &v), ctx, "read attribute '{}'", name);
  RN_CHECK_CTX(v >= min_value, ctx, "attribute '{}' = {} is out of range (>= {} expected)", name, v, min_value);
  return v;
}

/// Reads one FP32 dataset (rank 1-4) after checking that it carries the Fletcher32 filter.
std::vector<float> read_dataset(hid_t parent, const std::string& name, const std::string& ctx,
                                std::vector<hsize_t>* dims_out) {
  H5Handle ds(H5_CHECK(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), ctx, "open"), H5Dclose);
  H5Handle dcpl(H5_CHECK(H5Dget_create_plist(ds), ctx, "creation properties"), H5Pclose);
  unsigned flags = 0;
  std::size_t nelmts = 0;
  char fname[64];
  unsigned filter_config = 0;
  const bool has_checksum = H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &nelmts, nullptr, sizeof fname,
                                                 fname, &filter_config) >= 0;
  H5Eclear2(H5E_DEFAULT);
  RN_CHECK_CTX(has_checksum, ctx, "dataset has no Fletcher32 checksum (not written by renaissance?)");
  H5Handle type(H5_CHECK(H5Dget_type(ds), ctx, "type"), H5Tclose);
  RN_CHECK_CTX(H5Tget_class(type) == H5T_FLOAT, ctx, "dataset is not floating point");
  H5Handle space(H5_CHECK(H5Dget_space(ds), ctx, "dataspace"), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  RN_CHECK_CTX(rank >= 1 && rank <= 4, ctx, "dataset has rank {}", rank);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  RN_CHECK_CTX(n <= (hsize_t{1} << 34), ctx, "dataset has an implausible size ({} elements)", n);
  std::vector<float> values(static_cast<std::size_t>(n));
  if (n > 0)
    H5_CHECK(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), ctx,
             "read (checksum mismatch or truncated file?)");
  if (dims_out) *dims_out = dims;
  return values;
}

/// The names in a group, in creation order where the group tracks it (checkpoint groups do: the writer's plan
/// order, which matching by position across AMP's fused layer names relies on), else in name order.
std::vector<std::string> link_names(hid_t g, const std::string& ctx) {
  H5G_info_t gi;
  H5_CHECK(H5Gget_info(g, &gi), ctx, "group info");
  H5_index_t index = H5_INDEX_NAME;
  {
    H5Handle gcpl(H5_CHECK(H5Gget_create_plist(g), ctx, "group properties"), H5Pclose);
    unsigned flags = 0;
    if (H5Pget_link_creation_order(gcpl, &flags) >= 0 && (flags & H5P_CRT_ORDER_INDEXED)) index = H5_INDEX_CRT_ORDER;
    H5Eclear2(H5E_DEFAULT);
  }
  std::vector<std::string> names;
  for (hsize_t i = 0; i < gi.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    H5_CHECK(len, ctx, "link name");
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    H5_CHECK(H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT), ctx,
             "link name");
    name.resize(static_cast<std::size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

void test_delay() {
  if (const char* d = std::getenv("RENAISSANCE_TEST_CHECKPOINT_DELAY_MS")) {
    const long ms = std::atol(d);
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

/// The step of "ckpt-step00001234.h5", or -1.
std::int64_t step_of(const std::string& filename) {
  static const std::regex re(R"(ckpt-step([0-9]+)\.h5)");
  std::smatch m;
  if (!std::regex_match(filename, m, re)) return -1;
  return std::stoll(m[1].str());
}

/// ckpt-*.h5 files in `dir`, newest (highest step) first.
std::vector<std::pair<std::int64_t, fs::path>> checkpoints_in(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && e.is_regular_file(ec)) out.emplace_back(s, e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

const NamedTensor* Checkpoint::find(const std::string& group, const std::string& name) const {
  return find_tensor(tensors, group, name);
}

void write_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  hdf5_init();
  auto lock = hdf5_lock();
  const CheckpointState& s = ckpt.state;
  RN_CHECK_CTX(s.loss_scale.size() == kStateSlots &&
                   s.train_metrics.size() == kStateSlots * static_cast<std::size_t>(s.world_size),
               path, "internal: the loss-scale state must have {} slots, the metric state {} per rank", kStateSlots,
               kStateSlots);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  try {
    H5Handle fapl(checksummed_fapl(), H5Pclose);
    H5Handle file(H5_CHECK(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), tmp, "create"), H5Fclose);
    write_string_attr(file, "format", kCheckpointFormat, tmp);
    write_number_attr<long long>(file, "version", kCheckpointVersion, H5T_STD_I64LE, H5T_NATIVE_LLONG, tmp);
    auto i64 = [&](const char* name, std::int64_t v) {
      write_number_attr<long long>(file, name, v, H5T_STD_I64LE, H5T_NATIVE_LLONG, tmp);
    };
    i64("step", s.step);
    i64("epoch", s.epoch);
    i64("position", s.position);
    i64("samples_done", s.samples_done);
    i64("batch", s.batch);
    i64("world_size", s.world_size);
    i64("amp", s.amp ? 1 : 0);
    i64("tensor_count", static_cast<std::int64_t>(ckpt.tensors.size()));
    write_number_attr<unsigned long long>(file, "seed", s.seed, H5T_STD_U64LE, H5T_NATIVE_ULLONG, tmp);
    write_string_attr(file, "optimizer", s.optimizer, tmp);
    write_string_attr(file, "model", s.model, tmp);
    write_string_attr(file, "model_yaml", s.model_yaml, tmp);
    write_string_attr(file, "arch_plan", s.arch_plan, tmp);
    write_string_attr(file, "run_config", s.run_config, tmp);
    write_string_attr(file, "plan_hash", s.plan_hash, tmp);
    write_string_attr(file, "created", s.created.empty() ? utc_now() : s.created, tmp);
    {
      H5Handle g(H5_CHECK(H5Gcreate2(file, "state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), tmp, "create /state"),
                 H5Gclose);
      write_f32_dataset(g, "loss_scale", {kStateSlots}, s.loss_scale.data(), path + ": /state/loss_scale");
      write_f32_dataset(g, "train_metrics", {static_cast<hsize_t>(s.world_size), kStateSlots}, s.train_metrics.data(),
                    path + ": /state/train_metrics");
    }
    std::map<std::string, H5Handle> groups;
    H5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    H5_CHECK(H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), tmp, "creation order");
    for (const char* gname : kTensorGroups)
      groups.emplace(gname, H5Handle(H5_CHECK(H5Gcreate2(file, gname, H5P_DEFAULT, gcpl, H5P_DEFAULT), tmp,
                                              "create group /{}", gname),
                                     H5Gclose));
    for (std::size_t i = 0; i < ckpt.tensors.size(); ++i) {
      const NamedTensor& t = ckpt.tensors[i];
      const std::string ctx = fmt::format("{}: /{}/{}", path, t.group, t.name);
      auto g = groups.find(t.group);
      RN_CHECK_CTX(g != groups.end(), ctx, "internal: unknown checkpoint group");
      RN_CHECK_CTX(static_cast<std::int64_t>(t.values.size()) == t.shape.elems(), ctx, "{} values for shape {}",
                   t.values.size(), t.shape.str());
      write_f32_dataset(g->second, t.name,
                    {static_cast<hsize_t>(t.shape.n), static_cast<hsize_t>(t.shape.h), static_cast<hsize_t>(t.shape.w),
                     static_cast<hsize_t>(t.shape.c)},
                    t.values.data(), ctx);
      if (i == ckpt.tensors.size() / 2) {
        H5Fflush(file, H5F_SCOPE_GLOBAL);  // a partial file on disk for the crash-safety test
        test_delay();
      }
    }
    groups.clear();
    H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "flush");
    RN_CHECK_CTX(file.reset() >= 0, tmp, "closing the file failed (disk full?)");
    fsync_path(tmp, false);
    fs::rename(tmp, path);
    fsync_path(fs::absolute(path).parent_path().string(), true);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

Checkpoint read_checkpoint(const std::string& path) {
  hdf5_init();
  auto lock = hdf5_lock();
  std::error_code ec;
  RN_CHECK_CTX(fs::exists(path, ec), path, "no such checkpoint file");
  RN_CHECK_CTX(fs::is_regular_file(path, ec), path, "not a regular file");
  H5Handle fapl(make_file_access_plist(), H5Pclose);
  H5Handle file(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), path, "open (not an HDF5 file, or truncated?)"),
                H5Fclose);
  Checkpoint out;
  CheckpointState& s = out.state;
  const std::string format = require_string(file, "format", path);
  RN_CHECK_CTX(format == kCheckpointFormat, path, "format is '{}', not '{}'", format, kCheckpointFormat);
  const std::int64_t version = require_int(file, "version", path, 1);
  RN_CHECK_CTX(version == kCheckpointVersion, path, "checkpoint version {} is not supported (this build reads {})",
               version, kCheckpointVersion);
  s.step = require_int(file, "step", path, 0);
  s.epoch = require_int(file, "epoch", path, 0);
  s.position = require_int(file, "position", path, 0);
  s.samples_done = require_int(file, "samples_done", path, 0);
  s.batch = require_int(file, "batch", path, 1);
  s.world_size = require_int(file, "world_size", path, 1);
  s.amp = require_int(file, "amp", path, 0) != 0;
  const std::int64_t tensor_count = require_int(file, "tensor_count", path, 1);
  RN_CHECK_CTX(attr_exists(file, "seed", path), path, "attribute 'seed' is missing (not a complete checkpoint)");
  s.seed = std::stoull(attr_text(file, "seed", path));
  s.optimizer = require_string(file, "optimizer", path);
  s.model = require_string(file, "model", path);
  s.model_yaml = require_string(file, "model_yaml", path);
  s.arch_plan = require_string(file, "arch_plan", path);
  s.run_config = require_string(file, "run_config", path);
  s.plan_hash = require_string(file, "plan_hash", path);
  s.created = require_string(file, "created", path);
  RN_CHECK_CTX(s.samples_done >= s.position, path, "samples_done {} < position {}", s.samples_done, s.position);
  {
    RN_CHECK_CTX(H5Lexists(file, "state", H5P_DEFAULT) > 0, path, "group /state is missing");
    H5Handle g(H5_CHECK(H5Gopen2(file, "state", H5P_DEFAULT), path, "open /state"), H5Gclose);
    for (auto [name, dst] : {std::pair{"loss_scale", &s.loss_scale}, std::pair{"train_metrics", &s.train_metrics}}) {
      const std::string ctx = fmt::format("{}: /state/{}", path, name);
      RN_CHECK_CTX(H5Lexists(g, name, H5P_DEFAULT) > 0, ctx, "missing");
      *dst = read_dataset(g, name, ctx, nullptr);
      const std::size_t want = kStateSlots * (dst == &s.train_metrics ? static_cast<std::size_t>(s.world_size) : 1);
      RN_CHECK_CTX(dst->size() == want, ctx, "{} values, {} expected", dst->size(), want);
    }
  }
  for (const char* group : kTensorGroups) {
    RN_CHECK_CTX(H5Lexists(file, group, H5P_DEFAULT) > 0, path, "group /{} is missing", group);
    H5Handle g(H5_CHECK(H5Gopen2(file, group, H5P_DEFAULT), path, "open group /{}", group), H5Gclose);
    for (const std::string& name : link_names(g, fmt::format("{}: /{}", path, group))) {
      const std::string ctx = fmt::format("{}: /{}/{}", path, group, name);
      std::vector<hsize_t> dims;
      NamedTensor t;
      t.group = group;
      t.name = name;
      t.values = read_dataset(g, name, ctx, &dims);
      RN_CHECK_CTX(dims.size() == 4, ctx, "tensor must have rank 4 (n, h, w, c), has {}", dims.size());
      t.shape = Shape{static_cast<std::int64_t>(dims[0]), static_cast<std::int64_t>(dims[1]),
                      static_cast<std::int64_t>(dims[2]), static_cast<std::int64_t>(dims[3])};
      out.tensors.push_back(std::move(t));
    }
  }
  RN_CHECK_CTX(static_cast<std::int64_t>(out.tensors.size()) == tensor_count, path,
               "holds {} tensors but was written with {} (an incomplete or edited file)", out.tensors.size(),
               tensor_count);
  RN_CHECK_CTX(
      std::any_of(out.tensors.begin(), out.tensors.end(), [](const NamedTensor& t) { return t.group == "params"; }),
      path, "group /params is empty");
  return out;
}

CheckpointReport inspect_checkpoint(const std::string& path) {
  CheckpointReport r;
  try {
    (void)read_checkpoint(path);
    r.valid = true;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  // The listing is best effort: whatever of the file can be opened.
  try {
    hdf5_init();
    auto lock = hdf5_lock();
    H5Handle fapl(make_file_access_plist(), H5Pclose);
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    if (f < 0) {
      H5Eclear2(H5E_DEFAULT);
      return r;
    }
    H5Handle file(f, H5Fclose);
    H5O_info_t info;
#if H5_VERSION_GE(1, 12, 0)
    const herr_t st = H5Oget_info3(file, &info, H5O_INFO_NUM_ATTRS);
#else
    const herr_t st = H5Oget_info2(file, &info, H5O_INFO_NUM_ATTRS);
#endif
    if (st >= 0) {
      for (hsize_t i = 0; i < info.num_attrs; ++i) {
        char name[256];
        if (H5Aget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
        try {
          r.attributes[name] = attr_text(file, name, path);
        } catch (const std::exception&) {
          r.attributes[name] = "<unreadable>";
        }
      }
    }
    for (const char* group : {"state", "params", "bn", "optimizer", "ema"}) {
      if (H5Lexists(file, group, H5P_DEFAULT) <= 0) continue;
      const hid_t gid = H5Gopen2(file, group, H5P_DEFAULT);
      if (gid < 0) continue;
      H5Handle g(gid, H5Gclose);
      std::vector<std::string> names;
      try {
        names = link_names(g, path);
      } catch (const std::exception&) {
        continue;
      }
      for (const std::string& name : names) {
        CheckpointReport::Entry e;
        e.group = group;
        e.name = name;
        try {
          std::vector<hsize_t> dims;
          (void)read_dataset(g, name, path, &dims);
          for (hsize_t d : dims) e.dims.push_back(static_cast<std::int64_t>(d));
          e.ok = true;
        } catch (const std::exception&) {
          e.ok = false;
          const hid_t ds = H5Dopen2(g, name.c_str(), H5P_DEFAULT);
          if (ds >= 0) {
            H5Handle d(ds, H5Dclose);
            H5Handle sp(H5Dget_space(d), H5Sclose);
            hsize_t dims[8];
            const int rank = sp.valid() ? H5Sget_simple_extent_ndims(sp) : -1;
            if (rank > 0 && rank <= 8) {
              H5Sget_simple_extent_dims(sp, dims, nullptr);
              for (int k = 0; k < rank; ++k) e.dims.push_back(static_cast<std::int64_t>(dims[k]));
            }
          }
        }
        r.tensors.push_back(std::move(e));
      }
    }
    H5Eclear2(H5E_DEFAULT);
  } catch (const std::exception&) {
    H5Eclear2(H5E_DEFAULT);
  }
  return r;
}

std::string checkpoint_file_name(std::int64_t step) { return fmt::format("ckpt-step{:08d}.h5", step); }

std::string save_checkpoint_in_dir(const std::string& dir, const Checkpoint& ckpt, int keep) {
  RN_CHECK_CTX(keep >= 1, dir, "--keep must be >= 1, got {}", keep);
  std::error_code ec;
  fs::create_directories(dir, ec);
  RN_CHECK_CTX(fs::is_directory(dir), dir, "cannot create the checkpoint directory{}",
               ec ? ": " + ec.message() : std::string());
  const std::string name = checkpoint_file_name(ckpt.state.step);
  const fs::path file = fs::path(dir) / name;
  write_checkpoint(file.string(), ckpt);
  // latest.h5 → the new file: a fresh symlink renamed over the old one (rename is atomic), updated last.
  const fs::path latest = fs::path(dir) / kLatestCheckpoint;
  const fs::path tmp_link = fs::path(dir) / fmt::format("{}.tmp-{}", kLatestCheckpoint, ::getpid());
  fs::remove(tmp_link, ec);
  fs::create_symlink(name, tmp_link, ec);
  RN_CHECK_CTX(!ec, tmp_link.string(), "cannot create the latest.h5 symlink: {}", ec.message());
  fs::rename(tmp_link, latest, ec);
  RN_CHECK_CTX(!ec, latest.string(), "cannot replace the latest.h5 symlink: {}", ec.message());
  fsync_path(dir, true);
  // Keep the newest `keep`; stale temporaries of crashed writers go too.
  const auto all = checkpoints_in(dir);
  for (std::size_t i = static_cast<std::size_t>(keep); i < all.size(); ++i)
    if (all[i].second.filename() != name) fs::remove(all[i].second, ec);
  const std::string own = fmt::format(".tmp-{}", ::getpid());
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const bool temporary = (f.rfind("ckpt-step", 0) == 0 && f.find(".h5.tmp-") != std::string::npos) ||
                           f.rfind(std::string(kLatestCheckpoint) + ".tmp-", 0) == 0;
    if (temporary && (f.size() < own.size() || f.compare(f.size() - own.size(), own.size(), own) != 0))
      fs::remove(e.path(), ec);
  }
  return file.string();
}

std::string find_latest_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& warn) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  auto skip = [&](const std::string& why) {
    if (warn) warn(why);
  };
  const fs::path latest = fs::path(dir) / kLatestCheckpoint;
  std::string tried;
  if (fs::is_symlink(latest, ec) || fs::exists(latest, ec)) {
    const fs::path target = fs::weakly_canonical(latest, ec);
    try {
      (void)read_checkpoint(target.string());
      return target.string();
    } catch (const std::exception& e) {
      skip(fmt::format("skipping {} ({}): {}", latest.string(), target.string(), e.what()));
      tried = target.string();
    }
  }
  for (const auto& [step, path] : checkpoints_in(dir)) {
    (void)step;
    if (path.string() == tried) continue;
    try {
      (void)read_checkpoint(path.string());
      return path.string();
    } catch (const std::exception& e) {
      skip(fmt::format("skipping {}: {}", path.string(), e.what()));
    }
  }
  return {};
}

}  // namespace renaissance::io
