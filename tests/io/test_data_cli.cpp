// `renaissance data ...` through the real executable: exit codes and messages as a user sees them.
#include "io_test_util.h"

#include <renaissance/io/dataset.h>
#include <renaissance/io/image.h>
#include <renaissance/io/importers.h>

#include <gmock/gmock.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <sstream>

namespace renaissance::io {
namespace {

using namespace renaissance::io::testing;
using ::testing::HasSubstr;

struct CliResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class DataCli : public ::testing::Test {
 protected:
  CliResult run(const std::string& args) {
    const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
    const std::string cmd = fmt::format("'{}' {} > '{}' 2> '{}'", RENAISSANCE_CLI, args, out, err);
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }
  /// The command must fail (exit != 0) with one clean error line naming `must_name`.
  CliResult expect_failure(const std::string& args, const std::string& must_name) {
    CliResult r = run(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_THAT(r.err, HasSubstr("renaissance: error: "));
    EXPECT_THAT(r.err, HasSubstr(must_name));
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("HDF5-DIAG"))) << "HDF5 printed its own error stack";
    return r;
  }
  TempDir dir;
};

TEST_F(DataCli, SyntheticThenInspect) {
  const std::string path = dir.file("syn.h5");
  CliResult r =
      run(fmt::format("data synthetic --out '{}' --train 300 --val 40 --shape 8,6,3 --classes 4 --seed 5", path));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("train 300, val 40"));

  r = run(fmt::format("data inspect '{}'", path));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("renaissance-dataset version 3"));
  EXPECT_THAT(r.out, HasSubstr("num_classes: 4"));
  EXPECT_THAT(r.out, HasSubstr("/train: images uint8 [300, 8, 6, 3], labels int32 [300]"));
  EXPECT_THAT(r.out, HasSubstr("/val: images uint8 [40, 8, 6, 3]"));
  EXPECT_THAT(r.out, HasSubstr("fletcher32"));
  EXPECT_THAT(r.out, HasSubstr("every chunk verified"));

  r = run(fmt::format("data inspect --json '{}'", path));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"valid\": true"));
  EXPECT_THAT(r.out, HasSubstr("\"train\": {\"count\": 300, \"shape\": [300, 8, 6, 3]"));
  EXPECT_THAT(r.out, HasSubstr("\"fletcher32\": true"));

  // Same seed, same bytes: the library reads both identically.
  const std::string again = dir.file("syn2.h5");
  ASSERT_EQ(
      run(fmt::format("data synthetic --out '{}' --train 300 --val 40 --shape 8,6,3 --classes 4 --seed 5", again)).rc,
      0);
  const DatasetFile a(path), b(again);
  std::vector<std::uint8_t> ia(300 * a.sample_bytes()), ib(ia.size());
  a.read(Split::train, 0, 300, ia.data(), nullptr);
  b.read(Split::train, 0, 300, ib.data(), nullptr);
  EXPECT_EQ(ia, ib);
}

TEST_F(DataCli, InspectJsonStaysValidUtf8ForAPathThatIsNot) {
  // A path (or class name) in Latin-1: its raw bytes went into the JSON, which strict UTF-8 readers reject. Bytes that
  // are not well-formed UTF-8 become U+FFFD; well-formed ones (here 'é') stay as they are.
  const std::string path = dir.file("caf\xc3\xa9-\xff.h5");
  ASSERT_EQ(run(fmt::format("data synthetic --out '{}' --train 8 --val 2 --shape 2,2,1 --classes 2", path)).rc, 0);
  const CliResult r = run(fmt::format("data inspect --json '{}'", path));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("caf\xc3\xa9-\\ufffd.h5"));
  EXPECT_EQ(r.out.find('\xff'), std::string::npos) << r.out;
}

TEST_F(DataCli, ImportIdx) {
  const std::vector<std::string> names = {"ti.gz", "tl.gz", "vi.gz", "vl.gz"};
  write_bytes(dir.file(names[0]), idx_images_bytes(30, 4, 4, 1), true);
  write_bytes(dir.file(names[1]), idx_labels_bytes(30, 3, 0), true);
  write_bytes(dir.file(names[2]), idx_images_bytes(6, 4, 4, 2), true);
  write_bytes(dir.file(names[3]), idx_labels_bytes(6, 3, 0), true);
  const std::string out = dir.file("idx.h5");
  const std::string args = fmt::format(
      "data import idx --train-images '{}' --train-labels '{}' --val-images '{}' --val-labels '{}' --classes 3 "
      "--out '{}'",
      dir.file(names[0]), dir.file(names[1]), dir.file(names[2]), dir.file(names[3]), out);
  CliResult r = run(args);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(DatasetFile(out).size(Split::train), 30);

  // Swapped labels/images of val: the message names the file and its magic number.
  const std::string bad = fmt::format(
      "data import idx --train-images '{}' --train-labels '{}' --val-images '{}' --val-labels '{}' --classes 3 "
      "--out '{}'",
      dir.file(names[0]), dir.file(names[1]), dir.file(names[3]), dir.file(names[2]), dir.file("bad.h5"));
  r = expect_failure(bad, dir.file(names[3]));
  EXPECT_THAT(r.err, HasSubstr("magic"));
  EXPECT_FALSE(fs::exists(dir.file("bad.h5")));
}

TEST_F(DataCli, InspectRejectsBadFiles) {
  expect_failure(fmt::format("data inspect '{}'", dir.file("missing.h5")), dir.file("missing.h5"));

  const std::string noth5 = dir.file("text.h5");
  std::ofstream(noth5) << "hello";
  expect_failure(fmt::format("data inspect '{}'", noth5), "not an HDF5 file");

  const std::string wrong = dir.file("wrong.h5");
  write_small(wrong);
  set_string_attr(wrong, "format", "something-else");
  expect_failure(fmt::format("data inspect '{}'", wrong), "format attribute is 'something-else'");

  const std::string labels = dir.file("labels.h5");
  write_small(labels);
  set_int_attr(labels, "num_classes", 4);
  delete_attr(labels, "class_names");
  CliResult r = expect_failure(fmt::format("data inspect '{}'", labels), "label 7 at index 1");
  EXPECT_THAT(r.err, HasSubstr(labels + ": dataset '/train/labels'"));
  r = expect_failure(fmt::format("data inspect --json '{}'", labels), "label 7 at index 1");
  EXPECT_THAT(r.out, HasSubstr("\"valid\": false"));

  const std::string corrupt = dir.file("corrupt.h5");
  write_small(corrupt);
  corrupt_chunk(corrupt, "/val/images", 1);
  r = expect_failure(fmt::format("data inspect '{}'", corrupt), corrupt + ": dataset '/val/images'");
  EXPECT_THAT(r.err, ::testing::ContainsRegex("[Cc]hecksum|Fletcher32"));
  EXPECT_THAT(r.err, HasSubstr("samples [7, 13) (chunk 1)"));
  EXPECT_EQ(run(fmt::format("data inspect --quick '{}'", corrupt)).rc, 0) << "--quick skips the image chunks";

  const std::string truncated = dir.file("truncated.h5");
  write_small(truncated);
  truncate_file(truncated, 0.5);
  expect_failure(fmt::format("data inspect '{}'", truncated), "truncated");

  // A class count no writer makes (2^20 is the most): inspect built and printed a table of 10^8 zeros (3.7 GB).
  const std::string classes = dir.file("classes.h5");
  write_small(classes);
  delete_attr(classes, "class_names");
  set_int_attr(classes, "num_classes", 100000000);
  expect_failure(fmt::format("data inspect --quick '{}'", classes), "attribute 'num_classes' = 100000000");
}

TEST_F(DataCli, InspectCountsTheClassesWithoutSamplesOfALargeLabelSet) {
  const std::string path = dir.file("many.h5");
  SmallSpec many;
  many.classes = 5000;
  write_small(path, many);
  const CliResult r = run(fmt::format("data inspect --quick '{}'", path));
  ASSERT_EQ(r.rc, 0) << r.err;
  // write_small's 50 train samples take a few of the 5,000 classes: those are listed, the rest counted.
  const auto train = r.out.substr(r.out.find("/train:"));
  const auto line =
      train.substr(train.find("labels:"), train.find('\n', train.find("labels:")) - train.find("labels:"));
  EXPECT_THAT(line, ::testing::ContainsRegex(" of 5000 classes without samples$")) << line;
  EXPECT_THAT(line, ::testing::Not(HasSubstr(": 0,"))) << line;
  EXPECT_LT(line.size(), 2000u) << line;
}

TEST_F(DataCli, UsageErrors) {
  CliResult r =
      run(fmt::format("data synthetic --out '{}' --train 5 --val 1 --shape 8,8 --classes 2", dir.file("x.h5")));
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.err, HasSubstr("--shape"));
  r = run(fmt::format("data import fashion-mnist --out '{}' --src '{}'", dir.file("x.h5"), dir.file("none")));
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.err, HasSubstr(dir.file("none")));
  EXPECT_NE(run("data").rc, 0);
}

TEST_F(DataCli, BenchDecodeOnTheCpu) {
  // `data bench-decode --device cpu`: the CPU loader's img/s on a JPEG store, whole images and (random-resized crops
  // in a build with partial JPEG decoding) only each crop's box; --device gpu without a GPU is a clear error.
  if (!have_jpeg_codec()) GTEST_SKIP() << "built without libturbojpeg";
  const std::string store = dir.file("j.h5");
  {
    DatasetWriter w(store, JpegStoreSpec{3, 90, 0}, 2, {});
    for (int i = 0; i < 12; ++i) {
      const std::int64_t h = 40 + 3 * i, wd = 56 - 2 * i;
      std::vector<std::uint8_t> px(static_cast<std::size_t>(h * wd * 3));
      for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>((k * 7 + i * 31 + (k / 97) * 5) & 0xff);
      const std::vector<std::uint8_t> j = encode_jpeg(px.data(), h, wd, 3, 90, "t");
      w.append_encoded(i < 10 ? Split::train : Split::val, j.data(), static_cast<std::int64_t>(j.size()), h, wd, i % 2,
                       px.data());
    }
    w.finish();
  }
  const std::string args = fmt::format("data bench-decode '{}' --device cpu --passes 1 --batch 4 --size 24 --json", store);
  CliResult r = run(args);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"device\": \"cpu\", \"images\": 10"));
  auto field = [](const std::string& json, const std::string& key) {
    const auto at = json.find("\"" + key + "\": ");
    return at == std::string::npos ? -1.0 : std::stod(json.substr(at + key.size() + 4));
  };
  EXPECT_GT(field(r.out, "read_img_s"), 0);
  EXPECT_GT(field(r.out, "decode_render_img_s"), 0);
  EXPECT_EQ(field(r.out, "box_decode_render_img_s") > 0, have_region_decode()) << r.out;
  r = run(args + " --crop center");  // a centre crop reads the whole image: no box figure
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(field(r.out, "box_decode_render_img_s"), 0);
  r = run(fmt::format("data bench-decode '{}' --device cpu --passes 1", store));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("read + decode + render 224x224 (random-resized, flip)"));
  r = run(fmt::format("data bench-decode '{}' --device tpu", store));
  EXPECT_EQ(r.rc, 2);  // a usage error
  EXPECT_THAT(r.err, HasSubstr("--device: tpu not in {gpu,cpu}"));
}

TEST_F(DataCli, ImportFashionMnist) {
  if (!fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not found in " << kFashionMnistDir;
  const std::string out = dir.file("fm.h5");
  CliResult r = run(fmt::format("data import fashion-mnist --out '{}'", out));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("train 60000, val 10000 samples of 28x28x1, 10 classes"));
  r = run(fmt::format("data inspect '{}'", out));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Ankle boot"));
  EXPECT_THAT(r.out, HasSubstr("9 (Ankle boot): 6000"));
}

// An import interrupted by Ctrl-C, a kill or a hang-up removes the temporary it was writing and still dies of the
// signal (the shell's and the launcher's view of it unchanged): it stayed, as large as the written part of the
// dataset, until the next write of the same file. An ignored signal stays ignored: under nohup the import finishes.
TEST_F(DataCli, AnInterruptedWriteLeavesNoTemporary) {
  auto start = [&](const std::string& out, int ignored) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (ignored) std::signal(ignored, SIG_IGN);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::execl(RENAISSANCE_CLI, RENAISSANCE_CLI, "data", "synthetic", "--out", out.c_str(), "--train", "200000", "--val",
              "100", "--shape", "28,28,1", "--classes", "10", "--seed", "5", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  };
  auto temporaries = [&](const std::string& of) {  // "<of>.tmp-<host>-<pid>"
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().filename().string().rfind(fs::path(of).filename().string() + ".tmp-", 0) == 0) ++n;
    return n;
  };
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const std::string out = dir.file(fmt::format("sig{}.h5", sig));
    const pid_t pid = start(out, 0);
    ASSERT_GT(pid, 0);
    // Once the temporary exists (the write has begun): the signal.
    bool begun = false;
    for (int i = 0; i < 20000 && !begun; ++i) {
      begun = temporaries(out) > 0;
      if (!begun) ::usleep(500);
    }
    ASSERT_TRUE(begun) << "signal " << sig << ": no temporary appeared";
    ASSERT_EQ(::kill(pid, sig), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status)) {  // it finished before the signal came: nothing to show for this signal
      ADD_FAILURE() << "signal " << sig << ": the write finished first (exit " << WEXITSTATUS(status) << ")";
      continue;
    }
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_EQ(temporaries(out), 0) << "signal " << sig << " left the temporary";
    EXPECT_FALSE(fs::exists(out)) << "signal " << sig;
  }
  const std::string out = dir.file("nohup.h5");
  const pid_t pid = start(out, SIGHUP);
  for (int i = 0; i < 20000 && temporaries(out) == 0; ++i) ::usleep(500);
  ::kill(pid, SIGHUP);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_TRUE(fs::exists(out));
  EXPECT_EQ(temporaries(out), 0);
}

}  // namespace
}  // namespace renaissance::io
