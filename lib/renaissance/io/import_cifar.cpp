// `renaissance data import cifar10|cifar100`: the python-pickle tarballs of https://www.cs.toronto.edu/~kriz/cifar.html.
#include <renaissance/core/error.h>
#include <renaissance/core/utf8.h>
#include <renaissance/io/gzip_reader.h>
#include <renaissance/io/hdf5_util.h>
#include <renaissance/io/importers.h>
#include <renaissance/io/pickle.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

namespace renaissance::io {

namespace fs = std::filesystem;

namespace {

// A CIFAR batch is 31 MB (Python 2) to 46 MB (latin-1 str), CIFAR-100's train member 5 times that; the members
// wanted are held together (CIFAR-10: six batches), so the budget is for all of them (7 members of 1 GiB each were
// allowed).
constexpr std::int64_t kMaxMembers = std::int64_t(1) << 30;

/// The records of a pax extended header ("LEN key=value\n" each, POSIX.1-2001): `path` and `size` of a per-file
/// header ('x') apply to the next member, as tar applies them; a global header ('g') that sets either is refused
/// (it would rename or resize every member after it), its other keys (times, owners, charset) are ignored.
void read_pax(const std::string& path, const std::string& member, const std::vector<std::uint8_t>& data, bool global,
              std::optional<std::string>& pax_path, std::optional<std::int64_t>& pax_size) {
  const std::string text(data.begin(), data.end());
  std::size_t at = 0;
  while (at < text.size() && text[at] != '\0') {
    const std::size_t space = text.find(' ', at);
    std::size_t len = 0;
    bool ok = space != std::string::npos && space > at && space - at <= 12;
    for (std::size_t i = at; ok && i < space; ++i) {
      ok = text[i] >= '0' && text[i] <= '9';
      len = len * 10 + static_cast<std::size_t>(text[i] - '0');
    }
    ok = ok && len > space - at + 2 && len <= text.size() - at && text[at + len - 1] == '\n';
    const std::size_t eq = ok ? text.find('=', space + 1) : std::string::npos;
    if (!ok || eq == std::string::npos || eq >= at + len)
      RN_IO_FAIL(path, "the archive is corrupt", "pax header '{}': malformed record at byte {} of it", member, at);
    const std::string key = text.substr(space + 1, eq - space - 1);
    const std::string value = text.substr(eq + 1, at + len - 1 - (eq + 1));
    at += len;
    if (key != "path" && key != "size") continue;
    if (global)
      RN_IO_FAIL(path, "make a tarball without global pax headers (extract it and pack it again)",
                 "global pax header '{}' sets '{}' for every member after it", member, key);
    if (key == "path") {
      pax_path = value;
    } else {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE || v > (1ULL << 40) || value[0] == '-')
        RN_IO_FAIL(path, "the archive is corrupt", "pax header '{}': size '{}' is not a size of at most 2^40 bytes",
                   member, value);
      pax_size = static_cast<std::int64_t>(v);
    }
  }
}

[[noreturn]] void bad(const std::string& ctx, const std::string& what) {
  RN_IO_FAIL(ctx, "the member is not a CIFAR python batch (a dict with 'data' uint8 [N, 3072] and the labels)", "{}",
             what);
}

/// numpy's pickled uint8 array: numpy.core.multiarray._reconstruct + BUILD (version, shape, dtype, fortran, data)
/// (protocols 0-4), or numpy.core.numeric._frombuffer(bytes, dtype, shape, order) (protocol 5, the bytes in band).
std::string array_bytes(const pickle::Value& v, const std::string& ctx, std::int64_t& rows, std::int64_t& cols) {
  using K = pickle::Value::Kind;
  const bool is_object = v.is(K::object) && v.callable && v.callable->is(K::global);
  const bool reconstruct = is_object && (v.callable->s == "numpy.core.multiarray._reconstruct" ||
                                         v.callable->s == "numpy._core.multiarray._reconstruct");
  const bool frombuffer = is_object && (v.callable->s == "numpy.core.numeric._frombuffer" ||
                                        v.callable->s == "numpy._core.numeric._frombuffer");
  if (!reconstruct && !frombuffer)
    bad(ctx, fmt::format("'data' is a {}, not a numpy array", pickle::kind_name(v.kind)));
  // The parts, wherever each form keeps them.
  const pickle::Value *shape_v = nullptr, *dtype_v = nullptr, *order_v = nullptr, *data_v = nullptr;
  if (reconstruct) {
    if (!v.state || !v.state->is(K::tuple) || v.state->items.size() != 5) bad(ctx, "'data' has no array state");
    const auto& st = v.state->items;
    shape_v = st[1];
    dtype_v = st[2];
    order_v = st[3];
    data_v = st[4];
  } else {
    if (!v.args || !v.args->is(K::tuple) || v.args->items.size() != 4) bad(ctx, "'data' has no buffer arguments");
    const auto& a = v.args->items;
    data_v = a[0];
    dtype_v = a[1];
    shape_v = a[2];
    order_v = a[3];
  }
  const pickle::Value& shape = *shape_v;
  if (!shape.is(K::tuple) || shape.items.size() != 2 || !shape.items[0]->is(K::integer) || !shape.items[1]->is(K::integer))
    bad(ctx, "'data' is not a 2-D array");
  rows = shape.items[0]->i;
  cols = shape.items[1]->i;
  const pickle::Value& dtype = *dtype_v;
  const bool u1 = dtype.is(K::object) && dtype.args && !dtype.args->items.empty() &&
                  (dtype.args->items[0]->text_equals("u1") || dtype.args->items[0]->text_equals("|u1"));
  if (!u1) bad(ctx, "'data' is not uint8");
  if (order_v->is(K::boolean) || order_v->is(K::integer)) {
    if (order_v->i != 0) bad(ctx, "'data' is in Fortran order");
  } else if (order_v->is(K::str) && order_v->s != "C") {
    bad(ctx, fmt::format("'data' is in order '{}', not C", order_v->s));
  }
  std::string bytes;
  if (!pickle::as_bytes(*data_v, bytes)) bad(ctx, "'data' holds no raw bytes");
  // rows x cols compared without forming the product (a claim of 2^54 rows wrapped to the byte count).
  if (rows < 0 || cols <= 0 || rows > static_cast<std::int64_t>(bytes.size()) / cols ||
      static_cast<std::int64_t>(bytes.size()) != rows * cols)
    bad(ctx, fmt::format("'data' claims {} x {} but holds {} bytes", rows, cols, bytes.size()));
  return bytes;
}

}  // namespace

CifarBatch read_cifar_batch(const std::uint8_t* data, std::size_t size, const std::string& ctx, const char* label_key,
                            int classes) {
  using K = pickle::Value::Kind;
  const pickle::Document doc = pickle::load(data, size, ctx);
  const pickle::Value& root = doc.root();
  if (!root.is(K::dict)) bad(ctx, fmt::format("the pickle holds a {}, not a dict", pickle::kind_name(root.kind)));
  for (const char* key : {"data", label_key})
    if (root.count(key) > 1) bad(ctx, fmt::format("the key '{}' is set {} times", key, root.count(key)));
  const pickle::Value* d = root.get("data");
  const pickle::Value* l = root.get(label_key);
  if (!d) bad(ctx, "no 'data' key");
  if (!l) bad(ctx, fmt::format("no '{}' key", label_key));
  std::int64_t rows = 0, cols = 0;
  const std::string bytes = array_bytes(*d, ctx, rows, cols);
  if (cols != 3072) bad(ctx, fmt::format("rows of {} bytes, expected 3072 (32 x 32 x 3)", cols));
  if (!l->is(K::list) || static_cast<std::int64_t>(l->items.size()) != rows)
    bad(ctx, fmt::format("'{}' is not a list of {} labels", label_key, rows));
  CifarBatch b;
  b.labels.resize(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    const pickle::Value& v = *l->items[static_cast<std::size_t>(i)];
    if (!v.is(K::integer) || v.i < 0 || v.i >= classes)
      RN_IO_FAIL(ctx, "the member does not belong to this CIFAR variant (cifar10: 10 classes, cifar100: 100, coarse: 20)",
                 "label {} of sample {} is not in [0, {})", v.is(K::integer) ? std::to_string(v.i) : pickle::kind_name(v.kind), i,
                 classes);
    b.labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v.i);
  }
  // Rows hold the red plane, then green, then blue (1024 bytes each, row-major 32 x 32): to HWC.
  b.hwc.resize(bytes.size());
  for (std::int64_t n = 0; n < rows; ++n) {
    const auto* src = reinterpret_cast<const std::uint8_t*>(bytes.data()) + n * 3072;
    std::uint8_t* dst = b.hwc.data() + n * 3072;
    for (int p = 0; p < 1024; ++p)
      for (int c = 0; c < 3; ++c) dst[p * 3 + c] = src[c * 1024 + p];
  }
  return b;
}

namespace {

std::vector<std::string> names_of(const std::string& tarball, const std::string& member,
                                  const std::vector<std::uint8_t>& data, const char* key, std::size_t expect) {
  const std::string ctx = tarball + ": " + member;
  const pickle::Document doc = pickle::load(data.data(), data.size(), ctx);
  if (doc.root().count(key) > 1)
    RN_IO_FAIL(ctx, "the meta member is not CIFAR's", "the key '{}' is set {} times", key, doc.root().count(key));
  const pickle::Value* v = doc.root().get(key);
  if (!v || !v->is(pickle::Value::Kind::list) || v->items.size() != expect)
    RN_IO_FAIL(ctx, "the meta member is not CIFAR's", "no list '{}' of {} class names", key, expect);
  std::vector<std::string> names;
  for (const auto& n : v->items) {
    std::string s;
    if (!n->is(pickle::Value::Kind::str) && !pickle::as_bytes(*n, s))
      RN_IO_FAIL(ctx, "the meta member is not CIFAR's", "a class name in '{}' is a {}", key, pickle::kind_name(n->kind));
    std::string name = n->is(pickle::Value::Kind::str) ? n->s : s;
    if (name.find('\0') != std::string::npos || !valid_utf8(name))
      RN_IO_FAIL(ctx, "the meta member is not CIFAR's (its class names are ASCII words)",
                 "class name {} of '{}' is not UTF-8 text without NUL bytes", names.size(), key);
    names.push_back(std::move(name));
  }
  return names;
}

}  // namespace

std::map<std::string, std::vector<std::uint8_t>> read_tar_members(const std::string& path,
                                                                  const std::vector<std::string>& wanted) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    RN_IO_FAIL(
        path,
        "download cifar-10-python.tar.gz / cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html",
        "tarball not found");
  if (fs::is_directory(path, ec)) RN_IO_FAIL(path, "pass the .tar.gz file itself", "is a directory");
  // GzipReader: the gzip trailer (CRC-32, length) is checked before the data counts as ended (gzread did not always).
  GzipReader reader(path);
  std::int64_t offset = 0, held = 0;  // held: bytes of the members read so far
  std::map<std::string, std::vector<std::uint8_t>> out;
  std::map<std::string, std::string> taken_from;  // base name -> the member's whole name
  std::string long_name;
  std::optional<std::string> pax_path;  // the next member's name and size from its pax header
  std::optional<std::int64_t> pax_size;
  for (;;) {
    unsigned char h[512];
    const std::int64_t got = reader.read(h, 512, "a tar header");
    if (got == 0) break;  // end without the two zero blocks: accepted (as tar does)
    if (got < 512)
      RN_IO_FAIL(path, "the file is truncated; download it again", "truncated tar header at byte {}", offset);
    offset += 512;
    if (std::all_of(h, h + 512, [](unsigned char c) { return c == 0; })) {  // end of archive
      // The rest of the stream (tar's padding to its record size, or more) is read to its end so that zlib checks
      // the gzip trailer: the CRC-32 covers the members read above. Bounded like the members.
      std::vector<std::uint8_t> rest(1 << 16);
      std::int64_t after = 0;
      for (std::int64_t k;
           (k = reader.read(rest.data(), static_cast<std::int64_t>(rest.size()), "the end of the archive")) > 0;) {
        after += k;
        if (after > kMaxMembers)
          RN_IO_FAIL(path, "the archive is not a CIFAR tarball", "more than {} bytes after the end of the archive",
                     kMaxMembers);
      }
      break;
    }
    // Header checksum: the sum of the header's bytes with the checksum field as spaces.
    unsigned sum = 0;
    for (int i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    const std::string chk(reinterpret_cast<char*>(h + 148), 8);
    if (std::strtoul(chk.c_str(), nullptr, 8) != sum)
      RN_IO_FAIL(path, "this is not a tar archive, or it is corrupt", "bad tar header checksum at byte {}",
                 offset - 512);
    std::int64_t size = 0;
    if (h[124] & 0x80) {  // GNU base-256 size (checked before each shift: 11 bytes would overflow 64 bits)
      for (int i = 125; i < 136 && size <= (std::int64_t(1) << 40); ++i) size = (size << 8) | h[i];
    } else {
      const std::string sz(reinterpret_cast<char*>(h + 124), 12);
      size = static_cast<std::int64_t>(std::strtoull(sz.c_str(), nullptr, 8));
    }
    if (size < 0 || size > (std::int64_t(1) << 40))
      RN_IO_FAIL(path, "the archive is corrupt", "tar member at byte {} claims {} bytes", offset - 512, size);
    std::string name(reinterpret_cast<char*>(h), strnlen(reinterpret_cast<char*>(h), 100));
    if (std::memcmp(h + 257, "ustar", 5) == 0 && h[345]) {
      const std::string prefix(reinterpret_cast<char*>(h + 345), strnlen(reinterpret_cast<char*>(h + 345), 155));
      name = prefix + "/" + name;
    }
    const char type = static_cast<char>(h[156]);
    // Headers that describe the next member: GNU long names ('L', 'K') and pax extended headers ('x', 'g'). What they
    // set waits for the next header that is none of these, as tar applies it (a pax path beats a long name).
    const bool meta = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    if (!meta) {
      if (!long_name.empty()) name = long_name;
      if (pax_path) name = *pax_path;
      if (pax_size) size = *pax_size;
      long_name.clear();
      pax_path.reset();
      pax_size.reset();
    }
    // Links, devices, directories and FIFOs have no data in the archive (tar reads none whatever their size field
    // says): one claiming some would make this reader skip bytes tar reads as the next headers.
    if (type >= '1' && type <= '6' && size != 0)
      RN_IO_FAIL(path, "the archive is corrupt or crafted (extract it with tar and pack it again)",
                 "member '{}' (tar type '{}': a link, a device, a directory or a FIFO) claims {} bytes of data", name,
                 type, size);
    const std::int64_t padded = (size + 511) / 512 * 512;
    // A name ending in '/' names a directory (tar makes one); its base name is what precedes the slashes.
    std::string stripped = name;
    while (stripped.size() > 1 && stripped.back() == '/') stripped.pop_back();
    const bool dir_name = stripped.size() != name.size();
    const std::string base = fs::path(stripped).filename().string();
    const bool named = !meta && std::find(wanted.begin(), wanted.end(), base) != wanted.end();
    // Two members of one base name (a second copy appended, as `tar -r` does, a link of that name added later, or a
    // decoy in another folder): tar would extract the last, a reader of the first another batch: which one is meant
    // is not for the importer to guess.
    if (named && taken_from.count(base))
      RN_IO_FAIL(path, "make a tarball with one member of each name (extract it and pack it again)",
                 "the archive has two members named '{}': '{}' and '{}'", base, taken_from[base], name);
    if (named) taken_from[base] = name;
    if (named && ((type != '0' && type != '\0') || dir_name))
      RN_IO_FAIL(
          path, "make a tarball whose batches are regular files (extract it and pack it again)",
          "member '{}' is not a regular file (tar type '{}'{}: a link, a directory or a device)", name,
          type >= 32 && type < 127 ? std::string(1, type) : fmt::format("\\x{:02x}", static_cast<unsigned char>(type)),
          dir_name ? ", a name ending in '/'" : "");
    const bool header_data = type == 'L' || type == 'x' || type == 'g';  // a long name or pax records
    if (header_data || named) {
      if (size > kMaxMembers - held)
        RN_IO_FAIL(path, "the archive is not a CIFAR tarball",
                   "member '{}' has {} bytes ({} held already; {} in all "
                   "are accepted)",
                   name, size, held, kMaxMembers);
      if (named) held += size;  // only the members' bytes stay held
      std::vector<std::uint8_t> data(static_cast<std::size_t>(size));
      if (reader.read(data.data(), size, "'" + name + "'") < size)
        RN_IO_FAIL(path, "the file is truncated (an interrupted download?); download it again",
                   "member '{}' ends after byte {} (uncompressed): {} bytes expected", name, offset, size);
      std::vector<std::uint8_t> pad(static_cast<std::size_t>(padded - size));
      reader.read(pad.data(), padded - size, "padding");
      offset += padded;
      if (type == 'L')  // (an empty one has no data(): strnlen(nullptr, 0) is undefined; found by fuzz_tar)
        long_name = data.empty() ? std::string()
                                 : std::string(reinterpret_cast<char*>(data.data()),
                                               strnlen(reinterpret_cast<char*>(data.data()), data.size()));
      else if (type == 'x' || type == 'g')
        read_pax(path, name, data, type == 'g', pax_path, pax_size);
      else
        out[base] = std::move(data);
    } else {
      std::vector<std::uint8_t> skip(1 << 16);
      for (std::int64_t left = padded; left > 0;) {
        const std::int64_t n = std::min<std::int64_t>(left, static_cast<std::int64_t>(skip.size()));
        if (reader.read(skip.data(), n, "'" + name + "'") < n)
          RN_IO_FAIL(path, "the file is truncated; download it again", "member '{}' is truncated", name);
        left -= n;
      }
      offset += padded;
    }
  }
  return out;
}

void import_cifar(const std::string& out_path, const std::string& tarball, int classes, bool coarse,
                  const DatasetWriterOptions& options) {
  RN_CHECK_CTX(classes == 10 || classes == 100, tarball, "CIFAR has 10 or 100 classes, not {}", classes);
  RN_CHECK_CTX(!coarse || classes == 100, tarball, "coarse labels exist in CIFAR-100 only");
  const bool c10 = classes == 10;
  const std::vector<std::string> train_members =
      c10 ? std::vector<std::string>{"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"}
          : std::vector<std::string>{"train"};
  const std::string test_member = c10 ? "test_batch" : "test", meta_member = c10 ? "batches.meta" : "meta";
  std::vector<std::string> wanted = train_members;
  wanted.push_back(test_member);
  wanted.push_back(meta_member);
  const auto members = read_tar_members(tarball, wanted);
  for (const std::string& m : train_members)
    if (!members.count(m))
      RN_IO_FAIL(tarball, fmt::format("expected the CIFAR-{} python tarball ({})", classes,
                                      c10 ? "cifar-10-python.tar.gz" : "cifar-100-python.tar.gz"),
                 "the archive has no member '{}'", m);
  if (!members.count(test_member))
    RN_IO_FAIL(tarball, "expected the CIFAR python tarball", "the archive has no member '{}'", test_member);
  const char* label_key = c10 ? "labels" : (coarse ? "coarse_labels" : "fine_labels");
  const int k = coarse ? 20 : classes;
  DatasetWriter writer(out_path, 32, 32, 3, k, options);
  if (members.count(meta_member))
    writer.set_class_names(names_of(tarball, meta_member, members.at(meta_member),
                                    c10 ? "label_names" : (coarse ? "coarse_label_names" : "fine_label_names"),
                                    static_cast<std::size_t>(k)));
  std::int64_t train_samples = 0;
  for (const std::string& m : train_members) {
    const std::vector<std::uint8_t>& data = members.at(m);
    const CifarBatch b = read_cifar_batch(data.data(), data.size(), tarball + ": " + m, label_key, k);
    writer.append(Split::train, b.hwc.data(), b.labels.data(), static_cast<std::int64_t>(b.labels.size()));
    train_samples += static_cast<std::int64_t>(b.labels.size());
  }
  if (train_samples == 0)
    RN_IO_FAIL(tarball, "expected the CIFAR python tarball", "its train batches ({}) hold no samples",
               fmt::join(train_members, ", "));
  const std::vector<std::uint8_t>& test = members.at(test_member);
  const CifarBatch t = read_cifar_batch(test.data(), test.size(), tarball + ": " + test_member, label_key, k);
  writer.append(Split::val, t.hwc.data(), t.labels.data(), static_cast<std::int64_t>(t.labels.size()));
  writer.finish();
}

}  // namespace renaissance::io
