// Issue 13, class 6 (the single-process faults; the MPI ones are tests/dist/dp_test.sh startup-*, finalize-stop,
// sigterm-mpirun, data-differs). A full disk during any write (--save, a checkpoint, the preemption checkpoint, a
// dataset) exits with the documented code (1, or 75 for a preemption) and a message naming the file, never a
// crash (HDF5's exit handler used to SIGSEGV on the half-closed file), and the previous file stays. SIGPIPE on
// stdout does not kill a run.
//
// The full disk is a real one where this process may mount (root with CAP_SYS_ADMIN): a tmpfs of a few MB, filled
// up to a few KB. Elsewhere it is a file-size limit (prlimit --fsize, RLIMIT_FSIZE: write(2) fails with EFBIG).
#include "hardening_util.h"

#include <renaissance/io/checkpoint.h>
#include <renaissance/io/weights.h>

#include <sys/mount.h>
#include <sys/statvfs.h>

namespace {

using namespace hardening;

/// A small disk: `dir()` is where the outputs go, `limited()` the prefix of a command line that must fail writing.
class SmallDisk {
 public:
  explicit SmallDisk(const fs::path& dir) : m_dir(dir) {
    fs::create_directories(dir);
    // RENAISSANCE_TEST_NO_MOUNT=1 tries the file-size-limit variant where mounting would work.
    m_tmpfs = !std::getenv("RENAISSANCE_TEST_NO_MOUNT") && ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=4m") == 0;
  }
  ~SmallDisk() {
    if (m_tmpfs) ::umount2(m_dir.c_str(), MNT_DETACH);
  }
  const fs::path& dir() const { return m_dir; }
  bool tmpfs() const { return m_tmpfs; }
  /// Leaves `free_kb` free (tmpfs) and returns the prefix under which writes beyond that fail.
  std::string fill(std::uint64_t free_kb) const {
    if (!m_tmpfs) return "prlimit --fsize=" + std::to_string(free_kb * 1024) + " ";
    struct statvfs v {};
    ::statvfs(m_dir.c_str(), &v);
    const std::uint64_t avail = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
    if (avail > free_kb * 1024) {
      std::ofstream f(m_dir / ".filler", std::ios::binary | std::ios::app);
      const std::vector<char> block(static_cast<std::size_t>(avail - free_kb * 1024), 'x');
      f.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
    return "";
  }
  std::vector<std::string> temporaries() const {
    std::vector<std::string> t;
    for (const auto& e : fs::recursive_directory_iterator(m_dir))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) t.push_back(e.path().string());
    return t;
  }

 private:
  fs::path m_dir;
  bool m_tmpfs = false;
};

const char* kDiskFull[] = {"no space left on device", "file too large"};

void expect_disk_full(const CliResult& r, const std::string& file, int code = 1) {
  EXPECT_EQ(r.code, code) << r.out;
  EXPECT_TRUE(r.out.find(kDiskFull[0]) != std::string::npos || r.out.find(kDiskFull[1]) != std::string::npos) << r.out;
  EXPECT_NE(r.out.find(file), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << r.out;
}

}  // namespace

TEST(HardeningFaults, AFullDiskDuringSaveIsACleanErrorAndThePreviousFileStays) {
  const fs::path d = temp_dir();
  SmallDisk disk(d / "disk");
  const fs::path w = disk.dir() / "w.h5";
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32 --save " + w.string();
  ASSERT_EQ(run(train).code, 0);
  const std::string before = read_text(w);
  // Past the start-up's check of the free space (the disk fills during the run).
  const CliResult r =
      run_shell("RENAISSANCE_SPACE_CHECK=off exec " + disk.fill(64) + cli() + " " + train + " --seed 9");
  expect_disk_full(r, w.string());
  EXPECT_TRUE(read_text(w) == before) << "the previous weights were damaged";
  EXPECT_NO_THROW(renaissance::io::read_weights(w.string()));
  EXPECT_TRUE(disk.temporaries().empty()) << disk.temporaries().front();
}

// A disk that is already too full for the run's outputs is refused once the plan says how large they are, before the
// first step (the run trained to its first checkpoint, or to its end for --save, and then failed).
TEST(HardeningFaults, ADiskWithoutRoomForTheOutputsIsRefusedBeforeTraining) {
  const fs::path d = temp_dir();
  SmallDisk disk(d / "disk");
  if (!disk.tmpfs()) GTEST_SKIP() << "no tmpfs could be mounted here (a file-size limit does not show as free space)";
  const std::string ck = (disk.dir() / "ck").string(), w = (disk.dir() / "w.h5").string();
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32 ";
  // fmnist_cnn: ~0.7 MB of checkpoint tensors, 0.35 MB of weights, 0.5 MiB each for the rest. Three epochs keep
  // --keep 2 checkpoints and write a third (4.3 MiB with the weights); --keep 1, or one epoch (a checkpoint at its
  // end and one more at most), two (3.3 MiB of the 4).
  const std::string three_epochs = "train --data " + tiny_data() + " --epochs 3 --batch 32 ";
  const CliResult three = run(three_epochs + "--checkpoint-dir " + ck + " --save " + w);
  EXPECT_CLEAN_ERROR(three, w + ": --save and --checkpoint-dir need about 4.");
  EXPECT_EQ(run(three_epochs + "--checkpoint-dir " + ck + "-keep1 --keep 1 --save " + w).code, 0);
  fs::remove_all(ck + "-keep1");
  ASSERT_EQ(run(train + "--checkpoint-dir " + ck + " --save " + w).code, 0);
  const std::string before = read_text(w);
  disk.fill(64);
  for (const std::string& out : {"--checkpoint-dir " + ck + "2", "--save " + w}) {
    const CliResult r = run(train + out);
    SCOPED_TRACE(out);
    EXPECT_CLEAN_ERROR(r, out.substr(out.find(' ') + 1) + ": " + out.substr(0, out.find(' ')) + " needs about",
                       "MiB are free: make room before training", "RENAISSANCE_SPACE_CHECK=off");
    EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << "refused before the first step\n" << r.out;
  }
  // Through a symbolic link on another file system: the room of the file system the weights will be written to.
  fs::create_symlink(w, d / "wlink.h5");
  EXPECT_CLEAN_ERROR(run(train + "--save " + (d / "wlink.h5").string()),
                     (d / "wlink.h5").string() + ": --save needs about");
  EXPECT_EQ(read_text(w), before);
  EXPECT_NO_THROW(renaissance::io::read_checkpoint(ck + "/latest.h5"));
  // With the check off the run trains, and its write fails as before.
  const CliResult off = run_shell("RENAISSANCE_SPACE_CHECK=off exec " + cli() + " " + train + "--save " + w);
  expect_disk_full(off, w);
  EXPECT_NE(off.out.find("epoch 1/"), std::string::npos) << off.out;
  EXPECT_EQ(read_text(w), before);
}

TEST(HardeningFaults, AFullDiskDuringACheckpointKeepsThePreviousOneAndAPreemptionStillExits75) {
  const fs::path d = temp_dir();
  SmallDisk disk(d / "disk");
  const std::string ck = (disk.dir() / "ck").string();
  const std::string train = "train --data " + tiny_data() + " --epochs 3 --batch 32 --checkpoint-every 3 --checkpoint-dir " + ck;
  ASSERT_EQ(run(train + " --max-steps 3").code, 0);  // ckpt-step00000003.h5
  const fs::path first = fs::path(ck) / "ckpt-step00000003.h5";
  ASSERT_TRUE(fs::exists(first));
  const std::string limited = "env RENAISSANCE_SPACE_CHECK=off " + disk.fill(64);  // the disk fills during the run
  // The next checkpoint (step 6) does not fit: exit 1 naming it, and step 3 stays the valid latest.
  CliResult r = run_shell("exec " + limited + cli() + " " + train + " --max-steps 9 --resume auto");
  expect_disk_full(r, "ckpt-step00000006.h5");
  EXPECT_NO_THROW(renaissance::io::read_checkpoint(first.string()));
  EXPECT_EQ(fs::canonical(fs::path(ck) / "latest.h5"), fs::canonical(first));
  EXPECT_TRUE(disk.temporaries().empty()) << disk.temporaries().front();
  // SIGUSR1 (preemption): the checkpoint it asks for cannot be written either; still 75, the run requeues and
  // resumes from step 3.
  const std::string preempted = "train --data " + tiny_data() + " --epochs 3 --batch 32 --checkpoint-every 100 --checkpoint-dir " + ck;
  r = run_shell("RENAISSANCE_TEST_STEP_DELAY_MS=300 " + limited + cli() + " " + preempted + " --resume auto & pid=$!; "
                "sleep 2.5; kill -USR1 $pid; wait $pid");
  expect_disk_full(r, ck, 75);
  EXPECT_NE(r.out.find("preempted, but this checkpoint could not be written: the previous one in " + ck + " stays"),
            std::string::npos)
      << r.out;
  EXPECT_NO_THROW(renaissance::io::read_checkpoint(first.string()));
  EXPECT_EQ(fs::canonical(fs::path(ck) / "latest.h5"), fs::canonical(first));
  EXPECT_TRUE(disk.temporaries().empty()) << disk.temporaries().front();
  // The same in a directory without a checkpoint: it named "the previous one", which did not exist.
  const std::string ck2 = (disk.dir() / "ck2").string();
  r = run_shell("RENAISSANCE_TEST_STEP_DELAY_MS=300 " + limited + cli() + " " +
                preempted.substr(0, preempted.size() - ck.size()) + ck2 +
                " & pid=$!; sleep 2.5; kill -USR1 $pid; wait $pid");
  expect_disk_full(r, ck2, 75);
  EXPECT_NE(
      r.out.find("preempted, but this checkpoint could not be written, and " + ck2 + " holds none of this run yet"),
      std::string::npos)
      << r.out;
}

TEST(HardeningFaults, AFullDiskDuringADatasetWriteIsACleanError) {
  // The one writer that streams through HDF5's own file I/O (a dataset can be larger than memory).
  const fs::path d = temp_dir();
  SmallDisk disk(d / "disk");
  const fs::path out = disk.dir() / "x.h5";
  const CliResult r = run_shell("exec " + disk.fill(256) + cli() + " data synthetic --out " + out.string() +
                                " --train 5000 --val 100 --shape 28,28,1 --classes 10");
  expect_disk_full(r, out.string());
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(disk.temporaries().empty()) << disk.temporaries().front();
}

// A result printed to a file or device that cannot take it (a full disk) is lost: exit 1 saying so. It was exit 0
// with an empty file and a warning about a broken pipe, so `eval --json > r.json && parse r.json` read nothing.
// plan's and data's text (fmt::print, which throws) ended a closed pipe with exit 1 and "cannot write to file".
TEST(HardeningFaults, AResultThatCannotBeWrittenToStdoutFailsTheCommand) {
  const fs::path d = temp_dir();
  const std::string w = (d / "w.h5").string(), ck = (d / "ck").string();
  ASSERT_EQ(run("train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --save " + w +
                " --checkpoint-dir " + ck)
                .code,
            0);
  for (const std::string& cmd :
       {"data inspect " + tiny_data(), "eval --data " + tiny_data() + " --weights " + w + " --json",
        "checkpoint inspect --json " + ck + "/latest.h5", std::string("plan --model fmnist_cnn --graph"),
        "data synthetic --out " + (d / "s.h5").string() + " --train 10 --val 5 --shape 8,8,1 --classes 2"}) {
    ASSERT_EQ(run_shell("exec " + cli() + " " + cmd + " >/dev/null").code, 0) << cmd;
    const CliResult r = run_shell("exec " + cli() + " " + cmd + " >/dev/full");
    SCOPED_TRACE(cmd);
    EXPECT_CLEAN_ERROR(r, "writing the standard output failed", "this command's output is incomplete");
    // A closed stdout (`>&-`) is a closed pipe's case: the warning, the command's own exit status.
    const CliResult closed = run_shell("exec " + cli() + " " + cmd + " >&-");
    EXPECT_EQ(closed.code, 0) << closed.out;
    EXPECT_NE(closed.out.find("standard output was closed"), std::string::npos) << closed.out;
  }
  // With descriptor 1 closed, the next file opened took it, and stdout's lines went into the checkpoint lock.
  const CliResult closed = run_shell("exec " + cli() + " train --data " + tiny_data() +
                                     " --epochs 1 --max-steps 1 --batch 32 --checkpoint-dir " + ck + "2 >&-");
  EXPECT_EQ(closed.code, 0) << closed.out;
  const std::string lock = read_text(fs::path(ck + "2") / ".renaissance-lock");
  EXPECT_EQ(lock.rfind("PID ", 0), 0u) << lock;
  EXPECT_EQ(lock.find("epoch"), std::string::npos) << lock;
}

TEST(HardeningFaults, SigpipeOnStdoutDoesNotKillTheRun) {
  const fs::path d = temp_dir();
  const fs::path w = d / "w.h5";
  // `| head -c 20`: the reader goes away after the first line; the run must finish and save its weights.
  const CliResult r = run_shell("bash -c \"" + cli() + " train --data " + tiny_data() + " --epochs 2 --batch 32 --save " +
                                w.string() + " 2>" + (d / "err.txt").string() +
                                " | head -c 20 >/dev/null; exit \\${PIPESTATUS[0]}\"");
  EXPECT_EQ(r.code, 0) << r.out << read_text(d / "err.txt");
  EXPECT_NO_THROW(renaissance::io::read_weights(w.string()));
  EXPECT_NE(read_text(d / "err.txt").find("standard output was closed"), std::string::npos) << read_text(d / "err.txt");
}

// A process that may start no thread (ulimit -s larger than what ulimit -v leaves: no thread's stack can be mapped;
// as root RLIMIT_NPROC does not apply) stops with an error that says so and exit 1. At the MPI start-up (the
// watchdog's thread, RENAISSANCE_MPI=always as under a launcher) it was an uncaught std::system_error: SIGABRT,
// exit 134; later (the CPU kernels' pool, the loader) the bare "Resource temporarily unavailable".
TEST(HardeningFaults, AThreadThatCannotBeStartedIsAnErrorSayingWhyNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's shadow memory does not fit under ulimit -v";
#endif
  const std::string limits = "ulimit -s 4000000 && ulimit -v 3000000 && ";  // sh: one limit per ulimit
  const std::string train = " train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32";
  for (const std::string mpi : {"always", "never"}) {
    const CliResult r = run_shell(limits + "RENAISSANCE_MPI=" + mpi + " exec " + cli() + train);
    EXPECT_EQ(r.code, 1) << mpi << ": " << r.out;
    EXPECT_NE(r.out.find("could not start a thread (Resource temporarily unavailable)"), std::string::npos)
        << mpi << ": " << r.out;
    EXPECT_NE(r.out.find("ulimit -u, -v and -s"), std::string::npos) << r.out;
    if (mpi == "always") EXPECT_NE(r.out.find("MPI start-up: "), std::string::npos) << r.out;
  }
  // A small stack limit bounds the main thread's stack only: the threads get 2 MiB (the batch loader's HDF5 read
  // overflowed a 128 KiB one: SIGSEGV). eval and predict run the loader too.
  const CliResult small = run_shell("ulimit -s 128 && exec " + cli() + train);
  EXPECT_EQ(small.code, 0) << small.out;
}

// Under an address-space limit (ulimit -v: SGE's h_vmem, some sites' defaults) just above what mapping the libraries
// takes, every command crashed before main: the CUDA libraries' initialisers (SIGSEGV, or an uncaught std::bad_alloc:
// exit 134/139). Found by bisection on this machine's own libraries: from the lowest limit at which the loader maps
// them (below it, ld.so's exit 127) over the next 24 MiB, `plan` either runs or says it is out of memory, exit 1;
// then a CPU training near its own limit (below).
TEST(HardeningFaults, ALowAddressSpaceLimitIsAnErrorNeverACrash) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's shadow memory does not fit under ulimit -v";
#endif
  const auto plan_under = [](long kib) {
    return run_shell("ulimit -v " + std::to_string(kib) + " && exec " + cli() + " plan >/dev/null", 60);
  };
  long lo = 64L << 10, hi = 64L << 20;  // KiB: 64 MiB (the loader fails) .. 64 GiB (it maps them)
  ASSERT_NE(plan_under(hi).code, 127) << plan_under(hi).out;
  while (hi - lo > 256) {
    const long mid = (lo + hi) / 2;
    (plan_under(mid).code == 127 ? lo : hi) = mid;
  }
  for (long kib = hi; kib <= hi + (24L << 10); kib += 1024) {
    const CliResult r = plan_under(kib);
    EXPECT_LT(r.code, 128) << "ulimit -v " << kib << ": " << r.out;
    if (r.code != 0 && r.code != 127)
      EXPECT_NE(r.out.find("out of host memory"), std::string::npos) << "ulimit -v " << kib << ": " << r.out;
  }
  // Further up, a CPU training: between a limit at which it runs (found by bisection) and 320 MiB below it,
  // in 8 MiB steps, it runs or fails with an error of ours, exit 1. oneDNN's JIT kernels crashed in a window of a few
  // MiB there (SIGSEGV inside dnnl_primitive_create, whose code buffers Xbyak maps unchecked).
  const std::string train = " train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32";
  const auto train_under = [&](long kib) {
    return run_shell("ulimit -v " + std::to_string(kib) + " && exec " + cli() + train + " >/dev/null", 60);
  };
  long fails = hi, runs = 16L << 20;  // 16 GiB
  ASSERT_EQ(train_under(runs).code, 0) << train_under(runs).out;
  while (runs - fails > 4096) {
    const long mid = (fails + runs) / 2;
    const CliResult r = train_under(mid);
    ASSERT_LT(r.code, 128) << "ulimit -v " << mid << ": " << r.out;
    (r.code == 0 ? runs : fails) = mid;
  }
  for (long kib = runs; kib >= std::max(hi, runs - (320L << 10)); kib -= 8L << 10) {
    const CliResult r = train_under(kib);  // out of host memory, no room for the arena or for a thread's stack
    if (r.code != 0) {
      EXPECT_EQ(r.code, 1) << "ulimit -v " << kib << ": " << r.out;
      EXPECT_NE(r.out.find("renaissance: error: "), std::string::npos) << "ulimit -v " << kib << ": " << r.out;
    }
  }
}
