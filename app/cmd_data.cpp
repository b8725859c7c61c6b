// `renaissance data ...`: import datasets into the Renaissance HDF5 format and inspect them.
#include "cli_errors.h"
#include "commands.h"
#include "json_writer.h"
#include "stdout_print.h"

#include <renaissance/core/dtensor.h>
#include <renaissance/core/error.h>
#include <renaissance/core/paths.h>
#include <renaissance/io/dataset.h>
#include <renaissance/io/importers.h>
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/devices.h>
#include <renaissance/runtime/gpu_jpeg.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace renaissance::app {

namespace {

/// A name from the file on one line of the summary: control characters escaped, a newline as \n.
std::string one_line(const std::string& name) {
  std::string one;
  for (const char ch : terminal_text(name)) one += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  return one;
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

std::string human_bytes(std::int64_t b) {
  if (b >= (std::int64_t(1) << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (1 << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
}

/// "120x90 to 500x375" of a JPEG store's split.
std::string size_range(const io::SplitInfo& i) {
  if (i.count == 0) return "no images";
  return fmt::format("{}x{} to {}x{}", i.min_width, i.min_height, i.max_width, i.max_height);
}

void print_summary(const std::string& path) {
  const io::DatasetFile f(path);
  const io::SplitInfo& t = f.info(io::Split::train);
  if (f.storage() == io::Storage::jpeg)
    print_stdout("wrote {}: train {}, val {} JPEGs ({} channels, {}, {}), {} classes\n", path, t.count,
                 f.size(io::Split::val), t.channels, size_range(t),
                 human_bytes(t.encoded_bytes + f.info(io::Split::val).encoded_bytes), f.num_classes());
  else
    print_stdout("wrote {}: train {}, val {} samples of {}x{}x{}, {} classes\n", path, t.count, f.size(io::Split::val),
                 t.height, t.width, t.channels, f.num_classes());
}

/// A progress bar on stderr when it is a terminal; one line per split otherwise (logs stay readable).
class ImportProgressBar {
 public:
  ImportProgressBar() : m_tty(isatty(fileno(stderr)) != 0), m_split_t0(std::chrono::steady_clock::now()) {}
  void operator()(const io::ImportProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - m_split_t0).count();
    const double ips = s > 0 ? static_cast<double>(p.done) / s : 0.0;
    if (p.done == p.total) {
      if (m_tty) std::fprintf(stderr, "\r%*s\r", 79, "");
      std::fprintf(stderr, "%s: %lld images in %.1f s (%.0f images/s)\n", io::split_name(p.split),
                   static_cast<long long>(p.total), s, ips);
      m_split_t0 = now;  // the next split starts here
      return;
    }
    if (!m_tty || now - m_last < std::chrono::milliseconds(200)) return;
    m_last = now;
    const int width = 30, done = static_cast<int>(width * p.done / std::max<std::int64_t>(p.total, 1));
    std::fprintf(stderr, "\rimporting %s [%s%s] %lld/%lld  %.0f images/s ", io::split_name(p.split),
                 std::string(static_cast<std::size_t>(done), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - done), '.').c_str(), static_cast<long long>(p.done),
                 static_cast<long long>(p.total), ips);
    std::fflush(stderr);
  }

 private:
  bool m_tty;
  std::chrono::steady_clock::time_point m_split_t0, m_last{};
};

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
    // Every writer refuses to finish one (a hand-made or cut-down file), and train refuses it: not called valid.
    RN_CHECK_CTX(file->info(io::Split::train).count > 0, path,
                 "the train split is empty: no Renaissance writer makes such a file, and train refuses it");
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
        "\"format\": \"{}\", \"version\": {}, \"storage\": \"{}\", ",
        json_escape(path), quick ? "false" : "true", !quick && f.version() >= 2 ? "true" : "false", io::kDatasetFormat,
        f.version(), io::storage_name(f.storage()));
    out += fmt::format("\"num_classes\": {}, \"mean\": {}, \"std\": {}, \"class_names\": {}, \"splits\": {{",
                       f.num_classes(), json_array(f.mean()), json_array(f.stddev()), json_array(f.class_names()));
    bool first = true;
    for (io::Split s : io::kAllSplits) {
      const io::SplitInfo& i = f.info(s);
      if (f.storage() == io::Storage::jpeg)
        out += fmt::format(
            "{}\"{}\": {{\"count\": {}, \"channels\": {}, \"min_size\": [{}, {}], \"max_size\": [{}, {}], "
            "\"encoded_bytes\": {}, \"chunk_bytes\": {}, \"fletcher32\": {}, \"label_histogram\": {}}}",
            first ? "" : ", ", io::split_name(s), i.count, i.channels, i.min_height, i.min_width, i.max_height,
            i.max_width, i.encoded_bytes, i.chunk_samples, i.fletcher32 ? "true" : "false",
            json_array(f.label_histogram(s)));
      else
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
  if (f.storage() == io::Storage::jpeg)
    out += fmt::format("storage:     jpeg ({} channels; imported at quality {}, max side {})\n", f.channels(),
                       f.jpeg_spec().quality, f.jpeg_spec().max_side > 0 ? std::to_string(f.jpeg_spec().max_side) : "none");
  else
    out += "storage:     raw\n";
  out += fmt::format("mean:        {}\nstd:         {}\n", fmt::join(f.mean(), ", "), fmt::join(f.stddev(), ", "));
  if (!f.class_names().empty()) {  // from the file: control characters escaped (a newline too, on one line)
    std::vector<std::string> names;
    for (const std::string& n : f.class_names()) names.push_back(one_line(n));
    out += fmt::format("class_names: {}\n", fmt::join(names, ", "));
  }
  for (io::Split s : io::kAllSplits) {
    const io::SplitInfo& i = f.info(s);
    if (f.storage() == io::Storage::jpeg) {
      out += fmt::format("/{}: {} JPEGs ({}), {} channels, {}, labels int32 [{}]\n", io::split_name(s), i.count,
                         size_range(i), i.channels, human_bytes(i.encoded_bytes), i.count);
      out += fmt::format("  storage: chunks of {} bytes, filters: {}\n", i.chunk_samples, filters_text(i));
    } else {
      out += fmt::format("/{}: images uint8 [{}, {}, {}, {}], labels int32 [{}]\n", io::split_name(s), i.count,
                         i.height, i.width, i.channels, i.count);
      out += fmt::format("  storage: chunks of {} samples, filters: {}\n", i.chunk_samples, filters_text(i));
    }
    const std::vector<std::int64_t> hist = f.label_histogram(s);
    out += "  labels:";
    // Many classes (a label set of thousands): the classes without samples are counted, not listed.
    const bool sparse = hist.size() > 100;
    std::size_t listed = 0, empty = 0;
    for (size_t k = 0; k < hist.size(); ++k) {
      if (sparse && hist[k] == 0) {
        ++empty;
        continue;
      }
      const std::string name = k < f.class_names().size() ? fmt::format(" ({})", one_line(f.class_names()[k])) : "";
      out += fmt::format("{}{}{}: {}", listed++ ? ", " : " ", k, name, hist[k]);
    }
    if (empty) out += fmt::format("{}{} of {} classes without samples", listed ? "; " : " ", empty, hist.size());
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
  // No model could train on more (the input pipeline's limit): an error now, not after a training run's start-up.
  RN_CHECK_CTX(dims[2] <= kMaxImageChannels, "--shape", "'{}': at most {} image channels are supported", s,
               kMaxImageChannels);
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
    // The files the import reads: the .gz names or, where only those exist, the unpacked copies.
    const io::FashionMnistSources src = io::fashion_mnist_sources(args->src);
    require_distinct_files({{"--src", src.train.images},
                            {"--src", src.train.labels},
                            {"--src", src.val.images},
                            {"--src", src.val.labels}},
                           {{"--out", args->out}});
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

  // ---- folder (issue 12) ----------------------------------------------------------------------------------------
  struct FolderArgs {
    std::string dir, out, store = "jpeg";
    io::FolderImportOptions o;
  };
  auto fargs = std::make_shared<FolderArgs>();
  fargs->o.writer.deflate_level = 0;  // decoded photographs barely deflate, and deflate costs 3x the import time
  CLI::App* folder = import->add_subcommand(
      "folder", "An ImageFolder tree (DIR/train/<class>/*.jpg|png, DIR/val/<class>/...) as a JPEG or raw store");
  folder->add_option("DIR", fargs->dir, "The folder holding train/ (and val/)")->required();
  folder->add_option("--out", fargs->out, "Output .h5 file")->required();
  folder->add_option("--store", fargs->store, "jpeg: the JPEG bytes (decoded when read); raw: decoded uint8, resized")
      ->capture_default_str()
      ->check(CLI::IsMember({"jpeg", "raw"}));
  folder->add_option("--size", fargs->o.size, "raw: short side resized to S, then the centre SxS kept");
  folder->add_option("--max-side", fargs->o.max_side,
                     "jpeg: images whose longer side exceeds S are resized to S and re-encoded (0: keep all)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(0), std::int64_t(65500)));
  folder->add_option("--quality", fargs->o.quality, "jpeg: quality of re-encoded images (1-100)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  folder->add_option("--channels", fargs->o.channels, "3: RGB (as torchvision's loader), 1: grey")
      ->capture_default_str()
      ->check(CLI::IsMember({1, 3}));
  folder->add_option("--threads", fargs->o.threads, "Decoding threads (0: every CPU of the affinity mask)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  folder->add_flag("--skip-bad", fargs->o.skip_bad,
                   "Skip unreadable images (corrupt, truncated, not an image, too large) and count them");
  folder->add_option("--max-pixels", fargs->o.limits.max_pixels, "Largest image accepted, in pixels (w*h)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
  folder->add_option("--deflate", fargs->o.writer.deflate_level, "Deflate level 0-9 of raw images and labels")
      ->capture_default_str()
      ->check(CLI::Range(0, 9));
  folder->callback([fargs] {
    require_distinct_files({{"DIR", fargs->dir}}, {{"--out", fargs->out}});
    fargs->o.storage = fargs->store == "raw" ? io::Storage::raw : io::Storage::jpeg;
    if (fargs->o.storage == io::Storage::raw && fargs->o.size <= 0)
      RN_FAIL_CTX("--size", "--store raw needs --size S (the short side is resized to S, the centre SxS kept)");
    if (fargs->o.storage == io::Storage::jpeg && fargs->o.size > 0)
      RN_FAIL_CTX("--size", "--size applies to --store raw; a JPEG store keeps each image's size (see --max-side)");
    auto bar = std::make_shared<ImportProgressBar>();
    fargs->o.progress = [bar](const io::ImportProgress& p) { (*bar)(p); };
    const io::FolderImportSummary sum = io::import_folder(fargs->out, fargs->dir, fargs->o);
    print_summary(fargs->out);
    if (!sum.has_val) print_stdout("note: {} has no val folder: the val split is empty\n", fargs->dir);
    if (fargs->o.storage == io::Storage::jpeg)
      print_stdout("jpeg: {} kept as they were, {} (re-)encoded at quality {}\n", sum.kept, sum.reencoded,
                   fargs->o.quality);
    if (sum.bad > 0) {
      print_stdout("skipped {} unreadable image(s) (--skip-bad):\n", sum.bad);
      for (const std::string& e : sum.bad_examples) print_stdout("  {}\n", e);
      if (sum.bad > static_cast<std::int64_t>(sum.bad_examples.size()))
        print_stdout("  ... and {} more\n", sum.bad - static_cast<std::int64_t>(sum.bad_examples.size()));
    }
    if (sum.other_files > 0)
      print_stdout("skipped {} file(s) whose names do not end in .jpg, .jpeg or .png\n", sum.other_files);
  });

  // ---- CIFAR (issue 12) ---------------------------------------------------------------------------------------------
  struct CifarArgs {
    std::string tarball, out;
    bool coarse = false;
    io::DatasetWriterOptions options;
  };
  for (const int classes : {10, 100}) {
    auto cargs = std::make_shared<CifarArgs>();
    CLI::App* cifar = import->add_subcommand(
        fmt::format("cifar{}", classes),
        fmt::format("CIFAR-{} from the python tarball (cifar-{}-python.tar.gz)", classes, classes));
    cifar->add_option("FILE", cargs->tarball, fmt::format("cifar-{}-python.tar.gz", classes))->required();
    cifar->add_option("--out", cargs->out, "Output .h5 file")->required();
    if (classes == 100) cifar->add_flag("--coarse", cargs->coarse, "The 20 coarse labels instead of the 100 fine ones");
    cifar->add_option("--deflate", cargs->options.deflate_level, "Deflate level 0-9 (0 = off)")
        ->capture_default_str()
        ->check(CLI::Range(0, 9));
    cifar->callback([cargs, classes] {
      require_distinct_files({{"FILE", cargs->tarball}}, {{"--out", cargs->out}});
      io::import_cifar(cargs->out, cargs->tarball, classes, cargs->coarse, cargs->options);
      print_summary(cargs->out);
    });
  }

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
  synth->add_option("--classes", sargs->classes, "Number of classes")
      ->required()
      ->check(CLI::Range(1, io::kMaxClasses));
  synth->add_option("--seed", sargs->seed, "Random seed")->capture_default_str()->check(seed_value());
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

  struct BenchDecodeArgs {
    std::string file, crop = "random-resized", device = "gpu";
    runtime::JpegBenchOptions o;
    bool no_hardware = false, json = false;
  };
  auto bargs = std::make_shared<BenchDecodeArgs>();
  CLI::App* bd = data->add_subcommand(
      "bench-decode",
      "img/s of a JPEG store's train split read alone, read + decode, and read + decode + render (crop, "
      "resample, flip): on the GPU through nvJPEG (--device gpu), or through the CPU loader threads (--device cpu)");
  bd->add_option("STORE", bargs->file, "A JPEG store (data import folder --store jpeg)")->required();
  bd->add_option("--device", bargs->device,
                 "gpu: nvJPEG (needs CUDA and nvJPEG); cpu: libjpeg-turbo on --loader-threads threads, whole images "
                 "and, for random-resized crops, only each crop's box (what training on the CPU path does)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpu", "cpu"}));
  bd->add_option("--batch", bargs->o.batch, "Images per nvJPEG batch (--device cpu: per loader batch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  bd->add_option("--images", bargs->o.images, "Images of the train split to use (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bd->add_option("--size", bargs->o.size, "The rendered size (square)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  bd->add_option("--crop", bargs->crop, "The render's crop")
      ->capture_default_str()
      ->check(CLI::IsMember({"random-resized", "center"}));
  bd->add_option("--passes", bargs->o.passes, "Timed passes of each kind (the best is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bd->add_option("--loader-threads", bargs->o.loader_threads,
                 "Threads reading the store (--device cpu: reading, decoding and rendering)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  bd->add_option("--decoders", bargs->o.decoders,
                 "Threads of the decode-ahead (what training runs, --gpu-decoders) for the last figure")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  bd->add_flag("--no-hardware", bargs->no_hardware, "nvJPEG's default backend only (not the JPEG engines)");
  bd->add_flag("--json", bargs->json, "Machine-readable output");
  bd->callback([bargs] {
    bargs->o.crop = io::parse_crop_mode(bargs->crop);
    bargs->o.prefer_hardware = !bargs->no_hardware;
    const io::DatasetFile f(bargs->file);
    RN_CHECK_CTX(f.storage() == io::Storage::jpeg, f.path(), "bench-decode needs a JPEG store (--store jpeg)");
    if (bargs->device == "cpu") {
      const runtime::JpegBenchOptions& o = bargs->o;
      const runtime::CpuDecodeBench c =
          runtime::bench_cpu_decode(f, o.images, o.batch, o.size, o.crop, o.loader_threads, o.passes);
      if (bargs->json) {
        std::printf(
            "{\"store\": \"%s\", \"device\": \"cpu\", \"images\": %lld, \"threads\": %d, \"size\": %lld, "
            "\"crop\": \"%s\", \"read_img_s\": %.0f, \"decode_render_img_s\": %.0f, \"box_decode_render_img_s\": "
            "%.0f}\n",
            json_escape(bargs->file).c_str(), static_cast<long long>(c.images), o.loader_threads,
            static_cast<long long>(o.size), bargs->crop.c_str(), c.read_per_s, c.whole_per_s, c.box_per_s);
        return;
      }
      std::printf("%s: %lld images, %d loader thread(s), batches of %lld, the CPU\n", bargs->file.c_str(),
                  static_cast<long long>(c.images), o.loader_threads, static_cast<long long>(o.batch));
      std::printf("  read alone:                               %10.0f img/s\n", c.read_per_s);
      std::printf("  read + decode + render %lldx%lld (%s, flip): %7.0f img/s\n", static_cast<long long>(o.size),
                  static_cast<long long>(o.size), bargs->crop.c_str(), c.whole_per_s);
      if (c.box_per_s > 0)
        std::printf("  the same, decoding only each crop's box:  %10.0f img/s (the training path)\n", c.box_per_s);
      return;
    }
    RN_CHECK(runtime::cuda_device_count() > 0,
             "data bench-decode --device gpu: no CUDA device is visible (--device cpu measures the CPU loader)");
    const runtime::JpegBenchResult r = runtime::bench_jpeg_decode(f, bargs->o);
    if (bargs->json) {
      std::printf(
          "{\"store\": \"%s\", \"backend\": \"%s\", \"images\": %lld, \"encoded_mib\": %.1f, \"batch\": %lld, "
          "\"size\": %lld, \"read_img_s\": %.0f, \"decode_img_s\": %.0f, \"decode_render_img_s\": %.0f, "
          "\"decoders\": %d, \"ahead_img_s\": %.0f, "
          "\"hardware_images\": %lld, \"default_images\": %lld, \"cpu_fallbacks\": %lld}\n",
          json_escape(bargs->file).c_str(), r.backend.c_str(), static_cast<long long>(r.images), r.encoded_mib,
          static_cast<long long>(bargs->o.batch), static_cast<long long>(bargs->o.size), r.read_per_s, r.decode_per_s,
          r.render_per_s, bargs->o.decoders, r.ahead_per_s, static_cast<long long>(r.hardware_images),
          static_cast<long long>(r.default_images), static_cast<long long>(r.cpu_fallbacks));
      return;
    }
    std::printf("%s: %lld images (%.1f MiB of JPEG), batches of %lld, nvJPEG backend: %s\n", bargs->file.c_str(),
                static_cast<long long>(r.images), r.encoded_mib, static_cast<long long>(bargs->o.batch),
                r.backend.c_str());
    std::printf("  read alone:                    %10.0f img/s\n", r.read_per_s);
    std::printf("  read + nvJPEG decode:          %10.0f img/s\n", r.decode_per_s);
    std::printf("  read + decode + render %lldx%lld: %7.0f img/s (%s, flip, FP16)\n",
                static_cast<long long>(bargs->o.size), static_cast<long long>(bargs->o.size), r.render_per_s,
                bargs->crop.c_str());
    std::printf("  the same, decoded ahead on %d threads: %7.0f img/s (the training path)\n", bargs->o.decoders,
                r.ahead_per_s);
    std::printf("  decoded by the JPEG engines: %lld, by the default backend: %lld, on the CPU: %lld (all passes)\n",
                static_cast<long long>(r.hardware_images), static_cast<long long>(r.default_images),
                static_cast<long long>(r.cpu_fallbacks));
  });
}

}  // namespace renaissance::app
