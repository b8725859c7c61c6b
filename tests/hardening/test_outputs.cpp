// Issue 13, class 3: no output may destroy an input or another run's work. An output that is (or links to) an
// input is refused before any work; --save onto a symlink replaces the file it points to, never the link, and a
// device is never replaced; two runs cannot share a checkpoint directory (a lock), and a temporary is removed
// only when its writer process is dead; a failed write of --metrics or --loss-log fails the run.
#include "hardening_util.h"

#include <renaissance/io/checkpoint.h>
#include <renaissance/io/hdf5_util.h>
#include <renaissance/io/weights.h>

#include <sys/stat.h>

#include <algorithm>
#include <thread>
#include <tuple>

namespace {

using namespace hardening;

std::string host_tag() {  // how a temporary names its host (io::temporary_name): '-' and '/' become '_'
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  std::string s(h);
  for (char& c : s)
    if (c == '-' || c == '/') c = '_';
  return s;
}

}  // namespace

TEST(HardeningOutputs, AnOutputThatIsAnInputIsRefusedBeforeAnyWork) {
  const fs::path d = temp_dir();
  const fs::path data = d / "data.h5";
  fs::copy_file(tiny_data(), data);
  const std::string before = read_text(data);
  fs::create_symlink(data, d / "link.h5");
  fs::create_hard_link(data, d / "hard.h5");
  const std::string train = "train --data " + data.string() + " --epochs 1 --batch 32 ";
  for (const auto& [args, names] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--save " + data.string(), {"--save is the same file as --data"}},
           {"--save " + (d / "link.h5").string(), {"--save is the same file as --data"}},
           {"--save " + (d / "hard.h5").string(), {"--save is the same file as --data"}},
           {"--metrics " + data.string(), {"--metrics is the same file as --data"}},
           {"--loss-log " + (d / "link.h5").string(), {"--loss-log is the same file as --data"}},
           {"--save " + (d / "o.h5").string() + " --metrics " + (d / "o.h5").string(), {"--save and --metrics name the same file"}}}) {
    SCOPED_TRACE(args);
    const CliResult r = run(train + args);
    EXPECT_EQ(r.code, 1) << r.out;
    for (const std::string& n : names) EXPECT_NE(r.out.find(n), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << "refused before training:\n" << r.out;
  }
  EXPECT_TRUE(read_text(data) == before) << "the dataset changed";
  EXPECT_TRUE(fs::is_symlink(d / "link.h5"));

  // --save onto the checkpoint --resume loads, and predict --out onto its inputs.
  const fs::path w = d / "w.h5";
  ASSERT_EQ(run(train + "--max-steps 2 --save " + w.string() + " --checkpoint-dir " + (d / "ck").string()).code, 0);
  const fs::path ck = fs::canonical(d / "ck" / "latest.h5");
  const std::string ck_before = read_text(ck), w_before = read_text(w);
  CliResult r = run(train + "--max-steps 3 --resume " + ck.string() + " --save " + ck.string());
  EXPECT_CLEAN_ERROR(r, "--save is the same file as --resume");
  r = run(train + "--max-steps 3 --checkpoint-dir " + (d / "ck").string() + " --resume auto --save " +
          (d / "ck" / "latest.h5").string());
  EXPECT_CLEAN_ERROR(r, "--save would overwrite a checkpoint of --checkpoint-dir");
  r = run("predict --data " + data.string() + " --weights " + w.string() + " --out " + w.string());
  EXPECT_CLEAN_ERROR(r, "--out is the same file as --weights");
  r = run("predict --data " + data.string() + " --weights " + w.string() + " --out " + (d / "link.h5").string());
  EXPECT_CLEAN_ERROR(r, "--out is the same file as --data");
  EXPECT_TRUE(read_text(ck) == ck_before && read_text(w) == w_before && read_text(data) == before);
}

// Found by a hostile-input hunt: --metrics and --loss-log overwrote a checkpoint of --checkpoint-dir (only --save
// was checked); "m.h5" and "$PWD/m.h5" were not seen to be one file while neither existed; a fresh run into a
// directory holding an earlier run's checkpoints overwrote them and moved latest.h5 back, without a word.
TEST(HardeningOutputs, NoOutputOverwritesACheckpointAndSpellingsOfOnePathAreOneFile) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --batch 32 ";
  ASSERT_EQ(run(train + "--max-steps 2 --checkpoint-every 1 --checkpoint-dir " + ck.string()).code, 0);
  const fs::path step2 = ck / "ckpt-step00000002.h5";
  ASSERT_TRUE(fs::exists(step2));
  const std::string step2_before = read_text(step2), latest_target = fs::read_symlink(ck / "latest.h5").string();
  const std::string resume = "--max-steps 3 --checkpoint-dir " + ck.string() + " --resume auto ";
  CliResult r = run(train + resume + "--metrics " + step2.string());
  EXPECT_CLEAN_ERROR(r, "--metrics would overwrite a checkpoint of --checkpoint-dir");
  r = run(train + resume + "--loss-log " + (ck / "." / "latest.h5").string());
  EXPECT_CLEAN_ERROR(r, "--loss-log would overwrite a checkpoint of --checkpoint-dir");
  // A fresh run (no --resume) into that directory.
  r = run(train + "--max-steps 1 --checkpoint-every 1 --checkpoint-dir " + ck.string());
  EXPECT_CLEAN_ERROR(r, "--checkpoint-dir holds the checkpoints of an earlier run (ckpt-step00000002.h5)",
                     "--resume auto");
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << r.out;
  EXPECT_TRUE(read_text(step2) == step2_before) << "the checkpoint changed";
  // A run resumed from another directory's checkpoint into this one would overwrite them too; one of the
  // directory's own files (an earlier step: a roll-back) continues its run.
  ASSERT_EQ(run(train + "--max-steps 1 --checkpoint-dir " + (d / "other").string()).code, 0);
  r = run(train + "--max-steps 3 --checkpoint-dir " + ck.string() + " --resume " + (d / "other" / "latest.h5").string());
  EXPECT_CLEAN_ERROR(r, "--checkpoint-dir holds the checkpoints of another run (ckpt-step00000002.h5), and --resume");
  EXPECT_TRUE(read_text(step2) == step2_before) << "the checkpoint changed";
  EXPECT_EQ(fs::read_symlink(ck / "latest.h5").string(), latest_target);
  const CliResult back = run(train + "--max-steps 2 --checkpoint-dir " + ck.string() + " --resume " +
                             (ck / "ckpt-step00000001.h5").string());
  EXPECT_EQ(back.code, 0) << back.out;
  // Two spellings of one new file, relative and absolute.
  const std::string in_d = "cd " + d.string() + " && exec " + cli() + " " + train;
  r = run_shell(in_d + "--max-steps 1 --save m.h5 --loss-log " + (d / "m.h5").string());
  EXPECT_CLEAN_ERROR(r, "--save and --loss-log name the same file");
  r = run_shell(in_d + "--max-steps 1 --metrics l.jsonl --loss-log ./l.jsonl");
  EXPECT_CLEAN_ERROR(r, "--metrics and --loss-log name the same file");
  EXPECT_FALSE(fs::exists(d / "m.h5") || fs::exists(d / "l.jsonl"));
  // The directory resumes as before.
  EXPECT_EQ(run(train + resume).code, 0);
}

// /proc: a directory whose mode bits say writable (to root: access(2) said yes), in which no file can be made. The
// check tried a real file: --save and --checkpoint-dir there failed after the training.
TEST(HardeningOutputs, ADirectoryNoFileCanBeCreatedInIsRefusedBeforeTraining) {
  if (!fs::is_directory("/proc/self")) GTEST_SKIP() << "no /proc";
  for (const std::string& opt : {std::string("--save /proc/w.h5"), std::string("--checkpoint-dir /proc/ck"),
                                 std::string("--metrics /proc/m.jsonl")}) {
    const CliResult r = run("train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 " + opt);
    EXPECT_CLEAN_ERROR(r, opt.substr(0, opt.find(' ')), "/proc");
    EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << opt << ": refused before training\n" << r.out;
  }
}

TEST(HardeningOutputs, SaveOntoASymlinkReplacesItsTargetAndADeviceIsNeverReplaced) {
  const fs::path d = temp_dir();
  fs::create_directories(d / "real");
  const fs::path target = d / "real" / "w.h5";
  write_text(target, "old");
  fs::create_symlink(target, d / "w.h5");
  const CliResult r = run("train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --save " + (d / "w.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_symlink(d / "w.h5")) << "the link was replaced by the rename";
  EXPECT_EQ(fs::read_symlink(d / "w.h5"), target);
  EXPECT_NO_THROW(renaissance::io::read_weights(target.string()));  // the weights went to the link's target
  // A device (as root, a rename over /dev/null would replace the device node) and a directory are refused.
  for (const std::string& out : {std::string("/dev/null"), d.string()}) {
    const CliResult bad = run("train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --save " + out);
    EXPECT_CLEAN_ERROR(bad, out + ": --save: is a", "refusing to replace it");
    EXPECT_EQ(bad.out.find("epoch 1/"), std::string::npos) << bad.out;
  }
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// `--out /dev/stdout > f.h5`: the rename put the logits file in place of the command's stdout file, and the command's
// summary went to the replaced, unlinked file (exit 0); on a pipe the message said "a dangling symlink"; a link
// that points at itself was "a dangling symlink" too.
TEST(HardeningOutputs, TheCommandsOwnStdoutASymlinkLoopAndAPipeAreNamedAsSuch) {
  const fs::path d = temp_dir();
  const std::string w = (d / "w.h5").string();
  ASSERT_EQ(run("train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 --save " + w).code, 0);
  const std::string predict = cli() + " predict --data " + tiny_data() + " --weights " + w;
  const fs::path own = d / "own.h5";
  write_text(own, "before");
  CliResult r = run_shell(predict + " --out /dev/stdout 2>&1 >" + own.string());
  EXPECT_CLEAN_ERROR(r, "/dev/stdout: --out: is this process's standard output; refusing to replace it");
  EXPECT_EQ(read_text(own), "") << "the shell truncated it; the command wrote nothing into it";
  r = run_shell("{ " + predict + " --out /dev/stdout; echo rc=$? >&2; } | cat >/dev/null");
  EXPECT_NE(r.out.find("/dev/stdout: --out: is a FIFO; refusing to replace it"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rc=1"), std::string::npos) << r.out;
  fs::create_symlink(d / "loop.h5", d / "loop.h5");
  r = run("predict --data " + tiny_data() + " --weights " + w + " --out " + (d / "loop.h5").string());
  EXPECT_CLEAN_ERROR(r, "--out: a symlink loop");
  r = run("checkpoint inspect " + (d / "loop.h5").string());
  EXPECT_CLEAN_ERROR(r, "a symlink loop");
  r = run("eval --data " + tiny_data() + " --weights " + (d / "loop.h5").string());
  EXPECT_CLEAN_ERROR(r, "a symlink loop");
}

TEST(HardeningOutputs, TwoRunsCannotShareACheckpointDirectoryAndLiveTemporariesSurvive) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  fs::create_directories(ck);
  // A temporary of a writer that is gone, and one of a live process (this test): only the first may go.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const fs::path stale = ck / ("ckpt-step00000001.h5.tmp-" + host_tag() + "-" + std::to_string(dead));
  const fs::path live = ck / ("ckpt-step00000002.h5.tmp-" + host_tag() + "-" + std::to_string(::getpid()));
  const fs::path other_host = ck / "ckpt-step00000003.h5.tmp-another_host-1";
  for (const fs::path& p : {stale, live, other_host}) write_text(p, "partial");
  // Run A (slow steps) holds the directory; run B, started meanwhile on the same directory, is refused at once.
  const std::string data = tiny_data();
  const std::string common = " train --data " + data + " --batch 32 --checkpoint-every 2 --checkpoint-dir " + ck.string();
  const CliResult r = run_shell("RENAISSANCE_TEST_STEP_DELAY_MS=300 " + cli() + common + " --epochs 1 > " + (d / "a.log").string() +
                                    " 2>&1 & a=$!; sleep 1.5; " + cli() + common + "; b=$?; wait $a; echo \"A=$? B=$b\"",
                                120);
  EXPECT_NE(r.out.find("another run is using this checkpoint directory (PID"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("A=0 B=1"), std::string::npos) << r.out << read_text(d / "a.log");
  EXPECT_NE(read_text(d / "a.log").find("checkpoint: step 7"), std::string::npos) << read_text(d / "a.log");
  EXPECT_FALSE(fs::exists(stale)) << "a dead writer's temporary is removed";
  EXPECT_TRUE(fs::exists(live)) << "a live writer's temporary is never removed";
  EXPECT_TRUE(fs::exists(other_host)) << "another host's temporary is never removed";
  // A finished run releases the lock: the same directory works again.
  EXPECT_EQ(run(common + " --resume auto --epochs 2").code, 0);
}

TEST(HardeningOutputs, TwoRunsCannotWriteOneMetricsOrLossLogFile) {
  // Two runs with their own checkpoint directories but one --metrics (a job array's script without %a): B truncated
  // A's file under it and their lines interleaved. B is refused before its first step; A's file is whole.
  const fs::path d = temp_dir();
  const std::string data = tiny_data();
  // B starts once A has opened (and locked) the file: A's steps are slow, B's start-up takes ~0.3 s more.
  const auto a_then_b = [&](const std::string& a, const std::string& b, const std::string& a_started,
                            const std::string& a_log) {
    return run_shell("RENAISSANCE_TEST_STEP_DELAY_MS=300 " + cli() + a + " > " + a_log + " 2>&1 & a=$!; " + "until " +
                         a_started + " || ! kill -0 $a 2>/dev/null; do sleep 0.05; done; " + cli() + b +
                         "; b=$?; wait $a; echo \"A=$? B=$b\"",
                     120);
  };
  for (const std::string opt : {"--metrics", "--loss-log"}) {
    SCOPED_TRACE(opt);
    const fs::path log = d / (opt.substr(2) + ".jsonl");
    const std::string common = " train --data " + data + " --batch 32 " + opt + " " + log.string();
    const std::string a_log = (d / (opt.substr(2) + "-a.log")).string();
    // A fresh file: wait for A's first line (the --loss-log's first step; --metrics' first epoch).
    const CliResult r = a_then_b(common + " --epochs 2", common + " --epochs 1", "[ -s " + log.string() + " ]", a_log);
    EXPECT_NE(r.out.find(log.string() + ": " + opt + ": another process is writing this file"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("A=0 B=1"), std::string::npos) << r.out << read_text(a_log);
    EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << "B is refused before it trains\n" << r.out;
    // A's lines, all of them and only them: 2 epochs, or one per step with --loss-log (7 steps an epoch).
    const std::string text = read_text(log);
    const auto lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
    EXPECT_EQ(lines, opt == "--metrics" ? 2u : 14u) << text;
    // A finished run releases the file: the next run writes it again.
    EXPECT_EQ(run(common + " --epochs 1").code, 0);
  }
  // A resumed run whose file holds kept lines after dropped ones rewrites it through a temporary renamed over it:
  // the lock was the old inode's, and a second run got in.
  const std::string ck = (d / "ck").string();
  const fs::path log = d / "mixed.jsonl";
  ASSERT_EQ(run("train --data " + data + " --batch 32 --epochs 2 --max-steps 2 --checkpoint-dir " + ck).code, 0);
  write_text(log, "{\"step\":1}\n{\"step\":50}\n{\"step\":2}\n");
  const CliResult r = a_then_b(" train --data " + data + " --batch 32 --epochs 2 --loss-log " + log.string() +
                                   " --checkpoint-dir " + ck + " --resume auto",
                               " train --data " + data + " --batch 32 --epochs 1 --loss-log " + log.string(),
                               "grep -q step.:3 " + log.string(), (d / "mixed-a.log").string());
  EXPECT_NE(r.out.find("--loss-log: another process is writing this file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("A=0 B=1"), std::string::npos) << r.out << read_text(d / "mixed-a.log");
}

TEST(HardeningOutputs, AFailedWriteOfMetricsOrLossLogFailsTheRun) {
  for (const std::string& opt : {std::string("--metrics"), std::string("--loss-log")}) {
    const CliResult r = run("train --data " + tiny_data() + " --epochs 1 --batch 32 " + opt + " /dev/full");
    EXPECT_CLEAN_ERROR(r, opt + ": writing", "No space left on device");
    EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  }
  // The epoch's metrics line fails after the epoch's checkpoint is written, not before it (the epoch was lost with
  // the metrics, though the checkpoint's disk had room): the run resumes from the end of epoch 1.
  const fs::path d = temp_dir();
  const std::string ck = (d / "ck").string();
  const CliResult r =
      run("train --data " + tiny_data() + " --epochs 2 --batch 32 --metrics /dev/full --checkpoint-dir " + ck);
  EXPECT_CLEAN_ERROR(r, "--metrics: writing epoch 1 failed", "No space left on device");
  ASSERT_TRUE(fs::exists(fs::path(ck) / "latest.h5")) << r.out;
  const renaissance::io::Checkpoint last = renaissance::io::read_checkpoint(ck + "/latest.h5");
  EXPECT_EQ(last.state.epoch, 1) << "the checkpoint at the end of epoch 1";
  EXPECT_EQ(r.out.find("epoch 2/"), std::string::npos) << "the run stops there\n" << r.out;
  // The same at a preemption: still exit 75, and the message says the step's checkpoint is written (it said the
  // checkpoint could not be written).
  const std::string ck3 = (d / "ck3").string();
  // (The signal once step 1's loss is logged: the handlers are armed, and the step waits 1.5 s for it.)
  const std::string loss = (d / "loss.jsonl").string();
  const CliResult pre =
      run_shell("RENAISSANCE_TEST_STEP_DELAY_MS=1500 " + cli() + " train --data " + tiny_data() +
                " --epochs 3 --batch 512 --metrics /dev/full --checkpoint-dir " + ck3 + " --loss-log " + loss +
                " & pid=$!; while [ ! -s " + loss + " ]; do sleep 0.05; done; kill -USR1 $pid; wait $pid");
  EXPECT_EQ(pre.code, 75) << pre.out;
  EXPECT_NE(pre.out.find("--metrics: writing epoch 1 failed"), std::string::npos) << pre.out;
  EXPECT_NE(pre.out.find("preempted; the checkpoint of step 1 is written"), std::string::npos) << pre.out;
  EXPECT_EQ(pre.out.find("could not be written"), std::string::npos) << pre.out;
  EXPECT_EQ(renaissance::io::read_checkpoint(ck3 + "/latest.h5").state.step, 1);
}

// The checkpoint directory's own names are replaced as directory entries: a symbolic link there (best.h5 ->
// ../data.h5) was written through, and the run's own dataset became a checkpoint. A name that is a directory
// (latest.h5) is refused before training; it failed at the first checkpoint.
TEST(HardeningOutputs, CheckpointNamesInTheDirectoryAreReplacedNeverWrittenThrough) {
  const fs::path d = temp_dir();
  const fs::path data = d / "data.h5";
  fs::copy_file(tiny_data(), data);
  const std::string before = read_text(data);
  const std::string ck = (d / "ck").string();
  const std::string train = "train --data " + data.string() + " --epochs 1 --batch 32 --checkpoint-dir " + ck;
  ASSERT_EQ(run(train + " --max-steps 2").code, 0);
  fs::create_symlink("../data.h5", fs::path(ck) / "best.h5");
  fs::create_symlink("../data.h5", fs::path(ck) / "ckpt-step00000003.h5");
  const CliResult r =
      run(train + " --checkpoint-every 1 --keep 10 --keep-best val_top1 --resume auto");  // to the epoch end
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_text(data), before) << "the dataset was written through a link";
  for (const char* name : {"best.h5", "ckpt-step00000003.h5"}) {
    EXPECT_FALSE(fs::is_symlink(fs::path(ck) / name)) << name;
    EXPECT_NO_THROW(renaissance::io::read_checkpoint((fs::path(ck) / name).string())) << name;
  }
  fs::remove(fs::path(ck) / "latest.h5");
  fs::create_directory(fs::path(ck) / "latest.h5");
  const CliResult dir = run(train + " --max-steps 4 --resume auto");
  EXPECT_CLEAN_ERROR(dir, ck + "/latest.h5", "not a file but a directory");
  EXPECT_EQ(dir.out.find("epoch 1/"), std::string::npos) << "refused before training\n" << dir.out;
  // The lock file is written into (the holder's PID): a link there, symbolic or hard, cut the run's own dataset to
  // 16 bytes ("PID 17908 on vm") and the run then called the dataset not an HDF5 file. A symbolic link is refused.
  const std::string ck2 = (d / "ck2").string();
  fs::create_directory(ck2);
  fs::create_symlink("../data.h5", fs::path(ck2) / ".renaissance-lock");
  const std::string train2 = "train --data " + data.string() + " --epochs 1 --max-steps 2 --batch 32 --checkpoint-dir ";
  const CliResult sym = run(train2 + ck2);
  EXPECT_CLEAN_ERROR(sym, ck2 + "/.renaissance-lock", "the lock file is a symbolic link");
  EXPECT_EQ(read_text(data), before) << "the dataset was truncated through the lock";
  fs::remove(fs::path(ck2) / ".renaissance-lock");
  // A hard link (a snapshot by `cp -al` makes them) is locked as it is, but not written into.
  fs::create_hard_link(data, fs::path(ck2) / ".renaissance-lock");
  const CliResult hard = run(train2 + ck2);
  EXPECT_EQ(hard.code, 0) << hard.out;
  EXPECT_EQ(read_text(data), before) << "the dataset was truncated through the lock";
  fs::remove(fs::path(ck2) / ".renaissance-lock");
  const CliResult again = run(train2 + ck2 + " --resume auto");
  EXPECT_EQ(again.code, 0) << "a plain lock file is created again\n" << again.out;
  EXPECT_EQ(read_text(fs::path(ck2) / ".renaissance-lock").rfind("PID ", 0), 0u);
}

// --tensorboard is checked with the other outputs before anything is written (a file in its place failed after
// --metrics had been opened, and emptied it); a FIFO that nothing reads is refused (the first write blocked forever),
// one with a reader gets the lines.
TEST(HardeningOutputs, ATensorboardPathOrAFifoWithoutReaderIsRefusedBeforeAnyOutputIsTouched) {
  const fs::path d = temp_dir();
  write_text(d / "keep.jsonl", "{\"old\":1}\n");
  write_text(d / "tbfile", "not a directory\n");
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32 ";
  const CliResult tb =
      run(train + "--metrics " + (d / "keep.jsonl").string() + " --tensorboard " + (d / "tbfile").string());
  EXPECT_CLEAN_ERROR(tb, (d / "tbfile").string() + ": --tensorboard");
  EXPECT_EQ(read_text(d / "keep.jsonl"), "{\"old\":1}\n");
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliResult no_reader = run(train + "--metrics " + fifo.string(), 60);
  EXPECT_CLEAN_ERROR(no_reader, fifo.string() + ": --metrics: a FIFO that nothing reads");
  const CliResult with_reader = run_shell("cat " + fifo.string() + " > " + (d / "read.jsonl").string() + " & exec " +
                                              cli() + " " + train + "--metrics " + fifo.string(),
                                          60);
  ASSERT_EQ(with_reader.code, 0) << with_reader.out;
  for (int i = 0; i < 200 && read_text(d / "read.jsonl").find("val_top1") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(read_text(d / "read.jsonl").find("\"val_top1\""), std::string::npos) << read_text(d / "read.jsonl");
}

// An AMP run whose weights overflow: the loss scaling skips overflowing steps but cannot undo such an update. It went
// on to "done", exit 0, saved NaN weights no reader accepts, and its NaN checkpoints pushed the good ones out. Now the
// first checkpoint or weights file with a non-finite value is an error naming the tensor, and the earlier
// checkpoint stays. Since skipped steps leave the BN running statistics alone, the update at lr 10000 leaves every
// tensor finite but too large for FP16: every later step overflows and is skipped, the scale halves down to 1 (16
// steps from 65536), and the first overflow there is the error (it ended "done", exit 0, saving those weights).
TEST(HardeningOutputs, ADivergedAmpRunIsAnErrorAndKeepsItsLastGoodCheckpoint) {
  const fs::path d = temp_dir();
  const std::string ck = (d / "ck").string();
  const CliResult r = run("train --data " + tiny_data() +
                          " --epochs 3 --batch 32 --amp --lr 10000 --schedule constant "
                          "--checkpoint-dir " +
                          ck + " --checkpoint-every 1 --keep 1 --save " + (d / "w.h5").string());
  EXPECT_CLEAN_ERROR(r, "the run diverged by step", "lower --lr");
  EXPECT_TRUE(r.out.find("holds a non-finite value") != std::string::npos ||
              r.out.find("overflowed FP16 at loss scale 1") != std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(d / "w.h5"));
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  const auto last = renaissance::io::read_checkpoint((fs::path(ck) / "latest.h5").string());  // valid
  EXPECT_GE(last.state.step, 1);
  // Its weights are finite but overflow FP16: eval --amp scores them, not silently (a NaN loss, exit 0, no word).
  const CliResult e = run("eval --data " + tiny_data() + " --checkpoint " + ck + "/latest.h5 --amp");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("some logits are not finite (with --amp they overflowed FP16"), std::string::npos) << e.out;
  // predict --amp of the same weights (as a weights file): written as they are, not silently.
  std::vector<renaissance::io::NamedTensor> tensors;
  for (const auto& t : last.tensors)
    if (t.group == "params" || t.group == "bn") tensors.push_back(t);
  renaissance::io::WeightsMeta meta;
  meta.strings = {
      {"model", last.state.model}, {"arch_plan", last.state.arch_plan}, {"plan_hash", last.state.plan_hash}};
  meta.ints = {{"step", last.state.step}};
  const std::string huge = (d / "huge.h5").string();
  renaissance::io::write_weights(huge, tensors, meta);
  const CliResult p =
      run("predict --data " + tiny_data() + " --weights " + huge + " --amp --out " + (d / "l.h5").string());
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("samples have logits that are not finite (with --amp"), std::string::npos) << p.out;
}

// predict --out through latest.h5 replaced the newest checkpoint with logits (the next --resume auto started afresh).
TEST(HardeningOutputs, PredictNeverReplacesACheckpointNorTrainsOutputsAFileOfData) {
  const fs::path d = temp_dir();
  const std::string ck = (d / "ck").string();
  ASSERT_EQ(run("train --data " + tiny_data() + " --epochs 1 --max-steps 2 --batch 32 --checkpoint-dir " + ck +
                " --save " + (d / "w.h5").string())
                .code,
            0);
  const std::string before = read_text(fs::path(ck) / "ckpt-step00000002.h5");
  for (const std::string& out : std::vector<std::string>{ck + "/latest.h5", ck + "/ckpt-step00000002.h5"}) {
    const CliResult r = run("predict --data " + tiny_data() + " --weights " + (d / "w.h5").string() + " --out " + out);
    EXPECT_CLEAN_ERROR(r, "--out would replace a checkpoint");
  }
  EXPECT_EQ(read_text(fs::path(ck) / "ckpt-step00000002.h5"), before);
  // Found by a review: --out as the --model-file (the YAML became HDF5), as the directory's lock file (a second run
  // was then let into the directory), or as a checkpoint or weights file under another name (replaced, exit 0).
  const std::string yaml = (d / "m.yaml").string();
  write_text(yaml,
             "name: m\nlayers:\n  - cbr: {out: 4, k: 3, pad: 1}\n  - gap: {}\n  - fc: {out: 10}\n  - softmax_ce: {}\n");
  fs::copy_file(fs::path(ck) / "ckpt-step00000002.h5", d / "old.h5");
  fs::copy_file(d / "w.h5", d / "w_copy.h5");
  fs::copy_file(tiny_data(), d / "data_copy.h5");  // a dataset under another name (replaced by the logits, exit 0)
  for (const auto& [out, must] :
       std::vector<std::pair<std::string, std::string>>{{yaml, "--out is the same file as --model-file"},
                                                        {ck + "/.renaissance-lock", "--out would replace a checkpoint"},
                                                        {(d / "old.h5").string(), "a checkpoint or weights file"},
                                                        {(d / "w_copy.h5").string(), "a checkpoint or weights file"},
                                                        {(d / "data_copy.h5").string(), "an HDF5 file (a dataset?)"}}) {
    const std::string before_out = read_text(out);
    const std::string model = out == yaml ? " --model-file " + yaml : "";
    const CliResult r =
        run("predict --data " + tiny_data() + " --weights " + (d / "w.h5").string() + model + " --out " + out);
    EXPECT_CLEAN_ERROR(r, must);
    EXPECT_EQ(read_text(out), before_out) << out;
  }
  // A previous logits file is replaced (a rerun); train's outputs: --save never replaces a dataset (a rerun may
  // replace its weights), --metrics and --loss-log no file of data at all (a checkpoint became JSON lines, exit 0).
  const std::string logits = (d / "logits.h5").string();
  const std::string predict = "predict --data " + tiny_data() + " --weights " + (d / "w.h5").string() + " --out ";
  ASSERT_EQ(run(predict + logits).code, 0);
  EXPECT_EQ(run(predict + logits).code, 0) << "a logits file is replaced by the next one";
  const std::string train = "train --data " + tiny_data() + " --epochs 1 --max-steps 1 --batch 32 ";
  EXPECT_EQ(run(train + "--save " + (d / "w_copy.h5").string()).code, 0) << "weights are replaced by a rerun's";
  for (const auto& [option, out, must] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--save", (d / "data_copy.h5").string(), "--save would replace an HDF5 file (a dataset?)"},
           {"--metrics", (d / "old.h5").string(), "--metrics would replace a checkpoint or weights file"},
           {"--loss-log", (d / "data_copy.h5").string(), "--loss-log would replace an HDF5 file"},
           {"--metrics", logits, "--metrics would replace a file with a checksum header"}}) {
    const std::string before_out = read_text(out);
    EXPECT_CLEAN_ERROR(run(train + option + " " + out), must);
    EXPECT_EQ(read_text(out), before_out) << option << " " << out;
  }
  // An import's --out: never a checkpoint, weights or logits file; a dataset may be imported again.
  const std::string synthetic = "data synthetic --train 10 --val 5 --shape 8,8,1 --classes 2 --out ";
  for (const std::string& out : {(d / "old.h5").string(), (d / "w_copy.h5").string(), logits}) {
    const std::string before_out = read_text(out);
    EXPECT_CLEAN_ERROR(run(synthetic + out), "--out would replace", "not a dataset");
    EXPECT_EQ(read_text(out), before_out) << out;
  }
  EXPECT_EQ(run(synthetic + (d / "data_copy.h5").string()).code, 0) << "a dataset is replaced by a new import";
}
