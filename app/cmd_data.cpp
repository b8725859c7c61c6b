// `renaissance data ...`: import datasets into the Renaissance HDF5 format and inspect them.
#include "commands.h"

#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/importers.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace renaissance::app {

namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += ch;
    }
  }
  return out;
}

template <typename T>
std::string json_array(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    if constexpr (std::is_same_v<T, std::string>)
      out += "\"" + json_escape(v[i]) + "\"";
    else
      out += fmt::format("{}", v[i]);
  }
  return out + "]";
}

std::string filters_text(const io::SplitInfo& s) {
  std::string f;
  if (s.deflate_level > 0) f += fmt::format("deflate({})", s.deflate_level);
  if (s.fletcher32) f += f.empty() ? "fletcher32" : ", fletcher32";
  return f.empty() ? "none" : f;
}

void print_summary(const std::string& path) {
  const io::DatasetFile f(path);
  const io::SplitInfo& t = f.info(io::Split::train);
  fmt::print("wrote {}: train {}, val {} samples of {}x{}x{}, {} classes\n", path, t.count, f.size(io::Split::val),
             t.height, t.width, t.channels, f.num_classes());
}

/// The report of `data inspect`. An invalid file throws (after a {"valid": false} line with --json), so the
/// command exits 1 with the reason on stderr.
void inspect(const std::string& path, bool json, bool quick) {
  std::unique_ptr<io::DatasetFile> file;
  try {
    file = std::make_unique<io::DatasetFile>(path);
    for (io::Split s : io::kAllSplits) {
      if (quick)
        file->validate_labels(s);
      else
        file->verify(s);
    }
  } catch (const Error& e) {
    if (json)
      std::printf("{\"file\": \"%s\", \"valid\": false, \"error\": \"%s\"}\n", json_escape(path).c_str(),
                  json_escape(e.what()).c_str());
    throw;
  }
  const io::DatasetFile& f = *file;
  if (json) {
    std::string out = fmt::format(
        "{{\"file\": \"{}\", \"valid\": true, \"checksums_verified\": {}, \"content_checksums\": {}, "
        "\"format\": \"{}\", \"version\": {}, ",
        json_escape(path), quick ? "false" : "true", !quick && f.version() >= 2 ? "true" : "false", io::kDatasetFormat,
        f.version());
    out += fmt::format("\"num_classes\": {}, \"mean\": {}, \"std\": {}, \"class_names\": {}, \"splits\": {{",
                       f.num_classes(), json_array(f.mean()), json_array(f.stddev()), json_array(f.class_names()));
    bool first = true;
    for (io::Split s : io::kAllSplits) {
      const io::SplitInfo& i = f.info(s);
      out += fmt::format(
          "{}\"{}\": {{\"count\": {}, \"shape\": [{}, {}, {}, {}], \"chunk_samples\": {}, \"deflate\": {}, "
          "\"fletcher32\": {}, \"label_histogram\": {}}}",
          first ? "" : ", ", io::split_name(s), i.count, i.count, i.height, i.width, i.channels, i.chunk_samples,
          i.deflate_level, i.fletcher32 ? "true" : "false", json_array(f.label_histogram(s)));
      first = false;
    }
    out += "}}\n";
    std::fputs(out.c_str(), stdout);
    return;
  }
  std::string out = fmt::format("file:        {}\nformat:      {} version {}\nnum_classes: {}\n", path,
                                io::kDatasetFormat, f.version(), f.num_classes());
  out += fmt::format("mean:        {}\nstd:         {}\n", fmt::join(f.mean(), ", "), fmt::join(f.stddev(), ", "));
  if (!f.class_names().empty()) out += fmt::format("class_names: {}\n", fmt::join(f.class_names(), ", "));
  for (io::Split s : io::kAllSplits) {
    const io::SplitInfo& i = f.info(s);
    out += fmt::format("/{}: images uint8 [{}, {}, {}, {}], labels int32 [{}]\n", io::split_name(s), i.count, i.height,
                       i.width, i.channels, i.count);
    out += fmt::format("  storage: chunks of {} samples, filters: {}\n", i.chunk_samples, filters_text(i));
    const std::vector<std::int64_t> hist = f.label_histogram(s);
    out += "  labels:";
    for (size_t k = 0; k < hist.size(); ++k) {
      const std::string name = k < f.class_names().size() ? fmt::format(" ({})", f.class_names()[k]) : "";
      out += fmt::format("{}{}{}: {}", k ? ", " : " ", k, name, hist[k]);
    }
    out += "\n";
  }
  if (quick)
    out += "labels valid: yes (image checksums not read: --quick)\n";
  else if (f.version() >= 2)
    out += "labels valid: yes\nchecksums:   every chunk verified (Fletcher32), every block's content checksum matches\n";
  else
    out += "labels valid: yes\nchecksums:   every chunk verified (Fletcher32 only: a version 1 file has no content "
           "checksums, so a zeroed chunk would pass; re-import to get them)\n";
  std::fputs(out.c_str(), stdout);
}

std::vector<std::int64_t> parse_shape(const std::string& s) {
  std::vector<std::int64_t> dims;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(part, &used);
      if (used != part.size() || v <= 0) throw std::invalid_argument(part);
      dims.push_back(v);
    } catch (const std::exception&) {
      RN_FAIL_CTX("--shape", "'{}' is not H,W,C with positive integers (e.g. 32,32,3)", s);
    }
  }
  RN_CHECK_CTX(dims.size() == 3, "--shape", "'{}' is not H,W,C (e.g. 32,32,3)", s);
  return dims;
}

}  // namespace

void register_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Create and inspect Renaissance datasets (HDF5)");
  data->require_subcommand(1);

  // ---- import -------------------------------------------------------------------------------------------------
  CLI::App* import = data->add_subcommand("import", "Import a dataset into the Renaissance HDF5 format");
  import->require_subcommand(1);

  struct ImportArgs {
    std::string out, src = io::kFashionMnistDir;
    io::IdxPair train, val;
    int classes = 0;
    io::DatasetWriterOptions options;
  };
  auto args = std::make_shared<ImportArgs>();

  CLI::App* fmnist = import->add_subcommand("fashion-mnist", "Fashion-MNIST from its idx .gz files");
  fmnist->add_option("--out", args->out, "Output .h5 file")->required();
  fmnist->add_option("--src", args->src, "Directory with the four *-ubyte.gz files")->capture_default_str();
  fmnist->add_option("--deflate", args->options.deflate_level, "Deflate level 0-9 (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 9));
  fmnist->callback([args] {
    std::vector<std::pair<std::string, std::string>> inputs;
    for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                          "t10k-labels-idx1-ubyte.gz"})
      inputs.emplace_back("--src", args->src + "/" + f);
    require_distinct_files(inputs, {{"--out", args->out}});
    io::import_fashion_mnist(args->out, args->src, args->options);
    print_summary(args->out);
  });

  CLI::App* idx = import->add_subcommand("idx", "Any MNIST-format (idx) images/labels pairs");
  idx->add_option("--train-images", args->train.images, "idx3 images of the train split (.gz or raw)")->required();
  idx->add_option("--train-labels", args->train.labels, "idx1 labels of the train split")->required();
  idx->add_option("--val-images", args->val.images, "idx3 images of the val split")->required();
  idx->add_option("--val-labels", args->val.labels, "idx1 labels of the val split")->required();
  idx->add_option("--classes", args->classes, "Number of classes")->required()->check(CLI::Range(1, 256));
  idx->add_option("--out", args->out, "Output .h5 file")->required();
  idx->add_option("--deflate", args->options.deflate_level, "Deflate level 0-9 (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 9));
  idx->callback([args] {
    require_distinct_files({{"--train-images", args->train.images}, {"--train-labels", args->train.labels},
                            {"--val-images", args->val.images}, {"--val-labels", args->val.labels}},
                           {{"--out", args->out}});
    io::import_idx(args->out, args->train, args->val, args->classes, {}, args->options);
    print_summary(args->out);
  });

  // ---- synthetic ----------------------------------------------------------------------------------------------
  struct SynthArgs {
    std::string out, shape;
    std::int64_t train = 0, val = 0;
    int classes = 0;
    std::uint64_t seed = 0;
    int deflate = 0;
  };
  auto sargs = std::make_shared<SynthArgs>();
  CLI::App* synth = data->add_subcommand("synthetic", "Deterministic random dataset (benchmarks, smoke tests)");
  synth->add_option("--out", sargs->out, "Output .h5 file")->required();
  // Integer ranges (CLI11's PositiveNumber printed its bound as a 309-digit double).
  synth->add_option("--train", sargs->train, "Train samples")
      ->required()
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 31));
  synth->add_option("--val", sargs->val, "Val samples")->required()->check(CLI::Range(std::int64_t(0), std::int64_t(1) << 31));
  synth->add_option("--shape", sargs->shape, "Image shape H,W,C (e.g. 32,32,3)")->required();
  synth->add_option("--classes", sargs->classes, "Number of classes")->required()->check(CLI::Range(1, 1 << 20));
  synth->add_option("--seed", sargs->seed, "Random seed")->capture_default_str();
  synth->add_option("--deflate", sargs->deflate, "Deflate level 0-9 (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 9));
  synth->callback([sargs] {
    const std::vector<std::int64_t> s = parse_shape(sargs->shape);
    io::make_synthetic(sargs->out, sargs->train, sargs->val, s[0], s[1], s[2], sargs->classes, sargs->seed,
                       io::DatasetWriterOptions{0, sargs->deflate});
    print_summary(sargs->out);
  });

  // ---- inspect ------------------------------------------------------------------------------------------------
  struct InspectArgs {
    std::string file;
    bool json = false;
    bool quick = false;
  };
  auto iargs = std::make_shared<InspectArgs>();
  CLI::App* insp =
      data->add_subcommand("inspect", "Validate a dataset (structure, labels, every chunk checksum) and print it");
  insp->add_option("FILE", iargs->file, "Dataset .h5 file")->required();
  insp->add_flag("--json", iargs->json, "Machine-readable output");
  insp->add_flag("--quick", iargs->quick, "Skip reading every image chunk (no checksum verification)");
  insp->callback([iargs] { inspect(iargs->file, iargs->json, iargs->quick); });
}

}  // namespace renaissance::app
