#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/hdf5_util.h>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <regex>
#include <set>
#include <sstream>
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

/// Any scalar attribute as text (strings, integers, floats); small arrays as "[a, b]". `numeric` (optional): whether
/// the file stores it as integers or floats.
std::string attr_text(hid_t obj, const std::string& name, const std::string& ctx, bool* numeric = nullptr) {
  H5Handle attr(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT), ctx, "open attribute '{}'", name), H5Aclose);
  H5Handle type(H5_CHECK(H5Aget_type(attr), ctx, "attribute '{}' type", name), H5Tclose);
  H5Handle space(H5_CHECK(H5Aget_space(attr), ctx, "attribute '{}' space", name), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  RN_CHECK_CTX(n >= 1 && n <= 4096, ctx, "attribute '{}' has {} elements", name, n);
  const H5T_class_t cls = H5Tget_class(type);
  if (numeric) *numeric = cls == H5T_INTEGER || cls == H5T_FLOAT;
  switch (cls) {
    case H5T_STRING: {
      RN_CHECK_CTX(n == 1, ctx, "attribute '{}' is a string array", name);
      if (H5Tis_variable_str(type) > 0) {
        char* s = nullptr;
        H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(mem, H5T_VARIABLE);
        H5Tset_cset(mem, H5Tget_cset(type));  // a dataset's attributes are UTF-8
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

/// The largest step, epoch or sample count a checkpoint may record (2^50): far past any run, and far enough below
/// 2^63 that the counts a resumed run adds to it cannot overflow (a step of 2^63 - 2 wrapped to negative steps,
/// negative checkpoint names and a rotation that kept every file).
constexpr std::int64_t kMaxCount = std::int64_t{1} << 50;

std::int64_t require_int(hid_t obj, const char* name, const std::string& ctx, std::int64_t min_value,
                         std::int64_t max_value = kMaxCount) {
  RN_CHECK_CTX(attr_exists(obj, name, ctx), ctx, "attribute '{}' is missing (not a complete checkpoint)", name);
  H5Handle attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT), ctx, "open attribute '{}'", name), H5Aclose);
  H5Handle type(H5_CHECK(H5Aget_type(attr), ctx, "attribute '{}' type", name), H5Tclose);
  RN_CHECK_CTX(H5Tget_class(type) == H5T_INTEGER, ctx, "attribute '{}' is not an integer", name);
  // One element: an array of them was read into this one integer (a stack overwrite, or an array taken as its first).
  H5Handle space(H5_CHECK(H5Aget_space(attr), ctx, "attribute '{}' space", name), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  RN_CHECK_CTX(n == 1, ctx, "attribute '{}' is not one integer ({} elements)", name, n);
  long long v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_LLONG, &v), ctx, "read attribute '{}'", name);
  RN_CHECK_CTX(v >= min_value && v <= max_value, ctx, "attribute '{}' = {} is out of range ({} to {} expected)", name,
               v, min_value, max_value);
  return v;
}

/// Reads one FP32 dataset (rank 1-4) after checking that it carries the Fletcher32 filter.
std::vector<float> read_dataset(hid_t parent, const std::string& name, const std::string& ctx,
                                std::vector<hsize_t>* dims_out, bool finite = true) {
  require_hard_link(parent, name, ctx);
  H5Handle ds(H5_CHECK(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), ctx, "open"), H5Dclose);
  require_plain_stored_tensor(ds, ctx);
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
  // A chunk never written reads as the fill value (zeros) without any checksum failing: every value must be stored.
  const hsize_t stored = H5Dget_storage_size(ds);
  RN_CHECK_CTX(n == 0 || stored >= n * sizeof(float), ctx,
               "only {} bytes of its {} values are stored (a chunk that was never written, or a truncated file)", stored,
               n);
  std::vector<float> values(static_cast<std::size_t>(n));
  if (n > 0)
    H5_CHECK(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), ctx,
             "read (checksum mismatch or truncated file?)");
  if (finite) require_finite(values, ctx);
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
  // A step past int64 (a stray ckpt-step99999999999999999999999.h5) is not a file of ours: ignored, not std::stoll's
  // out_of_range, which ended resume and rotation with "error: stoll".
  std::int64_t step = -1;
  const std::string digits = m[1].str();
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  return ec == std::errc() && end == digits.data() + digits.size() ? step : -1;
}

/// ckpt-*.h5 files in `dir`, newest (highest step) first. `error` (optional) receives a failure to list `dir`.
std::vector<std::pair<std::int64_t, fs::path>> checkpoints_in(const fs::path& dir, std::error_code* error = nullptr) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec, entry_ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::int64_t s = step_of(it->path().filename().string());
    if (s >= 0 && it->is_regular_file(entry_ec)) out.emplace_back(s, it->path());
  }
  if (error) *error = ec;
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

bool is_checkpoint_file_name(const std::string& filename) {
  return step_of(filename) >= 0 || filename == kLatestCheckpoint || filename == kBestCheckpoint;
}

std::string checkpoint_file_in(const std::string& dir) {
  std::error_code ec;
  const auto steps = checkpoints_in(dir, &ec);
  if (ec == std::errc::no_such_file_or_directory) return {};
  RN_CHECK_CTX(!ec, dir, "cannot list the checkpoint directory: {}", ec.message());
  if (!steps.empty()) return steps.front().second.filename().string();
  for (const char* name : {kLatestCheckpoint, kBestCheckpoint})
    if (fs::symlink_status(fs::path(dir) / name, ec).type() != fs::file_type::not_found) return name;
  return {};
}

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
  // Built in memory, written by write_file_atomically (a full disk is our error, never HDF5's).
  const std::string& tmp = path;
  std::vector<std::uint8_t> bytes;
  {
    MemoryH5File mem(path);
    const hid_t file = mem.file();
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
    for (auto [name, v] : {std::pair{"val_loss", s.val_loss}, std::pair{"val_top1", s.val_top1},
                           std::pair{"val_top5", s.val_top5}, std::pair{"ema_val_top1", s.ema_val_top1}})
      if (v >= 0) write_number_attr<double>(file, name, v, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, tmp);
    {
      const H5Handle state_gcpl = untimed_plist(H5P_GROUP_CREATE, tmp);
      H5Handle g(H5_CHECK(H5Gcreate2(file, "state", H5P_DEFAULT, state_gcpl, H5P_DEFAULT), tmp, "create /state"),
                 H5Gclose);
      write_f32_dataset(g, "loss_scale", {kStateSlots}, s.loss_scale.data(), path + ": /state/loss_scale");
      write_f32_dataset(g, "train_metrics", {static_cast<hsize_t>(s.world_size), kStateSlots}, s.train_metrics.data(),
                    path + ": /state/train_metrics");
    }
    std::map<std::string, H5Handle> groups;
    H5Handle gcpl = untimed_plist(H5P_GROUP_CREATE, tmp);
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
                        {static_cast<hsize_t>(t.shape.n), static_cast<hsize_t>(t.shape.h),
                         static_cast<hsize_t>(t.shape.w), static_cast<hsize_t>(t.shape.c)},
                        t.values.data(), ctx, tensor_layout(t.shape.n, t.shape.h, t.shape.w));
    }
    groups.clear();
    std::vector<std::string> tensors = {"/state/loss_scale", "/state/train_metrics"};
    for (const NamedTensor& t : ckpt.tensors) tensors.push_back(fmt::format("/{}/{}", t.group, t.name));
    bytes = mem.finish(tensors);
  }
  write_file_atomically(path, bytes, test_delay);  // the hook: half the file on disk, for the crash-safety test
}

/// What a file that is not a checkpoint is, from its format attribute, for the error ("a Renaissance dataset").
std::string not_a_checkpoint(const std::string& format) {
  if (format == "renaissance-dataset") return "it is a Renaissance dataset, not a checkpoint (it goes to --data)";
  if (format == "renaissance-weights") return "it is a weights file (--save), not a checkpoint (load it with --weights)";
  return fmt::format("not a checkpoint: its format is '{}', not '{}'", format, kCheckpointFormat);
}

namespace {
Checkpoint read_checkpoint_from(const std::string& path, const VerifiedFile& verified);
}  // namespace

Checkpoint read_checkpoint(const std::string& path) {
  hdf5_init();
  auto lock = hdf5_lock();
  require_input_file(path, "checkpoint");
  // Format 2: the whole file and each tensor's bytes verified before HDF5 parses any of it. Format 1 (no header):
  // HDF5 parses unverified metadata, first in a child process, so a corrupt file that crashes HDF5 is an Error.
  const VerifiedFile verified = read_verified_file(path);
  if (!verified.checksummed)
    (void)run_contained(path, [&] {
      (void)read_checkpoint_from(path, verified);
      return std::string("ok");
    });
  return read_checkpoint_from(path, verified);
}

namespace {
Checkpoint read_checkpoint_from(const std::string& path, const VerifiedFile& verified) {
  H5Handle file = open_verified(verified, path);
  Checkpoint out;
  CheckpointState& s = out.state;
  RN_CHECK_CTX(attr_exists(file, "format", path), path,
               "not a checkpoint: it has no 'format' attribute (not written by renaissance train --checkpoint-dir)");
  const std::string format = attr_text(file, "format", path);
  RN_CHECK_CTX(format == kCheckpointFormat, path, "{}", not_a_checkpoint(format));
  const std::int64_t version = require_int(file, "version", path, 1);
  RN_CHECK_CTX(version >= 1 && version <= kCheckpointVersion, path,
               "checkpoint version {} is not supported (this build reads 1 to {})", version, kCheckpointVersion);
  RN_CHECK_CTX(version < 2 || verified.checksummed, path,
               "a version {} checkpoint without its checksum header (edited or rewritten by another tool?)", version);
  s.step = require_int(file, "step", path, 0);
  s.epoch = require_int(file, "epoch", path, 0);
  s.position = require_int(file, "position", path, 0);
  s.samples_done = require_int(file, "samples_done", path, 0);
  s.batch = require_int(file, "batch", path, 1, std::int64_t{1} << 31);
  s.world_size = require_int(file, "world_size", path, 1, std::int64_t{1} << 24);
  s.amp = require_int(file, "amp", path, 0, 1) != 0;
  const std::int64_t tensor_count = require_int(file, "tensor_count", path, 1, std::int64_t{1} << 24);
  RN_CHECK_CTX(attr_exists(file, "seed", path), path, "attribute 'seed' is missing (not a complete checkpoint)");
  {
    // Decimal digits, as write_checkpoint writes it ("error: stoull" for text; "-1" wrapped to 2^64 - 1).
    const std::string text = attr_text(file, "seed", path);
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s.seed);
    RN_CHECK_CTX(!text.empty() && ec == std::errc() && end == text.data() + text.size(), path,
                 "attribute 'seed' = '{}' is not a seed (an integer from 0 to 2^64 - 1)", text);
  }
  s.optimizer = require_string(file, "optimizer", path);
  s.model = require_string(file, "model", path);
  s.model_yaml = require_string(file, "model_yaml", path);
  s.arch_plan = require_string(file, "arch_plan", path);
  s.run_config = require_string(file, "run_config", path);
  s.plan_hash = require_string(file, "plan_hash", path);
  s.created = require_string(file, "created", path);
  for (auto [name, dst] : {std::pair{"val_loss", &s.val_loss}, std::pair{"val_top1", &s.val_top1},
                           std::pair{"val_top5", &s.val_top5}, std::pair{"ema_val_top1", &s.ema_val_top1}})
    if (attr_exists(file, name, path)) {
      const std::string text = attr_text(file, name, path);
      char* end = nullptr;
      *dst = std::strtod(text.c_str(), &end);
      RN_CHECK_CTX(end && *end == '\0' && *dst >= 0 && std::isfinite(*dst), path,
                   "attribute '{}' = '{}' is not a metric", name, text);
      // Accuracies are fractions (an inf val_top1 in best.h5 kept every later epoch from replacing it).
      RN_CHECK_CTX(std::string(name) == "val_loss" || *dst <= 1.0, path,
                   "attribute '{}' = '{}': an accuracy is a fraction from 0 to 1", name, text);
    }
  RN_CHECK_CTX(s.samples_done >= s.position, path, "samples_done {} < position {}", s.samples_done, s.position);
  {
    RN_CHECK_CTX(H5Lexists(file, "state", H5P_DEFAULT) > 0, path, "group /state is missing");
    H5Handle g(H5_CHECK(H5Gopen2(file, "state", H5P_DEFAULT), path, "open /state"), H5Gclose);
    for (auto [name, dst] : {std::pair{"loss_scale", &s.loss_scale}, std::pair{"train_metrics", &s.train_metrics}}) {
      const std::string ctx = fmt::format("{}: /state/{}", path, name);
      RN_CHECK_CTX(H5Lexists(g, name, H5P_DEFAULT) > 0, ctx, "missing");
      // The partial epoch's loss sums may be inf or NaN: an AMP step whose logits overflowed FP16 adds an infinite
      // loss (the step itself is skipped, the weights stay finite), and the resumed run must report the epoch as the
      // uninterrupted one does. Everything else is finite.
      *dst = read_dataset(g, name, ctx, nullptr, /*finite=*/dst != &s.train_metrics);
      for (std::size_t i = 0; i < dst->size(); ++i)
        RN_CHECK_CTX(std::isfinite((*dst)[i]) || (dst == &s.train_metrics && i % kStateSlots == 0), ctx,
                     "holds a non-finite value ({} at element {}): written by a diverged run, or damaged", (*dst)[i],
                     i);
      const std::size_t want = kStateSlots * (dst == &s.train_metrics ? static_cast<std::size_t>(s.world_size) : 1);
      RN_CHECK_CTX(dst->size() == want, ctx, "{} values, {} expected", dst->size(), want);
    }
    // What they mean, not only finite: a scale of 0 made every AMP step NaN; metric sums beyond their sample count were
    // reported as the resumed epoch's accuracy (5.3e36).
    RN_CHECK_CTX(s.loss_scale[0] > 0 && s.loss_scale[1] >= 0, path + ": /state/loss_scale",
                 "loss scale {} with {} clean steps: a scale is > 0", s.loss_scale[0], s.loss_scale[1]);
    for (std::size_t r = 0; r + kStateSlots <= s.train_metrics.size(); r += kStateSlots) {
      const float loss = s.train_metrics[r], top1 = s.train_metrics[r + 1], top5 = s.train_metrics[r + 2],
                  n = s.train_metrics[r + 3];
      RN_CHECK_CTX(n >= 0 && !(loss < 0) && top1 >= 0 && top5 >= top1 && top5 <= n, path + ": /state/train_metrics",
                   "rank {}: loss sum {}, top-1 {}, top-5 {} over {} samples are not sums of a partial epoch",
                   r / kStateSlots, loss, top1, top5, n);
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
      require_valid_statistics(name, t.values, ctx);
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

}  // namespace

namespace {

/// The HDF5 part of inspect_checkpoint: every root attribute and every tensor (its shape, whether it reads back).
void list_with_hdf5(const VerifiedFile& verified, const std::string& path, CheckpointReport& r) {
  H5Handle file;
  try {
    file = open_verified(verified, path);
  } catch (const std::bad_alloc&) {
    throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
  } catch (const std::exception&) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
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
        bool numeric = false;
        r.attributes[name] = attr_text(file, name, path, &numeric);
        if (numeric) r.numeric.insert(name);
      } catch (const std::bad_alloc&) {
        throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
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
    } catch (const std::bad_alloc&) {
      throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
    } catch (const std::exception&) {
      continue;
    }
    for (const std::string& name : names) {
      CheckpointReport::Entry e;
      e.group = group;
      e.name = name;
      try {
        std::vector<hsize_t> dims;
        require_valid_statistics(name, read_dataset(g, name, path, &dims), path);  // as read_checkpoint checks it
        for (hsize_t d : dims) e.dims.push_back(static_cast<std::int64_t>(d));
        e.ok = true;
      } catch (const std::bad_alloc&) {
        throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
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
}

void put_text(std::string& out, const std::string& s) {
  const std::uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += s;
}
std::string get_text(const std::string& in, std::size_t& at) {
  std::uint64_t n = 0;
  if (at + sizeof n > in.size()) return {};
  std::memcpy(&n, in.data() + at, sizeof n);
  at += sizeof n;
  n = std::min<std::uint64_t>(n, in.size() - at);
  std::string s = in.substr(at, static_cast<std::size_t>(n));
  at += static_cast<std::size_t>(n);
  return s;
}

/// The listing as bytes and back (it crosses the pipe of run_contained).
std::string encode(const CheckpointReport& r) {
  std::string out;
  for (const auto& [k, v] : r.attributes) {
    out += r.numeric.count(k) ? 'N' : 'A';
    put_text(out, k);
    put_text(out, v);
  }
  for (const auto& e : r.tensors) {
    out += e.ok ? 'T' : 't';
    put_text(out, e.group);
    put_text(out, e.name);
    std::string dims;
    for (std::int64_t d : e.dims) dims += std::to_string(d) + ",";
    put_text(out, dims);
  }
  return out;
}
void decode(const std::string& in, CheckpointReport& r) {
  std::size_t at = 0;
  while (at < in.size()) {
    const char kind = in[at++];
    if (kind == 'A' || kind == 'N') {
      std::string k = get_text(in, at);
      r.attributes[k] = get_text(in, at);
      if (kind == 'N') r.numeric.insert(k);
    } else {
      CheckpointReport::Entry e;
      e.ok = kind == 'T';
      e.group = get_text(in, at);
      e.name = get_text(in, at);
      std::stringstream dims(get_text(in, at));
      for (std::string d; std::getline(dims, d, ',');)
        if (!d.empty()) e.dims.push_back(std::stoll(d));
      r.tensors.push_back(std::move(e));
    }
  }
}

}  // namespace

CheckpointReport inspect_checkpoint(const std::string& path) {
  CheckpointReport r;
  try {
    (void)read_checkpoint(path);
    r.valid = true;
  } catch (const std::bad_alloc&) {
    throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  // The listing is best effort: whatever of the file can be opened. A format 2 file that fails its checksums is
  // listed from its header's table (which tensors still match), never parsed by HDF5.
  try {
    hdf5_init();
    auto lock = hdf5_lock();
    std::vector<ChecksumEntry> entries;
    VerifiedFile verified;
    try {
      verified = read_verified_file(path, &entries);
    } catch (const std::bad_alloc&) {
      throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
    } catch (const std::exception&) {
      for (const ChecksumEntry& c : entries) {
        CheckpointReport::Entry e;
        const auto slash = c.name.find('/', 1);
        e.group = slash == std::string::npos ? std::string() : c.name.substr(1, slash - 1);
        e.name = slash == std::string::npos ? c.name : c.name.substr(slash + 1);
        e.ok = c.ok;
        r.tensors.push_back(std::move(e));
      }
      return r;
    }
    if (verified.checksummed) {
      list_with_hdf5(verified, path, r);
    } else {  // format 1: HDF5 walks unverified metadata, in a child process (a crash there is only a short listing)
      try {
        decode(run_contained(path, [&] {
                 CheckpointReport mine;
                 list_with_hdf5(verified, path, mine);
                 return encode(mine);
               }),
               r);
      } catch (const std::bad_alloc&) {
        throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
      } catch (const std::exception&) {
      }
    }
    H5Eclear2(H5E_DEFAULT);
  } catch (const std::bad_alloc&) {
    throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
  } catch (const std::exception&) {
    H5Eclear2(H5E_DEFAULT);
  }
  return r;
}

std::string checkpoint_file_name(std::int64_t step) { return fmt::format("ckpt-step{:08d}.h5", step); }

namespace {
std::mutex g_locks_mutex;
std::set<std::string> g_locked_dirs;  // canonical paths of the directories this process holds locked
/// What this process knows of checkpoint files (weakly canonical paths): valid (it wrote the file, or read it whole)
/// or not, as of the file's identity then (device, inode, size, modification time). The rotation counts only valid
/// files toward --keep: it kept the newest files by step alone, so a resume past a truncated step 10 deleted the
/// valid step 9 at its next checkpoint and kept the bad file (a second damaged file then left nothing to resume
/// from). A file the process knows nothing of is read whole before it is counted, so a requeued process, which
/// never read the damaged newer file, judges it too.
struct Verdict {
  bool valid = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
};
std::map<std::string, Verdict> g_checkpoint_verdicts;

std::string checkpoint_key(const fs::path& p) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p.string() : c.string();
}

bool identity_of(const fs::path& p, Verdict* v) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  v->dev = st.st_dev;
  v->ino = st.st_ino;
  v->size = st.st_size;
  v->mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return true;
}

void remember_checkpoint(const fs::path& p, bool valid) {
  Verdict v;
  v.valid = valid;
  if (!identity_of(p, &v)) return;
  std::lock_guard<std::mutex> g(g_locks_mutex);
  g_checkpoint_verdicts[checkpoint_key(p)] = v;
}

/// Whether `p` is a valid checkpoint: what this process knows of the file as it is now, else read whole (and
/// remembered).
bool checkpoint_is_valid(const fs::path& p) {
  Verdict now;
  if (!identity_of(p, &now)) return false;
  {
    std::lock_guard<std::mutex> g(g_locks_mutex);
    const auto it = g_checkpoint_verdicts.find(checkpoint_key(p));
    if (it != g_checkpoint_verdicts.end() && it->second.dev == now.dev && it->second.ino == now.ino &&
        it->second.size == now.size && it->second.mtime_ns == now.mtime_ns)
      return it->second.valid;
  }
  bool valid = true;
  try {
    (void)read_checkpoint(p.string());
  } catch (const std::bad_alloc&) {
    throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
  } catch (const std::exception&) {
    valid = false;
  }
  remember_checkpoint(p, valid);
  return valid;
}

std::string lock_key(const std::string& dir) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(dir, ec);
  return ec ? dir : c.string();
}
}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir) : m_dir(dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  RN_CHECK_CTX(fs::is_directory(dir), dir, "--checkpoint-dir: cannot create the checkpoint directory{}",
               ec ? ": " + ec.message() : std::string());
  const std::string lock_path = (fs::path(dir) / kCheckpointLock).string();
  // Not through a symbolic link, and the holder's PID written only into a regular file of this directory alone: it
  // truncates the file, and a link to the run's dataset cut that file to 16 bytes.
  m_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  RN_CHECK_CTX(m_fd >= 0 || errno != ELOOP, lock_path,
               "--checkpoint-dir: the lock file is a symbolic link; the run writes into its lock file, so it will "
               "not follow one: remove the link");
  RN_CHECK_CTX(m_fd >= 0, lock_path, "--checkpoint-dir: cannot open the lock file: {}", std::strerror(errno));
  struct stat st {};
  if (::fstat(m_fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(m_fd);
    m_fd = -1;
    RN_FAIL_CTX(lock_path, "--checkpoint-dir: the lock file is not a regular file (no run makes one): remove it");
  }
  // A file with other names too (a snapshot by `cp -al`, or a link to a dataset) is locked but not written into.
  const bool only_ours = st.st_nlink == 1;
  if (::flock(m_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char owner[256] = {0};
      const ssize_t n = ::pread(m_fd, owner, sizeof owner - 1, 0);
      std::string who = n > 0 ? std::string(owner, static_cast<std::size_t>(n)) : std::string("another process");
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      ::close(m_fd);
      m_fd = -1;
      if (!only_ours)  // one lock file under two names: a `cp -al` copy of a directory shares it with the original
        throw Error(fmt::format("the lock file is held by another process, and it has {} names: a hard link shares "
                                "it with another directory (a `cp -al` copy?), whose run may be the holder",
                                st.st_nlink),
                    dir, "if no run uses this directory, remove its .renaissance-lock (a new one is made)");
      throw Error(fmt::format("another run is using this checkpoint directory ({} holds its lock)", who), dir,
                  "give each run its own --checkpoint-dir; two runs in one would overwrite and prune each other's "
                  "checkpoints");
    }
    // A file system without flock (ENOLCK on some NFS mounts): no lock, but live temporaries are still safe.
    ::close(m_fd);
    m_fd = -1;
    return;
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string me = fmt::format("PID {} on {}\n", static_cast<long>(::getpid()), host);
  if (only_ours && ::ftruncate(m_fd, 0) == 0 && ::pwrite(m_fd, me.data(), me.size(), 0) < 0) {
  }  // who holds it is only a courtesy for the message above
  std::lock_guard<std::mutex> g(g_locks_mutex);
  g_locked_dirs.insert(lock_key(dir));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (m_fd < 0) return;
  {
    std::lock_guard<std::mutex> g(g_locks_mutex);
    g_locked_dirs.erase(lock_key(m_dir));
  }
  ::close(m_fd);  // releases the flock
}

namespace {

/// A file of the directory is replaced as a directory entry: a symbolic link there (a user's, or one left by hand) is
/// removed first, so the write never goes through it to a file elsewhere (best.h5 -> ../data.h5 overwrote the run's
/// own dataset with a checkpoint).
void replace_entry(const fs::path& file, const Checkpoint& ckpt) {
  std::error_code ec;
  if (fs::is_symlink(file, ec)) {
    fs::remove(file, ec);
    RN_CHECK_CTX(!ec, file.string(), "cannot remove the symbolic link to write the checkpoint in its place: {}",
                 ec.message());
  }
  write_checkpoint(file.string(), ckpt);
}

}  // namespace

void require_usable_checkpoint_entries(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_checkpoint_file_name(name)) continue;
    std::error_code sec;
    const fs::file_status st = fs::symlink_status(e.path(), sec);
    RN_CHECK_CTX(!sec && (fs::is_regular_file(st) || fs::is_symlink(st)), e.path().string(),
                 "--checkpoint-dir: a checkpoint name that is not a file but {} (a run would fail at its first "
                 "checkpoint): remove or rename it",
                 fs::is_directory(st) ? "a directory" : "a special file");
  }
}

std::string save_checkpoint_in_dir(const std::string& dir, const Checkpoint& ckpt, int keep) {
  RN_CHECK_CTX(keep >= 1, dir, "--keep must be >= 1, got {}", keep);
  std::error_code ec;
  fs::create_directories(dir, ec);
  RN_CHECK_CTX(fs::is_directory(dir), dir, "cannot create the checkpoint directory{}",
               ec ? ": " + ec.message() : std::string());
  std::unique_ptr<CheckpointDirLock> own_lock;  // a caller without the run's lock holds it for this save
  {
    std::unique_lock<std::mutex> g(g_locks_mutex);
    const bool held = g_locked_dirs.count(lock_key(dir)) > 0;
    g.unlock();
    if (!held) own_lock = std::make_unique<CheckpointDirLock>(dir);
  }
  const std::string name = checkpoint_file_name(ckpt.state.step);
  const fs::path file = fs::path(dir) / name;
  replace_entry(file, ckpt);
  remember_checkpoint(file, true);
  // latest.h5 → the new file: a fresh symlink renamed over the old one (rename is atomic), updated last.
  const fs::path latest = fs::path(dir) / kLatestCheckpoint;
  const fs::path tmp_link = temporary_name(latest.string());
  fs::remove(tmp_link, ec);
  fs::create_symlink(name, tmp_link, ec);
  RN_CHECK_CTX(!ec, tmp_link.string(), "cannot create the latest.h5 symlink: {}", ec.message());
  fs::rename(tmp_link, latest, ec);
  RN_CHECK_CTX(!ec, latest.string(), "cannot replace the latest.h5 symlink: {}", ec.message());
  fsync_path(dir, true);
  // Keep the newest `keep` valid ones (checkpoint_is_valid): an invalid one is not counted, and goes once `keep`
  // valid ones are newer (never a valid one for it). Temporaries of writers that are gone (a crash, kill -9) go too.
  // A temporary is stale only when its writer process no longer exists on this host: another live run's file is
  // never touched.
  std::size_t kept = 0;
  for (const auto& [step, path] : checkpoints_in(dir)) {
    (void)step;
    if (kept < static_cast<std::size_t>(keep)) {
      if (checkpoint_is_valid(path)) ++kept;
    } else if (path.filename() != name) {
      fs::remove(path, ec);
    }
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const bool temporary = (f.rfind("ckpt-step", 0) == 0 && f.find(".h5.tmp-") != std::string::npos) ||
                           f.rfind(std::string(kLatestCheckpoint) + ".tmp-", 0) == 0;
    if (temporary && is_stale_temporary(f)) fs::remove(e.path(), ec);
  }
  return file.string();
}

double best_checkpoint_top1(const std::string& dir, std::string* why_invalid) {
  const fs::path best = fs::path(dir) / kBestCheckpoint;
  std::error_code ec;
  if (!fs::exists(best, ec)) return -1;
  try {
    return read_checkpoint(best.string()).state.val_top1;
  } catch (const std::bad_alloc&) {
    throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
  } catch (const std::exception& e) {
    if (why_invalid) *why_invalid = e.what();
    return -1;
  }
}

std::string save_best_checkpoint(const std::string& dir, const Checkpoint& ckpt, double best_top1) {
  if (!(ckpt.state.val_top1 >= 0)) return {};  // none (-1), or NaN
  const fs::path best = fs::path(dir) / kBestCheckpoint;
  std::error_code ec;
  if (!std::isnan(best_top1)) {
    if (best_top1 >= ckpt.state.val_top1) return {};
  } else if (fs::exists(best, ec)) {
    try {
      if (read_checkpoint(best.string()).state.val_top1 >= ckpt.state.val_top1) return {};
    } catch (const std::bad_alloc&) {
      throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
    } catch (const std::exception&) {
      // an unreadable best.h5 is replaced
    }
  }
  replace_entry(best, ckpt);
  return best.string();
}

std::string find_latest_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& warn,
                                   Checkpoint* found) {
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
      Checkpoint c = read_checkpoint(target.string());
      remember_checkpoint(target, true);
      if (found) *found = std::move(c);
      return target.string();
    } catch (const std::bad_alloc&) {
      throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
    } catch (const std::exception& e) {
      skip(fmt::format("skipping {} ({}): {}", latest.string(), target.string(), e.what()));
      tried = checkpoint_key(target);
      remember_checkpoint(target, false);
    }
  }
  for (const auto& [step, path] : checkpoints_in(dir)) {
    (void)step;
    const std::string key = checkpoint_key(path);
    if (key == tried) continue;  // latest.h5's target, read once (a relative --checkpoint-dir read it twice)
    try {
      Checkpoint c = read_checkpoint(path.string());
      remember_checkpoint(path, true);
      if (found) *found = std::move(c);
      return path.string();
    } catch (const std::bad_alloc&) {
      throw;  // out of memory says nothing of the file: never "invalid" (a resume started afresh)
    } catch (const std::exception& e) {
      skip(fmt::format("skipping {}: {}", path.string(), e.what()));
      remember_checkpoint(path, false);
    }
  }
  return {};
}

}  // namespace renaissance::io
