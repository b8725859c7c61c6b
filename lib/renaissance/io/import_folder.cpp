// `renaissance data import folder`: an ImageFolder tree of JPEG/PNG files into a JPEG store or a raw store.
#include <renaissance/core/error.h>
#include <renaissance/core/utf8.h>
#include <renaissance/io/hdf5_util.h>
#include <renaissance/io/image.h>
#include <renaissance/io/importers.h>
#include <renaissance/io/loader_pool.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace renaissance::io {

namespace fs = std::filesystem;

namespace {

struct Item {
  Split split;
  std::string path;
  std::int32_t label;
  bool link = false;  ///< the file itself is a symbolic link
};

struct ClassFile {
  std::string path;
  bool link = false;
};

/// By the name's ending, as torchvision's has_file_allowed_extension: a file named ".jpg" is an image too
/// (path::extension() is empty for a name that starts with its only dot).
bool image_extension(const fs::path& p) {
  std::string n = p.filename().string();
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const char* e : {".jpg", ".jpeg", ".png"}) {
    const std::size_t len = std::strlen(e);
    if (n.size() >= len && n.compare(n.size() - len, len, e) == 0) return true;
  }
  return false;
}

/// The image files of one class folder in torchvision's order: sorted(os.walk(...)) then sorted(names), i.e. by
/// (folder path, file name). Other files are counted.
std::vector<ClassFile> class_files(const fs::path& dir, std::int64_t& other) {
  std::vector<std::tuple<std::string, std::string, bool>> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
  if (ec) RN_IO_FAIL(dir.string(), "check its permissions", "cannot list the class folder: {}", ec.message());
  // The real folders from the class folder down to the entry being looked at (containers[d]: the folder holding the
  // entries of depth d). Linked folders are followed (as torchvision's os.walk(followlinks=True) does), but a link to
  // one of them would repeat its images until the path is too long: a link to the folder holding it (3 images became
  // 129 samples), or two class folders linking to each other (a cycle through both).
  std::vector<fs::path> containers;
  {
    std::error_code cec;
    containers.push_back(fs::canonical(dir, cec));
  }
  // A failed increment (a subfolder that cannot be opened) leaves the iterator at its end: the loop would stop there
  // and drop the rest of the class without a word, so the error is checked after the loop. The folder it could not
  // open is the last one entered.
  fs::path last_folder = dir;
  // Every real folder entered, and the path it was first entered by: links that reach one folder by several paths
  // without a cycle (each of 24 folders linking twice to the next) made 2^24 walks of its images (the import ran
  // for hours; at depth 10 it stored 1,024 copies of one image).
  std::map<fs::path, fs::path> entered;
  for (; it != end; it.increment(ec)) {
    std::error_code fec;
    containers.resize(static_cast<std::size_t>(it.depth()) + 1);
    if (it->is_directory(fec)) {
      last_folder = it->path();
      std::error_code cec;
      const fs::path real = fs::canonical(it->path(), cec);
      if (!cec && it->is_symlink(fec))
        for (const fs::path& c : containers) {
          const fs::path rel = c.lexically_relative(real);
          if (!rel.empty() && *rel.begin() != "..")
            RN_IO_FAIL(it->path().string(), "remove the link, or point it outside the folders that lead to it",
                       "a link to the folder {}, which holds it{}: importing would repeat its images without end",
                       real.string(), c == containers.back() ? "" : " through other links");
        }
      if (!cec) {
        const auto [first, inserted] = entered.emplace(real, it->path());
        if (!inserted)
          RN_IO_FAIL(it->path().string(), "remove one of the links: keep one path to each folder within a class",
                     "the folder {} is reached again here (first as {}): links reach it by more than one path, so its "
                     "images would be imported once per path",
                     real.string(), first->second.string());
      }
      containers.push_back(cec ? it->path() : real);
      continue;
    }
    // A dangling link, a FIFO, a socket or a device named like an image is listed as a sample (as torchvision lists
    // it, and then fails to load it), so read_file names it as a bad image (or --skip-bad counts it); it was dropped
    // without a word, and a user's missing images went unnoticed. Other entries that are not images are counted.
    if (!image_extension(it->path())) {
      ++other;
      continue;
    }
    found.emplace_back(it->path().parent_path().string(), it->path().filename().string(), it->is_symlink(fec));
  }
  if (ec)
    RN_IO_FAIL(last_folder.string(), "check its permissions, or move it out of the class folder",
               "cannot list this folder of class folder {}: {}", dir.string(), ec.message());
  // By (folder, name) as Python's sorted() orders str (code points, undecodable bytes as U+DC80..U+DCFF): the bytes'
  // order put a name with an undecodable byte after one with an emoji, where torchvision puts it before.
  std::vector<std::pair<std::pair<std::u32string, std::u32string>, std::size_t>> order;
  order.reserve(found.size());
  for (std::size_t i = 0; i < found.size(); ++i)
    order.push_back({{python_code_points(std::get<0>(found[i])), python_code_points(std::get<1>(found[i]))}, i});
  std::sort(order.begin(), order.end());
  std::vector<std::tuple<std::string, std::string, bool>> sorted;
  sorted.reserve(found.size());
  for (const auto& o : order) sorted.push_back(std::move(found[o.second]));
  found = std::move(sorted);
  std::vector<ClassFile> out;
  out.reserve(found.size());
  for (const auto& [folder, name, link] : found) out.push_back({(fs::path(folder) / name).string(), link});
  return out;
}

std::vector<std::string> subfolders(const fs::path& dir, std::int64_t& other) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code dec;
    if (it->is_directory(dec)) {
      // The class names are stored as UTF-8 text (HDF5 strings, read by h5py as str).
      if (!valid_utf8(it->path().filename().string()))
        RN_IO_FAIL(it->path().string(), "rename the folder to UTF-8 text (its name is the class's name in the dataset)",
                   "the class folder's name is not UTF-8");
      names.push_back(it->path().filename().string());
    } else
      ++other;  // a file outside any class folder
  }
  if (ec) RN_IO_FAIL(dir.string(), "check its permissions", "cannot list the folder: {}", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

/// The file's bytes; one larger than any image within `limits` could be (8 bytes a pixel: a 16-bit RGBA PNG stored
/// uncompressed, plus 16 MiB of metadata) is an Error (skippable with --skip-bad) before anything is allocated: a 20 GB
/// file named .png ended the import with std::bad_alloc.
std::vector<std::uint8_t> read_file(const std::string& path, const DecodeLimits& limits) {
  std::error_code ec;
  // Checked before it is opened: opening a FIFO blocks until something writes into it.
  const fs::file_status st = fs::status(path, ec);
  if (!fs::is_regular_file(st)) {
    std::error_code lec;
    if (fs::is_symlink(fs::symlink_status(path, lec)) && (st.type() == fs::file_type::not_found || ec))
      RN_IO_FAIL(path, "restore the file it points to, remove the link, or pass --skip-bad",
                 "a link to {}, which does not exist", fs::read_symlink(path, lec).string());
    if (ec) RN_IO_FAIL(path, "check the file's permissions", "cannot read the file's status: {}", ec.message());
    const char* kind = st.type() == fs::file_type::fifo                                             ? "a FIFO"
                       : st.type() == fs::file_type::socket                                         ? "a socket"
                       : st.type() == fs::file_type::block || st.type() == fs::file_type::character ? "a device"
                                                                                                    : "not a file";
    RN_IO_FAIL(path, "remove it, or pass --skip-bad", "{} named like an image, not a regular file", kind);
  }
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) RN_IO_FAIL(path, "check the file's permissions", "cannot read the file's size: {}", ec.message());
  const std::uintmax_t cap = static_cast<std::uintmax_t>(limits.max_pixels) * 8 + (std::uintmax_t(16) << 20);
  if (size > cap)
    RN_IO_FAIL(path, "remove it, pass --skip-bad, or raise --max-pixels",
               "a file of {} bytes: larger than an image of at most {} pixels (--max-pixels) can be", size,
               limits.max_pixels);
  std::ifstream f(path, std::ios::binary);
  if (!f) RN_IO_FAIL(path, "check the file's permissions", "cannot open the file");
  std::vector<std::uint8_t> b(static_cast<std::size_t>(size));
  f.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(size));
  if (f.bad() || f.gcount() != static_cast<std::streamsize>(size))
    RN_IO_FAIL(path, "check the disk (or whether the file changed during the import)",
               "reading the file failed after {} of {} bytes", f.gcount(), size);
  return b;
}

/// One processed file: what the writer appends.
struct Result {
  bool ready = false, bad = false;
  std::string bad_reason;
  std::exception_ptr error;
  std::vector<std::uint8_t> bytes;   ///< jpeg: the JPEG to store
  std::vector<std::uint8_t> pixels;  ///< raw: the S x S x C image
  PixelSums sums;                    ///< jpeg, train: the statistics of the decoded stored JPEG (summed here)
  std::int64_t height = 0, width = 0;
  bool reencoded = false;
};

std::int64_t round_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

void process(const Item& item, const FolderImportOptions& o, Result& r) {
  const std::vector<std::uint8_t> file = read_file(item.path, o.limits);
  const ImageHeader hd = read_image_header(file.data(), file.size(), item.path, o.limits);
  Image img = decode_image(file.data(), file.size(), o.channels, item.path, o.limits);
  std::vector<std::uint8_t> scratch;
  if (o.storage == Storage::raw) {
    const ResizeCrop rc = resize_short_center_crop(img.height, img.width, o.size, o.size, o.size);
    r.pixels.resize(static_cast<std::size_t>(o.size * o.size * o.channels));
    resize_then_crop(img.pixels.data(), img.height, img.width, o.channels, rc, r.pixels.data(), o.size, o.size,
                     scratch);
    r.height = r.width = o.size;
    return;
  }
  const std::int64_t longer = std::max(img.height, img.width);
  const bool too_big = o.max_side > 0 && longer > o.max_side;
  // Kept as they are: JPEGs that decode to the store's channels with a plain decoder (not CMYK; grey is fine in an
  // RGB store, a decoder replicates it) and are not larger than max_side.
  const bool keep = hd.format == ImageFormat::jpeg && !hd.cmyk && !too_big && (o.channels == 3 || hd.channels == 1);
  if (keep) {
    r.bytes = file;
    r.height = img.height;
    r.width = img.width;
    if (item.split == Split::train) r.sums = pixel_sums(img.pixels.data(), img.height * img.width, o.channels);
    return;
  }
  if (too_big) {  // the longer side to max_side, the other in proportion (half to even), at least 1
    const double f = static_cast<double>(o.max_side) / static_cast<double>(longer);
    const std::int64_t nh = img.height >= img.width ? o.max_side
                                                    : std::max<std::int64_t>(1, round_even(img.height * f));
    const std::int64_t nw = img.width > img.height ? o.max_side : std::max<std::int64_t>(1, round_even(img.width * f));
    Image small;
    small.height = nh;
    small.width = nw;
    small.channels = o.channels;
    small.pixels.resize(static_cast<std::size_t>(nh * nw * o.channels));
    resize_box(img.pixels.data(), img.height, img.width, o.channels, 0, 0, img.height, img.width, small.pixels.data(),
               nh, nw, scratch);
    img = std::move(small);
  }
  r.bytes = encode_jpeg(img.pixels.data(), img.height, img.width, o.channels, o.quality, item.path);
  r.reencoded = true;
  // What a reader will see is the decoded new JPEG: the statistics come from it (and it is checked to decode).
  Image back = decode_image(r.bytes.data(), r.bytes.size(), o.channels, item.path + " (re-encoded)", o.limits);
  r.height = back.height;
  r.width = back.width;
  if (item.split == Split::train) r.sums = pixel_sums(back.pixels.data(), back.height * back.width, o.channels);
}

/// `out` is finally renamed into place: inside train/ or val/ it would add a file to a class folder or replace one of
/// the images being imported (`--out DIR/train/cat/0.png` replaced that image with the dataset), and a listed image
/// reached through a link would be replaced as well.
void refuse_output_in_tree(const std::string& out, const std::vector<fs::path>& roots, const std::vector<Item>& items) {
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(out, ec);
  if (ec) return;  // resolve_output_file (the caller's) names what is wrong with the path
  for (const fs::path& root : roots) {
    std::error_code rec;
    const fs::path r = fs::canonical(root, rec);
    if (rec) continue;
    const fs::path rel = target.lexically_relative(r);
    if (!rel.empty() && *rel.begin() != ".." && rel != ".")
      RN_IO_FAIL(out, "write the dataset outside the image folders (e.g. next to DIR)",
                 "--out lies inside {}, the folder being imported: the finished dataset would {}", root.string(),
                 fs::exists(target, rec) ? "replace a file there" : "become a file of that tree");
  }
  // The real folders the images lie in (one canonical() per folder, not per image: a stat of each of ImageNet's
  // 1.28 M files would take minutes on a parallel file system). A new file in one of them, reached through a linked
  // class folder, joins that class's images.
  std::map<std::string, fs::path> real_folder;
  for (const Item& it : items) {
    const fs::path p(it.path);
    auto [pos, fresh] = real_folder.try_emplace(p.parent_path().string());
    if (fresh) {
      std::error_code iec;
      pos->second = fs::canonical(p.parent_path(), iec);
      if (!iec && pos->second == target.parent_path())
        RN_IO_FAIL(out, "write the dataset outside the image folders (e.g. next to DIR)",
                   "--out lies inside {} (through a link), a folder being imported: the finished dataset would {}",
                   p.parent_path().string(), fs::exists(target, iec) ? "replace a file there" : "become a file of it");
    }
  }
  std::error_code xec;
  if (!fs::exists(target, xec)) return;  // a new file cannot be one of the images
  // The rename replaces the directory entry `target`: an image is lost when its own entry (its real folder and name;
  // a linked file's target) is that one.
  for (const Item& it : items) {
    std::error_code iec;
    fs::path real;
    if (it.link) {
      real = fs::canonical(it.path, iec);
    } else {
      const fs::path p(it.path);
      real = real_folder.at(p.parent_path().string()) / p.filename();
    }
    if (!iec && real == target)
      RN_IO_FAIL(out, "write the dataset to a new file",
                 "--out is the image {} being imported (through a link)", it.path);
  }
}

}  // namespace

FolderImportSummary import_folder(const std::string& out_path, const std::string& dir,
                                  const FolderImportOptions& o) {
  RN_CHECK_CTX(o.channels == 1 || o.channels == 3, "--channels", "{} channels: 1 (grey) or 3 (RGB)", o.channels);
  if (o.storage == Storage::raw)
    RN_CHECK_CTX(o.size >= 1 && o.size <= 65535, "--size", "a raw store needs --size S (1..65535), got {}", o.size);
  RN_CHECK_CTX(o.quality >= 1 && o.quality <= 100, "--quality", "{} not in 1..100", o.quality);
  RN_CHECK_CTX(o.max_side >= 0 && o.max_side <= 65500, "--max-side", "{} not in 0..65500", o.max_side);
  if (o.storage == Storage::jpeg && !have_jpeg_codec())
    RN_IO_FAIL(out_path, "rebuild with libturbojpeg (apt-get install libturbojpeg0-dev)",
               "a JPEG store needs the JPEG codec, which this build does not have");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    RN_IO_FAIL(dir, "pass the folder that holds train/<class>/ (and val/<class>/)",
               fs::exists(dir, ec) ? "not a directory" : "folder not found");
  const fs::path train_dir = fs::path(dir) / "train", val_dir = fs::path(dir) / "val";
  if (!fs::is_directory(train_dir, ec))
    RN_IO_FAIL(train_dir.string(), "an ImageFolder tree has DIR/train/<class>/*.jpg (and DIR/val/<class>/...)",
               "no train folder");

  FolderImportSummary sum;
  sum.classes = subfolders(train_dir, sum.other_files);
  // Before the class folders are walked (a listing of millions of folders takes long on a parallel file system).
  RN_CHECK_CTX(sum.classes.size() <= static_cast<std::size_t>(kMaxClasses), dir, "{} class folders: at most {}",
               sum.classes.size(), kMaxClasses);
  if (sum.classes.empty())
    RN_IO_FAIL(train_dir.string(), "put each class's images in a subfolder named after the class",
               "no class folders");
  std::vector<Item> items;
  std::int64_t total[2] = {0, 0};
  std::map<std::string, std::int32_t> label_of;
  for (std::size_t k = 0; k < sum.classes.size(); ++k) label_of[sum.classes[k]] = static_cast<std::int32_t>(k);
  auto add_split = [&](Split s, const fs::path& root, const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      const auto it = label_of.find(name);
      if (it == label_of.end())
        RN_IO_FAIL((root / name).string(), "every val class must also be a train class (labels come from train's folders)",
                   "class folder '{}' has no counterpart in '{}'", name, train_dir.string());
      const std::vector<ClassFile> files = class_files(root / name, sum.other_files);
      if (files.empty())
        RN_IO_FAIL((root / name).string(), "remove the folder or put the class's images into it",
                   "class folder holds no .jpg, .jpeg or .png files");
      for (const ClassFile& f : files) items.push_back({s, f.path, it->second, f.link});
      total[static_cast<int>(s)] += static_cast<std::int64_t>(files.size());
    }
  };
  add_split(Split::train, train_dir, sum.classes);
  if (fs::is_directory(val_dir, ec)) {
    sum.has_val = true;
    std::int64_t ignored = 0;
    add_split(Split::val, val_dir, subfolders(val_dir, ignored));
    sum.other_files += ignored;
  }
  refuse_output_in_tree(out_path, {train_dir, val_dir}, items);

  std::optional<DatasetWriter> writer;
  if (o.storage == Storage::raw)
    writer.emplace(out_path, o.size, o.size, o.channels, static_cast<int>(sum.classes.size()), o.writer);
  else
    writer.emplace(out_path, JpegStoreSpec{o.channels, o.quality, o.max_side}, static_cast<int>(sum.classes.size()),
                   o.writer);
  writer->set_class_names(sum.classes);

  // Workers process items in any order within a window ahead of the writer; the writer appends in item order.
  const int threads = std::max(1, o.threads > 0 ? o.threads : available_cpus());
  // Raw stores: the window's decoded samples also fit 1 GiB (at --size 10000, 300 MB each, 8 of them took 3 GB;
  // at --size 30000 a window would not fit the host): never fewer than one a worker and one being written.
  std::size_t window = static_cast<std::size_t>(std::max(8, 4 * threads));
  if (o.storage == Storage::raw) {
    const auto sample =
        static_cast<std::size_t>(o.size) * static_cast<std::size_t>(o.size) * static_cast<std::size_t>(o.channels);
    window = std::max(std::min(window, (std::size_t{1} << 30) / std::max<std::size_t>(sample, 1)),
                      static_cast<std::size_t>(threads) + 1);
  }
  std::vector<Result> results(window);
  std::mutex mutex;
  std::condition_variable cv;
  std::size_t next = 0, written = 0;  // next item to take; items written (results[i % window] is item i's)
  bool stop = false;
  auto worker = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      cv.wait(lock, [&] { return stop || next >= items.size() || next < written + window; });
      if (stop || next >= items.size()) return;
      const std::size_t i = next++;
      lock.unlock();
      Result r;
      try {
        process(items[i], o, r);
      } catch (const Error& e) {
        if (o.skip_bad) {
          r.bad = true;
          r.bad_reason = e.what();
        } else {
          r.error = std::current_exception();
        }
      } catch (const std::bad_alloc&) {
        // Every worker holds a decoded image (up to --max-pixels x channels bytes, and the resized copy): a folder of
        // large images can exhaust the host's memory. Not a bad image, so not skipped with --skip-bad.
        try {
          RN_IO_FAIL(items[i].path, "import with fewer --threads, or a lower --max-pixels (or --size)",
                     "out of memory while decoding or resizing it ({} worker threads)", threads);
        } catch (...) {
          r.error = std::current_exception();
        }
      } catch (...) {
        r.error = std::current_exception();
      }
      r.ready = true;
      lock.lock();
      results[i % window] = std::move(r);
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  struct Join {
    std::vector<std::thread>& pool;
    std::mutex& mutex;
    std::condition_variable& cv;
    bool& stop;
    ~Join() {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
      }
      cv.notify_all();
      for (std::thread& t : pool) t.join();
    }
  } join{pool, mutex, cv, stop};
  // After the guard: a thread that cannot start (EAGAIN) leaves the ones already started stopped and joined, not
  // joinable threads whose destruction called std::terminate.
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);

  std::int64_t done[2] = {0, 0};
  // Raw stores: samples are appended in runs (one HDF5 write per run instead of per image).
  std::vector<std::uint8_t> run_images;
  std::vector<std::int32_t> run_labels;
  Split run_split = Split::train;
  const std::size_t sample_bytes = static_cast<std::size_t>(o.size * o.size * o.channels);
  auto flush_run = [&] {
    if (run_labels.empty()) return;
    writer->append(run_split, run_images.data(), run_labels.data(), static_cast<std::int64_t>(run_labels.size()));
    run_images.clear();
    run_labels.clear();
  };
  for (std::size_t i = 0; i < items.size(); ++i) {
    Result r;
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return results[i % window].ready; });
      r = std::move(results[i % window]);
      results[i % window] = Result{};
      ++written;
      cv.notify_all();
    }
    if (r.error) std::rethrow_exception(r.error);
    const Item& it = items[i];
    const int si = static_cast<int>(it.split);
    ++done[si];
    if (r.bad) {
      ++sum.bad;
      if (sum.bad_examples.size() < 5) sum.bad_examples.push_back(r.bad_reason);
    } else if (o.storage == Storage::raw) {
      if (it.split != run_split || run_images.size() >= (std::size_t(16) << 20)) flush_run();
      run_split = it.split;
      try {
        run_images.insert(run_images.end(), r.pixels.begin(),
                          r.pixels.begin() + static_cast<std::ptrdiff_t>(sample_bytes));
      } catch (const std::bad_alloc&) {  // said as the workers say it: naming the image (it was a bare bad_alloc)
        RN_IO_FAIL(it.path, "import with a lower --size, or with more memory",
                   "out of memory while storing it ({} MB a sample at --size {})", sample_bytes >> 20, o.size);
      }
      run_labels.push_back(it.label);
    } else {
      writer->append_encoded(it.split, r.bytes.data(), static_cast<std::int64_t>(r.bytes.size()), r.height, r.width,
                             it.label, r.sums);  // val: no sums
      sum.stored_bytes += static_cast<std::int64_t>(r.bytes.size());
      (r.reencoded ? sum.reencoded : sum.kept) += 1;
    }
    if (done[si] == total[si]) flush_run();
    if (o.progress && (done[si] == total[si] || done[si] % 64 == 0)) o.progress({it.split, done[si], total[si]});
  }
  flush_run();
  sum.samples[0] = writer->count(Split::train);
  sum.samples[1] = writer->count(Split::val);
  if (sum.samples[0] == 0)
    RN_IO_FAIL(train_dir.string(), "no image of the train split could be read (see the skipped files)",
               "every train image was skipped");
  writer->finish();
  return sum;
}

}  // namespace renaissance::io
