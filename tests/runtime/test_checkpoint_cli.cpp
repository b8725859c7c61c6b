// Checkpoints through the real executable (issue 6), as a Slurm job uses them: `train --checkpoint-dir D
// --resume auto` resumes bit for bit; kill -9 in the middle of a checkpoint write leaves the previous checkpoint
// in charge; a corrupted or truncated checkpoint fails naming the file and tensor; SIGUSR1/SIGTERM write a
// checkpoint and exit 75, and the requeued run continues the same loss curve.
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/importers.h>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d =
      fs::temp_directory_path() / ("rn_ckpt_cli_" + std::to_string(::getpid()) + "_" + (info ? info->name() : "x"));
  fs::create_directories(d);
  return d;
}

std::string synthetic() {
  const fs::path p = fs::temp_directory_path() / ("rn_ckpt_cli_syn_" + std::to_string(::getpid()) + ".h5");
  if (!fs::exists(p)) renaissance::io::make_synthetic(p.string(), 300, 100, 28, 28, 1, 10, 5);
  return p.string();
}

struct CliRun {
  int code = -1;
  std::string out;
};

/// A started `renaissance` process, its stdout+stderr going to a file.
struct Child {
  pid_t pid = -1;
  fs::path log;
  CliRun wait() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    CliRun r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : (WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1);
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    r.out = ss.str();
    return r;
  }
};

/// `shell`: shell commands before the exec (e.g. "trap '' USR1;": a parent that ignores the signal).
Child start(const std::string& args, const fs::path& log, const std::vector<std::string>& env = {},
            const std::string& shell = "") {
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid == 0) {
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    const std::string cmd =
        shell + "exec " + std::string(RENAISSANCE_CLI) + " " + args + " > '" + log.string() + "' 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return c;
}

CliRun run(const std::string& args, const std::vector<std::string>& env = {}) {
  static int n = 0;
  return start(args, temp_dir() / ("run" + std::to_string(n++) + ".log"), env).wait();
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) v.push_back(l);
  return v;
}

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit = 60s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

/// A tiny run: fmnist_cnn, 300 samples, batch 32 (10 steps per epoch), 2 epochs.
std::string train_args(const std::string& extra) {
  return "train --data " + synthetic() + " --epochs 2 --batch 32 --lr 0.01 --crop-padding 2 --seed 3 " + extra;
}

/// The first `count` bytes of a tensor's values, located in the file (to flip one of them).
std::uint64_t offset_of_tensor(const fs::path& file, const std::string& group, const std::string& name) {
  const auto ck = renaissance::io::read_checkpoint(file.string());
  const auto* t = ck.find(group, name);
  EXPECT_NE(t, nullptr);
  if (!t) return 0;
  std::ifstream f(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string needle(reinterpret_cast<const char*>(t->values.data()), 64);
  const auto pos = bytes.find(needle);
  EXPECT_NE(pos, std::string::npos);
  return pos == std::string::npos ? 0 : pos;
}

void flip_byte(const fs::path& p, std::uint64_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

/// Removes this process's temporary directories and files after the last test.
class CleanUp : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string prefix = "rn_ckpt_cli_" + std::to_string(::getpid()) + "_";
    const std::string data = "rn_ckpt_cli_syn_" + std::to_string(::getpid()) + ".h5";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind(prefix, 0) == 0 || f == data) fs::remove_all(e.path(), ec);
    }
  }
};
const auto* const g_cleanup = ::testing::AddGlobalTestEnvironment(new CleanUp);

TEST(CheckpointCli, ResumeAutoIsBitIdenticalToAnUninterruptedRun) {
  const fs::path d = temp_dir();
  const std::string common = "--schedule constant --max-steps ";
  const CliRun full = run(train_args(common + "14 --loss-log " + (d / "full.jsonl").string() + " --metrics " +
                                     (d / "mfull.jsonl").string()));
  ASSERT_EQ(full.code, 0) << full.out;
  // A first Slurm run and a requeued one use the same command line: no checkpoint yet starts fresh.
  const std::string resumable = "--checkpoint-dir " + (d / "ck").string() + " --checkpoint-every 3 --resume auto " +
                                "--loss-log " + (d / "part.jsonl").string() + " --metrics " +
                                (d / "mpart.jsonl").string();
  const CliRun first = run(train_args(common + "7 " + resumable));
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("starting fresh"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("checkpoint: step 7"), std::string::npos) << first.out;
  const CliRun second = run(train_args(common + "14 " + resumable));
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("ckpt-step00000007.h5 at step 7"), std::string::npos) << second.out;
  const auto a = lines_of(d / "full.jsonl"), b = lines_of(d / "part.jsonl");
  ASSERT_EQ(a.size(), 14u);
  EXPECT_EQ(a, b);  // per-step losses, printed exactly (shortest round-trip form)
  // The final epoch line (epoch 2, after the resume) reports the same training and validation metrics.
  const auto ma = lines_of(d / "mfull.jsonl"), mb = lines_of(d / "mpart.jsonl");
  ASSERT_FALSE(ma.empty());
  ASSERT_FALSE(mb.empty());
  auto metrics_part = [](const std::string& l) { return l.substr(0, l.find(",\"images_per_s\"")); };
  EXPECT_EQ(metrics_part(ma.back()), metrics_part(mb.back()));
  EXPECT_EQ(metrics_part(ma.front()), metrics_part(mb[1]));  // mb[0]: the stopped run's partial epoch 1
  // The final weights: the two last checkpoints hold the same tensors.
  const CliRun again = run(train_args(common + "14 --checkpoint-dir " + (d / "ck2").string()));
  ASSERT_EQ(again.code, 0) << again.out;
  const auto x = renaissance::io::read_checkpoint((d / "ck" / "latest.h5").string());
  const auto y = renaissance::io::read_checkpoint((d / "ck2" / "latest.h5").string());
  EXPECT_EQ(x.state.step, 14);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (std::size_t i = 0; i < x.tensors.size(); ++i) {
    EXPECT_EQ(x.tensors[i].name, y.tensors[i].name);
    EXPECT_EQ(x.tensors[i].values, y.tensors[i].values) << x.tensors[i].group << "/" << x.tensors[i].name;
  }
  // eval --checkpoint: the model comes from the checkpoint; the score is the run's last validation.
  const CliRun ev =
      run("eval --data " + synthetic() + " --checkpoint " + (d / "ck" / "latest.h5").string() + " --json");
  ASSERT_EQ(ev.code, 0) << ev.out;
  const std::string vt = "\"val_top1\":";
  const auto p1 = ev.out.find(vt), p2 = mb.back().find(vt);
  ASSERT_NE(p1, std::string::npos);
  ASSERT_NE(p2, std::string::npos);
  EXPECT_EQ(std::stod(ev.out.substr(p1 + vt.size())), std::stod(mb.back().substr(p2 + vt.size()))) << ev.out;
}

TEST(CheckpointCli, KillDashNineDuringAWriteLeavesThePreviousCheckpointInCharge) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  const std::string args = "--schedule constant --checkpoint-dir " + ck.string() +
                           " --checkpoint-every 2 --resume auto --loss-log " + (d / "loss.jsonl").string();
  const CliRun first = run(train_args("--max-steps 4 " + args));
  ASSERT_EQ(first.code, 0) << first.out;
  ASSERT_EQ(renaissance::io::read_checkpoint((ck / "latest.h5").string()).state.step, 4);
  // The next write (step 6) sleeps half-way; kill -9 the writer while its temporary file exists.
  Child c =
      start(train_args("--max-steps 10 " + args), d / "killed.log", {"RENAISSANCE_TEST_CHECKPOINT_DELAY_MS=60000"});
  fs::path tmp;
  ASSERT_TRUE(wait_for([&] {
    for (const auto& e : fs::directory_iterator(ck))
      if (e.path().filename().string().rfind("ckpt-step00000006.h5.tmp-", 0) == 0) {
        tmp = e.path();
        return true;
      }
    return false;
  })) << "no checkpoint write in flight";
  ASSERT_EQ(::kill(c.pid, SIGKILL), 0);
  EXPECT_EQ(c.wait().code, 128 + SIGKILL);
  EXPECT_TRUE(fs::exists(tmp));                           // the partial file stays a temporary
  EXPECT_FALSE(fs::exists(ck / "ckpt-step00000006.h5"));  // never under a checkpoint's name
  EXPECT_EQ(fs::read_symlink(ck / "latest.h5").string(), "ckpt-step00000004.h5");
  const CliRun inspect_tmp = run("checkpoint inspect " + tmp.string());
  EXPECT_NE(inspect_tmp.code, 0) << inspect_tmp.out;
  // --resume auto picks step 4, and the run completes.
  const CliRun resumed = run(train_args("--max-steps 10 " + args));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("ckpt-step00000004.h5 at step 4"), std::string::npos) << resumed.out;
  EXPECT_FALSE(fs::exists(tmp));  // stale temporaries are cleared by the next save
  EXPECT_EQ(renaissance::io::read_checkpoint((ck / "latest.h5").string()).state.step, 10);
  // The killed run logged steps 5 and 6 after the checkpoint of step 4; the resumed run logs them again, so they were
  // in the loss log twice. It drops them first: every step once, in order.
  EXPECT_NE(resumed.out.find("--loss-log: dropped 2 lines past step 4"), std::string::npos) << resumed.out;
  const auto log = lines_of(d / "loss.jsonl");
  ASSERT_EQ(log.size(), 10u);
  for (std::size_t i = 0; i < log.size(); ++i)
    EXPECT_EQ(log[i].rfind("{\"step\":" + std::to_string(i + 1) + ",", 0), 0u) << log[i];
}

// The resume's cut of --loss-log: lines past the checkpoint and a partial last line (a run killed mid-write) go, the
// file is cut in place (mode and hard links stay; it was rewritten through a rename); the process's own stdout as
// the log (`--loss-log /dev/stdout >> job.out`, a Slurm job's output) is written through stdout and never replaced
// (the rename put a new file in its place, and the rest of the job's output went to the unlinked one).
TEST(CheckpointCli, ResumedLogsAreCutInPlaceAndStdoutIsNeverReplaced) {
  const fs::path d = temp_dir();
  const fs::path log = d / "loss.jsonl", link = d / "loss-link.jsonl";
  const std::string common = "--schedule constant --checkpoint-every 4 --resume auto --checkpoint-dir ";
  auto kill_after_checkpoint_4 = [](const fs::path& ck) {  // as if killed after the checkpoint of step 4
    fs::remove(ck / "ckpt-step00000006.h5");
    fs::remove(ck / "latest.h5");
  };
  ASSERT_EQ(run(train_args("--max-steps 6 --loss-log " + log.string() + " " + common + (d / "ck").string())).code, 0);
  kill_after_checkpoint_4(d / "ck");
  { std::ofstream(log, std::ios::app) << "{\"step\":7,\"ep"; }  // killed mid-line
  fs::permissions(log, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_hard_link(log, link);
  const CliRun resumed =
      run(train_args("--max-steps 10 --loss-log " + log.string() + " " + common + (d / "ck").string()));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("--loss-log: dropped 3 lines past step 4 or cut short"), std::string::npos) << resumed.out;
  const auto lines = lines_of(log);
  ASSERT_EQ(lines.size(), 10u);
  for (std::size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(lines[i].rfind("{\"step\":" + std::to_string(i + 1) + ",", 0), 0u) << lines[i];
  EXPECT_EQ(fs::status(log).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_TRUE(fs::equivalent(log, link)) << "the hard link was split";
  // The log on the job's own output file.
  const fs::path out = d / "job.out";
  { std::ofstream(out) << "HEADER\n"; }
  const std::string sh = "exec " + std::string(RENAISSANCE_CLI) + " " +
                         train_args("--loss-log /dev/stdout " + common + (d / "ck2").string()) + " >> " + out.string() +
                         " 2>&1";
  ASSERT_EQ(std::system((sh + " --max-steps 6").c_str()), 0) << lines_of(out).back();
  kill_after_checkpoint_4(d / "ck2");
  struct stat before {};
  ASSERT_EQ(::stat(out.c_str(), &before), 0);
  ASSERT_EQ(std::system((sh + " --max-steps 10").c_str()), 0) << lines_of(out).back();
  struct stat after {};
  ASSERT_EQ(::stat(out.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "the job's output file was replaced";
  const auto job = lines_of(out);
  ASSERT_FALSE(job.empty());
  EXPECT_EQ(job.front(), "HEADER");  // the fresh run did not truncate it
  EXPECT_EQ(job.back().rfind("done: 10 steps", 0), 0u) << job.back();
  std::size_t step10 = 0;
  for (const std::string& l : job) step10 += l.rfind("{\"step\":10,", 0) == 0;
  EXPECT_EQ(step10, 1u);
}

TEST(CheckpointCli, CorruptOrTruncatedCheckpointsFailNamingTheFileAndTensor) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  const CliRun first = run(train_args("--max-steps 6 --schedule constant --checkpoint-dir " + ck.string() +
                                      " --checkpoint-every 3 --keep 3"));
  ASSERT_EQ(first.code, 0) << first.out;
  const fs::path good = ck / "ckpt-step00000003.h5", newest = ck / "ckpt-step00000006.h5";
  const fs::path cut = d / "cut.h5";
  fs::copy_file(good, cut);  // truncated below
  const CliRun ok = run("checkpoint inspect " + good.string());
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("valid"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("cbr1.conv.w.m"), std::string::npos) << ok.out;
  const CliRun js = run("checkpoint inspect --json " + good.string());
  EXPECT_EQ(js.code, 0) << js.out;
  EXPECT_NE(js.out.find("\"valid\":true"), std::string::npos) << js.out;
  // Integer attributes as JSON numbers (they were strings: "step":"6"), text as strings.
  EXPECT_NE(js.out.find("\"step\":3,"), std::string::npos) << js.out;
  EXPECT_NE(js.out.find("\"format\":\"renaissance-checkpoint\""), std::string::npos) << js.out;

  // A flipped byte in the data of /params/fc1.w of the newest checkpoint.
  flip_byte(newest, offset_of_tensor(newest, "params", "fc1.w") + 17);
  const CliRun bad = run("checkpoint inspect " + newest.string());
  EXPECT_NE(bad.code, 0) << bad.out;
  EXPECT_NE(bad.out.find(newest.string()), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("/params/fc1.w"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("INVALID"), std::string::npos) << bad.out;
  const CliRun bad_json = run("checkpoint inspect --json " + newest.string());
  EXPECT_NE(bad_json.code, 0);
  EXPECT_NE(bad_json.out.find("\"valid\":false"), std::string::npos) << bad_json.out;
  const CliRun resume_bad = run(train_args("--max-steps 8 --resume " + newest.string()));
  EXPECT_NE(resume_bad.code, 0) << resume_bad.out;
  EXPECT_NE(resume_bad.out.find(newest.string()), std::string::npos) << resume_bad.out;
  EXPECT_NE(resume_bad.out.find("/params/fc1.w"), std::string::npos) << resume_bad.out;
  const CliRun eval_bad = run("eval --data " + synthetic() + " --checkpoint " + newest.string());
  EXPECT_NE(eval_bad.code, 0) << eval_bad.out;
  // --resume auto skips it (with a warning) and takes the previous one.
  const CliRun fallback =
      run(train_args("--max-steps 8 --schedule constant --checkpoint-dir " + ck.string() + " --resume auto"));
  ASSERT_EQ(fallback.code, 0) << fallback.out;
  EXPECT_NE(fallback.out.find("skipping"), std::string::npos) << fallback.out;
  EXPECT_NE(fallback.out.find("ckpt-step00000003.h5 at step 3"), std::string::npos) << fallback.out;

  // Truncated.
  fs::resize_file(cut, fs::file_size(cut) / 2);
  const CliRun trunc = run("checkpoint inspect " + cut.string());
  EXPECT_NE(trunc.code, 0) << trunc.out;
  EXPECT_NE(trunc.out.find(cut.string()), std::string::npos) << trunc.out;
  EXPECT_NE(trunc.out.find("truncated"), std::string::npos) << trunc.out;
  const CliRun resume_cut = run(train_args("--max-steps 8 --resume " + cut.string()));
  EXPECT_NE(resume_cut.code, 0);
  EXPECT_NE(resume_cut.out.find(cut.string()), std::string::npos) << resume_cut.out;
}

class PreemptionCli : public ::testing::TestWithParam<int> {};

TEST_P(PreemptionCli, SignalWritesACheckpointExits75AndTheResumedRunContinuesTheSameLossCurve) {
  const int sig = GetParam();
  const fs::path d = temp_dir();
  // The default one-cycle schedule: the learning rate of a step depends on the whole run's length.
  const CliRun full = run(train_args("--loss-log " + (d / "full.jsonl").string()));
  ASSERT_EQ(full.code, 0) << full.out;
  const std::string args = train_args("--checkpoint-dir " + (d / "ck").string() + " --resume auto --loss-log " +
                                      (d / "part.jsonl").string());
  // The preemption's checkpoint write sleeps half-way (a test hook), so the second signal below surely comes after
  // the first was taken.
  Child c = start(args, d / "preempted.log",
                  {"RENAISSANCE_TEST_STEP_DELAY_MS=40", "RENAISSANCE_TEST_CHECKPOINT_DELAY_MS=1000"});
  ASSERT_TRUE(wait_for([&] { return lines_of(d / "part.jsonl").size() >= 3; })) << "no steps";
  ASSERT_EQ(::kill(c.pid, sig), 0);
  // A second signal (Slurm's SIGTERM after the --signal one) during the checkpoint does not rename the cause: the
  // first one is reported. (Both pending at once, the lower-numbered SIGUSR1 would be taken first.)
  ASSERT_TRUE(wait_for([&] {
    for (const auto& e : fs::directory_iterator(d / "ck"))
      if (e.path().filename().string().find(".h5.tmp-") != std::string::npos) return true;
    return false;
  })) << "no checkpoint write in flight";
  ASSERT_EQ(::kill(c.pid, sig == SIGUSR1 ? SIGTERM : SIGUSR1), 0);
  const CliRun pre = c.wait();
  ASSERT_EQ(pre.code, 75) << pre.out;
  EXPECT_NE(pre.out.find(std::string("preempted by ") + (sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM")), std::string::npos)
      << pre.out;
  const auto ck = renaissance::io::read_checkpoint((d / "ck" / "latest.h5").string());
  const std::size_t done = lines_of(d / "part.jsonl").size();
  EXPECT_EQ(static_cast<std::size_t>(ck.state.step), done);  // checkpointed at the step boundary it stopped at
  EXPECT_LT(done, 20u);
  const CliRun resumed = run(args);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  EXPECT_EQ(lines_of(d / "full.jsonl"), lines_of(d / "part.jsonl"));
}

// A signal that lands as the run's last step ends (--max-steps in mid-epoch) is no preemption: the run reports its
// epoch and exits 0, as it would have without the signal (it used to exit 75, and the resumed run, with nothing left
// to train, reported nothing: the epoch's metrics were lost).
TEST(PreemptionAtTheEnd, ASignalWithTheLastStepEndsTheRunNormally) {
  const fs::path d = temp_dir();
  const std::string common = "--max-steps 2 --metrics ";
  const CliRun full = run(train_args(common + (d / "mfull.jsonl").string()));
  ASSERT_EQ(full.code, 0) << full.out;
  const std::string args = train_args(common + (d / "mpart.jsonl").string() + " --checkpoint-dir " +
                                      (d / "ck").string() + " --resume auto --loss-log " + (d / "part.jsonl").string());
  Child c = start(args, d / "signalled.log", {"RENAISSANCE_TEST_STEP_DELAY_MS=1500"});
  ASSERT_TRUE(wait_for([&] { return lines_of(d / "part.jsonl").size() >= 2; })) << "no steps";
  ASSERT_EQ(::kill(c.pid, SIGTERM), 0);  // while the last step's delay runs: before the step's stop agreement
  const CliRun last = c.wait();
  ASSERT_EQ(last.code, 0) << last.out;
  EXPECT_EQ(last.out.find("preempted by"), std::string::npos) << last.out;
  EXPECT_NE(last.out.find("val_top1"), std::string::npos) << last.out;
  const auto field = [](const std::string& line, const std::string& key) {
    const std::size_t at = line.find("\"" + key + "\":");
    return at == std::string::npos ? std::string() : line.substr(at, line.find(',', at) - at);
  };
  const auto a = lines_of(d / "mfull.jsonl"), b = lines_of(d / "mpart.jsonl");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  for (const char* k : {"step", "train_loss", "val_loss", "val_top1"}) {
    EXPECT_FALSE(field(a[0], k).empty()) << k << " in " << a[0];
    EXPECT_EQ(field(a[0], k), field(b[0], k)) << a[0] << "\n" << b[0];
  }
}

// A signal during the start-up (before the options are even parsed: MPI_Init of many ranks, reading a checkpoint)
// killed the process (exit 138 for SIGUSR1: no job script requeues that). The handlers are armed first thing for a
// `train` that may checkpoint: the run stops at its first step boundary with a checkpoint and exits 75, and the
// resumed run continues. Without a checkpoint directory (a --config that names none) the signal keeps its default.
TEST(PreemptionAtTheStart, ASignalDuringTheStartUpIsKeptForTheFirstStep) {
  const fs::path d = temp_dir();
  const std::string args = train_args("--checkpoint-dir " + (d / "ck").string() + " --resume auto");
  Child c = start(args, d / "early.log", {"RENAISSANCE_TEST_STARTUP_DELAY_MS=3000"});
  const auto armed = [](const fs::path& log) {
    return [log] {
      std::ifstream f(log);
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str().find("preemption handlers armed") != std::string::npos;
    };
  };
  ASSERT_TRUE(wait_for(armed(d / "early.log"))) << "no start-up line";
  ASSERT_EQ(::kill(c.pid, SIGUSR1), 0);  // during the start-up delay: before MPI, parsing and CheckpointCli::apply
  const CliRun pre = c.wait();
  ASSERT_EQ(pre.code, 75) << pre.out;
  EXPECT_NE(pre.out.find("preempted by SIGUSR1 at step 1"), std::string::npos) << pre.out;
  EXPECT_EQ(renaissance::io::read_checkpoint((d / "ck" / "latest.h5").string()).state.step, 1);
  const CliRun resumed = run(args);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;

  // A --config without a checkpoint directory: the signal taken at once, with its default action.
  const fs::path yaml = d / "run.yaml";
  std::ofstream(yaml) << "epochs: 1\n";
  Child plain =
      start(train_args("--config " + yaml.string()), d / "plain.log", {"RENAISSANCE_TEST_STARTUP_DELAY_MS=3000"});
  ASSERT_TRUE(wait_for(armed(d / "plain.log"))) << "no start-up line";
  ASSERT_EQ(::kill(plain.pid, SIGUSR1), 0);
  const CliRun killed = plain.wait();
  EXPECT_EQ(killed.code, 128 + SIGUSR1) << killed.out;
  EXPECT_EQ(killed.out.find("epoch 1/"), std::string::npos) << killed.out;
  // A parent that ignores the signal (a job script's `trap '' USR1`): it stays ignored, the run trains to its end.
  Child ignoring = start(train_args("--config " + yaml.string() + " --max-steps 2"), d / "ignoring.log",
                         {"RENAISSANCE_TEST_STARTUP_DELAY_MS=3000"}, "trap '' USR1; ");
  ASSERT_TRUE(wait_for(armed(d / "ignoring.log"))) << "no start-up line";
  ASSERT_EQ(::kill(ignoring.pid, SIGUSR1), 0);
  const CliRun ignored = ignoring.wait();
  EXPECT_EQ(ignored.code, 0) << ignored.out;
  EXPECT_NE(ignored.out.find("done: 2 steps"), std::string::npos) << ignored.out;
}

// Before main, the shared libraries' constructors (cuDNN, cuBLASLt, oneDNN, OpenBLAS) took 65-100 ms, and a signal
// then killed a checkpointed run (143/138). The handlers are armed from the executable's .preinit_array, which glibc
// runs before any library's initialiser: the dynamic loader's own trace (LD_DEBUG=libs, set for renaissance only)
// must show the start-up line before its first "calling init:".
TEST(PreemptionAtTheStart, TheHandlersAreArmedBeforeTheLibrariesInitialise) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer build: main arms the handlers (app/main.cpp)";
#endif
  const fs::path d = temp_dir();
  const std::string args =
      train_args("--max-steps 1 --checkpoint-dir " + (d / "ck").string() + " --resume auto");
  Child c = start(args, d / "loader.log", {"RENAISSANCE_TEST_STARTUP_DELAY_MS=1"}, "LD_DEBUG=libs ");
  const CliRun r = c.wait();
  ASSERT_EQ(r.code, 0) << r.out;
  const std::size_t armed = r.out.find("preemption handlers armed");
  const std::size_t first_init = r.out.find("calling init: ");
  ASSERT_NE(armed, std::string::npos) << r.out.substr(0, 4000);
  ASSERT_NE(first_init, std::string::npos) << "no loader trace (LD_DEBUG unsupported?)";
  EXPECT_LT(armed, first_init) << r.out.substr(0, 4000);
}

// inspect --json: integer attributes as JSON numbers, except one a double cannot hold (a --seed up to 2^64 - 1: jq
// read 18446744073709551615 as 18446744073709552000), which stays text.
TEST(CheckpointCli, InspectJsonKeepsLargeIntegersExact) {
  const fs::path d = temp_dir();
  const CliRun t = run("train --data " + synthetic() + " --batch 32 --max-steps 1 --seed 18446744073709551615 " +
                       "--checkpoint-dir " + (d / "ck").string());
  ASSERT_EQ(t.code, 0) << t.out;
  const CliRun js = run("checkpoint inspect --json " + (d / "ck" / "latest.h5").string());
  ASSERT_EQ(js.code, 0) << js.out;
  EXPECT_NE(js.out.find("\"seed\":\"18446744073709551615\""), std::string::npos) << js.out;
  EXPECT_NE(js.out.find("\"step\":1,"), std::string::npos) << js.out;
}

// --max-steps sets the schedule's length: a resume with another one changed the learning rate without a word, and
// one at or below the checkpoint's step trained nothing without a word. A directory whose checkpoints are all
// invalid said "no checkpoint in D" (an unattended requeue looked like a first run).
TEST(CheckpointCli, AResumeWithOtherMaxStepsOrNoValidCheckpointSaysSo) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  ASSERT_EQ(run(train_args("--max-steps 4 --checkpoint-every 2 --keep 3 --checkpoint-dir " + ck.string())).code, 0);
  const CliRun longer = run(train_args("--max-steps 6 --resume " + (ck / "ckpt-step00000002.h5").string()));
  ASSERT_EQ(longer.code, 0) << longer.out;
  EXPECT_NE(longer.out.find("written with --max-steps 4, resumed with --max-steps 6: the learning-rate schedule"),
            std::string::npos)
      << longer.out;
  const CliRun past = run(train_args("--max-steps 3 --resume " + (ck / "ckpt-step00000004.h5").string()));
  ASSERT_EQ(past.code, 0) << past.out;
  EXPECT_NE(past.out.find("the checkpoint is at step 4, past --max-steps 3: no step is trained"), std::string::npos)
      << past.out;
  const CliRun same = run(train_args("--max-steps 4 --resume " + (ck / "ckpt-step00000002.h5").string()));
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_EQ(same.out.find("written with --max-steps"), std::string::npos) << same.out;
  for (const char* f : {"ckpt-step00000002.h5", "ckpt-step00000004.h5"}) fs::resize_file(ck / f, 1000);
  const CliRun fresh = run(train_args("--max-steps 2 --checkpoint-dir " + ck.string() + " --resume auto"));
  ASSERT_EQ(fresh.code, 0) << fresh.out;
  EXPECT_NE(fresh.out.find("no valid checkpoint in " + ck.string() + " (2 skipped, above): starting fresh"),
            std::string::npos)
      << fresh.out;
}

// A resume with other hyper-parameters or augmentations (momentum, label smoothing, ...) changed them without a
// word; the lr, schedule, epochs and data already warned.
TEST(CheckpointCli, AResumeWithOtherHyperParametersSaysWhich) {
  const fs::path d = temp_dir();
  ASSERT_EQ(run(train_args("--max-steps 2 --checkpoint-dir " + (d / "ck").string())).code, 0);
  const CliRun r = run(
      train_args("--max-steps 4 --momentum 0.5 --label-smoothing 0.25 --resume " + (d / "ck" / "latest.h5").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("written with --momentum 0.9 --label-smoothing "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", resumed with --momentum 0.5 --label-smoothing 0.25: the rest of the run trains with the "
                       "new values"),
            std::string::npos)
      << r.out;
  const CliRun same = run(train_args("--max-steps 4 --resume " + (d / "ck" / "latest.h5").string()));
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_EQ(same.out.find("the rest of the run trains with the new values"), std::string::npos) << same.out;
}

// A stop request during an epoch's validation makes that epoch's checkpoint the preemption's: the run trained a step
// of the next epoch and wrote a second checkpoint before it stopped. One step an epoch and a long validation: the
// signal comes once the step's loss is logged (at the step boundary or in the validation: either way the run stops
// at the epoch's end), and the resumed run continues the uninterrupted loss curve.
TEST(CheckpointCli, ASignalDuringValidationStopsAtTheEpochsEnd) {
  const fs::path d = temp_dir();
  const std::string data = (d / "long_val.h5").string();
  renaissance::io::make_synthetic(data, 32, 8000, 28, 28, 1, 10, 2);
  const std::string common = "train --data " + data + " --batch 32 --epochs 3 --seed 3 ";
  const CliRun full = run(common + "--loss-log " + (d / "full.jsonl").string());
  ASSERT_EQ(full.code, 0) << full.out;
  const std::string args =
      common + "--checkpoint-dir " + (d / "ck").string() + " --resume auto --loss-log " + (d / "part.jsonl").string();
  Child c = start(args, d / "preempted.log");
  ASSERT_TRUE(wait_for([&] { return !lines_of(d / "part.jsonl").empty(); })) << "no step";
  ASSERT_EQ(::kill(c.pid, SIGUSR1), 0);
  const CliRun pre = c.wait();
  ASSERT_EQ(pre.code, 75) << pre.out;
  EXPECT_NE(pre.out.find("preempted by SIGUSR1 at step 1"), std::string::npos) << pre.out;
  EXPECT_FALSE(fs::exists(d / "ck" / "ckpt-step00000002.h5")) << pre.out;
  EXPECT_EQ(lines_of(d / "part.jsonl").size(), 1u);
  const CliRun resumed = run(args);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(lines_of(d / "part.jsonl"), lines_of(d / "full.jsonl"));
}

INSTANTIATE_TEST_SUITE_P(Signals, PreemptionCli, ::testing::Values(SIGUSR1, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& i) { return i.param == SIGUSR1 ? "USR1" : "TERM"; });

// A checkpoint of another model is refused as soon as the plan is compiled: before the start-up (on the GPU the
// engine timing and capture, up to 30 s for ResNet-50 with a cold cache), whose line never appears; the same for
// `eval` of a checkpoint or of weights, and for a resume with another --drop-last. The directory is left as it was.
TEST(CheckpointCli, ACheckpointOfAnotherModelIsRefusedBeforeTheStartUp) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  const CliRun first = run(train_args("--max-steps 2 --checkpoint-dir " + ck.string() + " --save " +
                                      (d / "w.h5").string()));
  ASSERT_EQ(first.code, 0) << first.out;
  ASSERT_NE(first.out.find("start-up"), std::string::npos) << "the line this test looks for: " << first.out;
  const auto before = fs::last_write_time(ck / "latest.h5");
  const std::string other = " --model resnet18_fmnist";
  for (const std::string& cmd :
       {train_args("--max-steps 4 --checkpoint-dir " + ck.string() + " --resume auto" + other),
        "eval --data " + synthetic() + " --checkpoint " + (ck / "latest.h5").string() + other,
        "eval --data " + synthetic() + " --weights " + (d / "w.h5").string() + other,
        "predict --data " + synthetic() + " --weights " + (d / "w.h5").string() + " --out " + (d / "p.h5").string() +
            other}) {
    const CliRun r = run(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("a different architecture?"), std::string::npos) << cmd << "\n" << r.out;
    EXPECT_EQ(r.out.find("start-up"), std::string::npos) << cmd << "\n" << r.out;
  }
  const CliRun drop = run(train_args("--max-steps 4 --drop-last --checkpoint-dir " + ck.string() + " --resume auto"));
  EXPECT_EQ(drop.code, 1) << drop.out;
  EXPECT_NE(drop.out.find("--drop-last"), std::string::npos) << drop.out;
  EXPECT_EQ(drop.out.find("start-up"), std::string::npos) << drop.out;
  EXPECT_EQ(fs::last_write_time(ck / "latest.h5"), before);
  EXPECT_FALSE(fs::exists(d / "p.h5"));
  // The same model resumes.
  const CliRun same = run(train_args("--max-steps 4 --checkpoint-dir " + ck.string() + " --resume auto"));
  EXPECT_EQ(same.code, 0) << same.out;
  EXPECT_NE(same.out.find("resumed from"), std::string::npos) << same.out;
}

// The first conv's channels differ across AMP settings (an AMP plan pads the image channels to 8), and only so:
// weights of a model for 3-channel images were cut to the first channel of a 1-channel model's (or zero-padded the
// other way) and scored with exit 0. Refused naming the tensor and both channel counts; AMP weights still load
// into the FP32 plan of the same model.
TEST(CheckpointCli, WeightsForImagesOfOtherChannelsAreRefused) {
  const fs::path d = temp_dir() / "channels";
  fs::create_directories(d);
  const fs::path model3 = d / "cnn3.yaml";
  // The zoo's fmnist_cnn (models/fmnist_cnn.yaml) for RGB images.
  std::ofstream(model3) << "name: fmnist_cnn\ninput: [28, 28, 3]\nlayers:\n"
                           "  - cbr: {out: 32, k: 3, stride: 1, pad: 1}\n  - maxpool: {k: 2, stride: 2, pad: 0}\n"
                           "  - cbr: {out: 64, k: 3, stride: 1, pad: 1}\n  - maxpool: {k: 2, stride: 2, pad: 0}\n"
                           "  - cbr: {out: 64, k: 3, stride: 1, pad: 1}\n  - flatten\n  - fc: {out: 10}\n"
                           "  - softmax_ce: {classes: 10}\n";
  const fs::path data3 = d / "syn3.h5";
  renaissance::io::make_synthetic(data3.string(), 96, 32, 28, 28, 3, 10, 5);
  const std::string w3 = (d / "w3.h5").string(), w1 = (d / "w1.h5").string(), w1amp = (d / "w1amp.h5").string();
  const std::string w3amp = (d / "w3amp.h5").string();
  const std::string ck3 = (d / "ck3").string();
  ASSERT_EQ(run("train --data " + data3.string() + " --model-file " + model3.string() +
                " --batch 32 --max-steps 1 --save " + w3 + " --checkpoint-dir " + ck3)
                .code,
            0);
  ASSERT_EQ(run("train --data " + data3.string() + " --model-file " + model3.string() +
                " --batch 32 --max-steps 1 --amp --save " + w3amp)
                .code,
            0);
  ASSERT_EQ(run("train --data " + synthetic() + " --batch 32 --max-steps 1 --save " + w1).code, 0);
  ASSERT_EQ(run("train --data " + synthetic() + " --batch 32 --max-steps 1 --amp --save " + w1amp).code, 0);
  const std::string on1 = " --data " + synthetic() + " --model fmnist_cnn";
  const std::string on3 = " --data " + data3.string() + " --model-file " + model3.string();
  for (const auto& [cmd, file, counts] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"eval --weights " + w3 + on1, w3,
            "written for a model of 3-channel images; model 'fmnist_cnn' reads 1-channel images"},
           {"predict --out " + (d / "p.h5").string() + " --weights " + w3 + on1, w3,
            "written for a model of 3-channel images; model 'fmnist_cnn' reads 1-channel images"},
           {"eval --checkpoint " + ck3 + "/latest.h5" + on1, "latest.h5",
            "written for a model of 3-channel images; model 'fmnist_cnn' reads 1-channel images"},
           {"eval --weights " + w1 + on3, w1,
            "written for a model of 1-channel images; model 'fmnist_cnn' reads 3-channel images"},
           {"eval --weights " + w1amp + on3, w1amp,
            "written for a model of 1-channel images; model 'fmnist_cnn' reads 3-channel images"},
           // Both padded to 8 channels under AMP: shape for shape the same first conv.
           {"eval --amp --weights " + w3amp + on1, w3amp,
            "written for a model of 3-channel images; model 'fmnist_cnn' reads 1-channel images"},
           {"eval --amp --weights " + w1amp + on3, w1amp,
            "written for a model of 1-channel images; model 'fmnist_cnn' reads 3-channel images"}}) {
    SCOPED_TRACE(cmd);
    const CliRun r = run(cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(file), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(counts), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(d / "p.h5"));
  // The AMP weights (first conv padded to 8 channels) in the FP32 plan of their own model: scored.
  const CliRun amp = run("eval --weights " + w1amp + on1);
  EXPECT_EQ(amp.code, 0) << amp.out;
}

// The rotation across a requeue: the resumed process never read the damaged newer file (latest.h5 pointed at a
// valid one), so it counted it toward --keep and deleted both valid older checkpoints. A file the process knows
// nothing of is read before it is counted.
TEST(CheckpointCli, TheRotationOfARequeuedRunNeverKeepsADamagedFileForAValidOne) {
  const fs::path d = temp_dir();
  const fs::path ck = d / "ck";
  const auto step = [&](int s) { return ck / ("ckpt-step0000000" + std::to_string(s) + ".h5"); };
  ASSERT_EQ(run(train_args("--max-steps 8 --checkpoint-every 2 --keep 4 --checkpoint-dir " + ck.string())).code, 0);
  fs::remove(step(4));
  fs::remove(step(6));
  fs::resize_file(step(8), 1000);
  const std::string resume = " --checkpoint-every 2 --keep 2 --resume auto --checkpoint-dir " + ck.string();
  const CliRun p1 = run(train_args("--max-steps 4" + resume));  // skips 8, resumes from 2, writes 4
  ASSERT_EQ(p1.code, 0) << p1.out;
  EXPECT_TRUE(fs::exists(step(2))) << p1.out;
  EXPECT_TRUE(fs::exists(step(4))) << p1.out;
  const CliRun p2 = run(train_args("--max-steps 6" + resume));  // the requeue: resumes from 4 (latest), writes 6
  ASSERT_EQ(p2.code, 0) << p2.out;
  EXPECT_NE(p2.out.find("resumed from"), std::string::npos) << p2.out;
  EXPECT_TRUE(fs::exists(step(6))) << p2.out;
  EXPECT_TRUE(fs::exists(step(4))) << "the valid previous checkpoint was pruned for the damaged step 8\n" << p2.out;
  EXPECT_FALSE(fs::exists(step(2))) << "beyond --keep 2 valid ones";
  EXPECT_NO_THROW(renaissance::io::read_checkpoint(step(4).string()));
}

TEST(CheckpointCli, OptionErrorsAreClear) {
  const CliRun every = run(train_args("--checkpoint-every 5"));
  EXPECT_NE(every.code, 0);
  EXPECT_NE(every.out.find("--checkpoint-dir"), std::string::npos) << every.out;
  const CliRun bad = run(train_args("--checkpoint-dir /tmp/x --checkpoint-every soon"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("soon"), std::string::npos) << bad.out;
  const CliRun auto_no_dir = run(train_args("--resume auto"));
  EXPECT_NE(auto_no_dir.code, 0);
  EXPECT_NE(auto_no_dir.out.find("--checkpoint-dir"), std::string::npos) << auto_no_dir.out;
}

}  // namespace
