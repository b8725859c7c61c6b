// libFuzzer target: the CIFAR importer's tarball reader (io::read_tar_members: gzip through io::GzipReader, tar
// headers, GNU long names, pax records, link and duplicate checks) on the input as a file, then the members it
// returns read as CIFAR batches, as import_cifar does. Every input must end in members or a renaissance::Error: no
// crash, no hang, no unbounded allocation (members are bounded to 1 GiB in all; -rss_limit_mb catches more).
#include "fuzz_util.h"

#include <renaissance/io/gzip_reader.h>
#include <renaissance/io/importers.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace renaissance;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fuzz::input_file(data, size, ".tar.gz");
  fuzz::expect_clean(
      [&] {
        const auto members = io::read_tar_members(path, {"data_batch_1", "test_batch", "batches.meta"});
        for (const auto& [name, bytes] : members)
          (void)io::read_cifar_batch(bytes.data(), bytes.size(), name, "labels", 10);
      },
      "fuzz_tar");
  // The gzip reader alone, in odd-sized requests (every boundary case of a member's end).
  fuzz::expect_clean(
      [&] {
        io::GzipReader r(path);
        std::vector<std::uint8_t> buf(4099);
        for (std::size_t k = 1; r.read(buf.data(), static_cast<std::int64_t>(1 + k % buf.size()), "fuzz") > 0;
             k = k * 7 + 3)
          if (r.offset() > (std::int64_t(64) << 20)) break;  // a gzip bomb: the reader is not what bounds it
      },
      "fuzz_tar");
  return 0;
}
