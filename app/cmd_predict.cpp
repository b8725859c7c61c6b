// `renaissance predict`: the logits of trained weights on a slice of a dataset, written to HDF5, so another
// framework (scripts/export_pytorch.py --check-logits) can be compared with Renaissance on the same batch.
#include "commands.h"
#include "model_options.h"

#include <renaissance/core/error.h>
#include <renaissance/core/log.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/hdf5_util.h>
#include <renaissance/io/weights.h>
#include <renaissance/runtime/trainer.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

namespace renaissance::app {

namespace {

struct PredictCli {
  ModelOptions model;
  std::string data = "data/fashion-mnist.h5";
  std::string weights;
  std::string out;
  std::string split = "val";
  std::int64_t first = 0;
  std::int64_t count = 0;               ///< not given: 256 samples, fewer where the split ends first
  CLI::Option* count_option = nullptr;  ///< whether --count was given (-1 was the "not given" value, and got through)
  std::int64_t batch = 256;
  bool amp = false;
  bool ema = false;
  std::string device = "auto";
  std::int64_t val_resize = -1;  ///< -1: the file's recorded one (else 0, size/0.875)
};

/// Variable-length UTF-8, like every file of ours (io::write_string_attr).
void write_string_attr(hid_t obj, const char* name, const std::string& value, const std::string& ctx) {
  io::write_string_attr(obj, name, value, ctx);
}

/// `path` absolute and normal (provenance attributes).
std::string absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

void write_int_attr(hid_t obj, const char* name, long long value, const std::string& ctx) {
  io::H5Handle space(H5_CHECK(H5Screate(H5S_SCALAR), ctx, "scalar dataspace"), H5Sclose);
  io::H5Handle attr(
      H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), ctx, "attribute '{}'", name),
      H5Aclose);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_LLONG, &value), ctx, "writing attribute '{}'", name);
}

template <typename T>
void write_dataset(hid_t file, const char* name, hid_t file_type, hid_t mem_type, int rank, const hsize_t* dims,
                   const T* values, const std::string& ctx) {
  io::H5Handle space(H5_CHECK(H5Screate_simple(rank, dims, nullptr), ctx, "dataspace of '{}'", name), H5Sclose);
  // No object times: the same weights and data give the same bytes (like --save and `data import`).
  const io::H5Handle dcpl = io::untimed_plist(H5P_DATASET_CREATE, ctx);
  io::H5Handle ds(
      H5_CHECK(H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), ctx, "creating '{}'", name),
      H5Dclose);
  H5_CHECK(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), ctx, "writing '{}'", name);
}

void run_predict(const PredictCli& c) {
  // One process only: main refuses a job of several ranks before any command runs.
  const bool count_given = c.count_option && c.count_option->count() > 0;
  RN_CHECK(!count_given || c.count >= 1, "--count must be >= 1, got {}", c.count);
  RN_CHECK(c.batch >= 1, "--batch must be >= 1, got {}", c.batch);
  RN_CHECK(c.first >= 0, "--first must be >= 0, got {}", c.first);
  const io::Split split = io::parse_split(c.split);
  // Before any work: --out must not be an input, and must be a file we can write.
  require_distinct_files({{"--data", c.data}, {"--weights", c.weights}, {"--model-file", c.model.model_file}},
                         {{"--out", c.out}});
  const std::string target = resolve_output_file(c.out, "--out");
  // A checkpoint directory's file (latest.h5 links to the newest checkpoint): the logits replaced it, and the next
  // --resume auto started afresh. Its lock file too: replaced, it let a second run into the directory.
  for (const std::string& p : {c.out, target}) {
    const std::string name = std::filesystem::path(p).filename().string();
    RN_CHECK_CTX(!io::is_checkpoint_file_name(name) && name != io::kCheckpointLock, c.out,
                 "--out would replace a checkpoint ({}): write the logits to a file of their own", p);
  }
  // A checkpoint or weights file under another name, or a dataset (any HDF5 file: the logits files of predict start
  // with a checksum header); a previous logits file may be replaced.
  const std::string kind = io::data_file_kind(target);
  RN_CHECK_CTX(kind.empty() || kind == "a file with a checksum header", c.out,
               "--out would replace {}, {}{}: write the logits to a file of their own", target, kind,
               kind == "an HDF5 file" ? " (a dataset?)" : "");
  const io::DatasetFile data(c.data);  // its size now; its labels, normalisation and class names for the output
  const std::int64_t n = data.size(split);
  data.validate_labels(split);  // before any inference (a label out of range stopped it after the whole pass)
  RN_CHECK_CTX(c.first < n, c.data, "--first {} is past the end of the {} split ({} samples)", c.first, c.split, n);
  // Without --count: 256 samples from --first, or as many as the split has from there.
  const std::int64_t count = count_given ? c.count : std::min<std::int64_t>(n - c.first, 256);
  // The range's end as text: --first + --count may pass 2^63 (it printed a negative end).
  const std::string end = count > std::numeric_limits<std::int64_t>::max() - c.first
                              ? fmt::format("{} + {}", c.first, count)
                              : fmt::format("{}", c.first + count);
  RN_CHECK_CTX(count <= n - c.first, c.data,
               "--first {} --count {}: samples [{}, {}) are past the end of the {} split ({} samples)", c.first, count,
               c.first, end, c.split, n);
  runtime::TrainOptions t;
  t.data_path = c.data;
  t.backend = pick_backend(c.device);
  t.batch = std::min(c.batch, count);
  t.amp = c.amp;
  t.ema = c.ema;
  t.epochs = 1;
  t.inference_only = true;
  const blueprint::BluePrint bp = c.model.load();
  io::WeightsFile weights = io::read_weights(c.weights);  // verified, and matched before the Trainer's start-up
  if (c.ema) weights.require_ema(c.weights);
  auto initial =
      std::make_unique<runtime::InitialState>(runtime::InitialState::of_weights(std::move(weights), c.weights));
  t.augmentation.val_resize = scoring_val_resize(c.val_resize, *initial);
  runtime::Trainer trainer(bp, t, initial.get());
  initial.reset();  // the host copy of the tensors
  const std::vector<float> logits = trainer.logits(split, c.first, count, c.ema);
  const std::int64_t classes = trainer.plan().arch.num_classes;

  // Labels alongside, so a reader can score the same samples without the dataset.
  std::vector<std::int32_t> labels(static_cast<std::size_t>(count));
  data.read(split, c.first, count, nullptr, labels.data());
  std::int64_t correct = 0, nonfinite = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const float* row = logits.data() + i * classes;
    const std::int32_t y = labels[static_cast<std::size_t>(i)];
    correct += (std::max_element(row, row + classes) - row) == y && !std::isnan(row[y]);  // NaN: never correct
    nonfinite += !std::all_of(row, row + classes, [](float v) { return std::isfinite(v); });
  }
  // Written as they are, but not silently (FP16 holds at most 65504; diverged weights give NaN).
  if (nonfinite > 0)
    spdlog::warn("{} of {} samples have logits that are not finite ({}); they are written as they are", nonfinite,
                 count, c.amp ? "with --amp they overflowed FP16: predict without --amp" : "the weights diverged?");

  io::hdf5_init();
  auto lock = io::hdf5_lock();
  std::vector<std::uint8_t> bytes;
  {
    io::MemoryH5File mem(c.out);  // in memory, then one atomic write of ours (a full disk is a clean error)
    const hid_t file = mem.file();
    write_string_attr(file, "format", "renaissance-logits", c.out);
    write_int_attr(file, "version", 1, c.out);
    write_string_attr(file, "model", bp.name, c.out);
    write_string_attr(file, "weights", absolute(c.weights), c.out);
    write_string_attr(file, "data", absolute(c.data), c.out);
    // The dataset's normalisation and class names, as in weights files (a reader needs no dataset).
    io::write_f32_array_attr(file, "mean", data.mean(), c.out);
    io::write_f32_array_attr(file, "std", data.stddev(), c.out);
    if (!data.class_names().empty()) io::write_string_array_attr(file, "class_names", data.class_names(), c.out);
    write_string_attr(file, "split", c.split, c.out);
    write_string_attr(file, "device", runtime::backend_name(t.backend), c.out);
    write_int_attr(file, "first", c.first, c.out);
    write_int_attr(file, "amp", c.amp, c.out);
    write_int_attr(file, "ema", c.ema, c.out);
    const hsize_t ldims[2] = {static_cast<hsize_t>(count), static_cast<hsize_t>(classes)};
    write_dataset(file, "logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, ldims, logits.data(), c.out);
    const hsize_t n = static_cast<hsize_t>(count);
    write_dataset(file, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &n, labels.data(), c.out);
    bytes = mem.finish({});
  }
  io::write_file_atomically(c.out, bytes);
  std::printf("%s: logits of %s samples [%lld, %lld) (%s, %s%s) -> %s; top1 %.4f\n", bp.name.c_str(), c.split.c_str(),
              static_cast<long long>(c.first), static_cast<long long>(c.first + count),
              runtime::backend_name(t.backend), c.amp ? "fp16" : "fp32", c.ema ? ", EMA" : "", c.out.c_str(),
              static_cast<double>(correct) / static_cast<double>(count));
}

}  // namespace

void register_predict_command(CLI::App& app) {
  auto c = std::make_shared<PredictCli>();
  CLI::App* cmd = app.add_subcommand("predict", "Write the logits of trained weights on dataset samples (HDF5)");
  c->model.add_to(*cmd);
  cmd->add_option("--data", c->data, "HDF5 dataset")->capture_default_str();
  cmd->add_option("--weights", c->weights, "Weights file written by `renaissance train --save`")->required();
  cmd->add_option("--out", c->out, "Output HDF5: /logits float32 [count, classes], /labels int32 [count]")->required();
  cmd->add_option("--split", c->split, "train|val")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "val"}));
  cmd->add_option("--first", c->first, "First sample")->capture_default_str();
  c->count_option = cmd->add_option("--count", c->count,
                                    "Number of samples (default: 256, or to the end of the split if it ends first)");
  cmd->add_option("--batch", c->batch, "Inference batch size")->capture_default_str();
  cmd->add_flag("--amp", c->amp, "FP16 inference (FP32 accumulation)");
  cmd->add_flag("--ema", c->ema, "Use the EMA weights");
  add_val_resize_option(*cmd, c->val_resize);
  cmd->add_option("--device", c->device, "cpu|cuda|auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->callback([c] { run_predict(*c); });
}

}  // namespace renaissance::app
