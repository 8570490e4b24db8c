// Tests of muster-run with real processes: embedded daemon lifecycle, rank
// environment, output prefixes, failure summaries, restarts with a new
// generation, SIGINT, an existing daemon, and unmodified PyTorch.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cpus.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

std::string MusterRun() { return RunfilePath("tools/muster-run"); }

// Whether process `pid` is gone, or a zombie its new parent has not reaped.
bool Gone(pid_t pid) {
  std::string stat = ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/stat"));
  size_t paren = stat.rfind(')');
  return stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z");
}

// Whether `condition` holds within `timeout` (checked every 20 ms).
bool Eventually(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

// Keeps muster-run away from any system daemon: nobody answers here.
std::map<std::string, std::string> IsolatedEnv(const TempDir& dir) {
  return {{"MUSTER_SOCKET", dir.File("nobody.sock")}};
}

RunResult Launch(std::vector<std::string> args, const std::map<std::string, std::string>& env,
                 absl::Duration timeout = absl::Seconds(60)) {
  std::vector<std::string> argv = {MusterRun()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = Run(argv, env, timeout);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

TEST_CASE(
    "muster-run starts an embedded musterd, gives each rank its environment, prefixes "
    "output, and stops the daemon") {
  TempDir dir;
  auto r = Launch({"--nproc-per-node", "2", "--job-id", "envjob", "--", "/bin/sh", "-c",
                   "echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "
                   "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK "
                   "MASTER_ADDR=$MASTER_ADDR JOB=$MUSTER_JOB_ID GEN=$MUSTER_GENERATION "
                   "AGENT=$TORCHELASTIC_USE_AGENT_STORE RESTARTS=$TORCHELASTIC_RESTART_COUNT; "
                   "echo PORT=$MASTER_PORT SOCKET=$MUSTER_SOCKET; echo to-stderr >&2"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(absl::StrContains(
        r.out, absl::StrCat("[rank ", rank, "] RANK=", rank, " LOCAL_RANK=", rank,
                            " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 "
                            "JOB=envjob GEN=0 AGENT=True RESTARTS=0")));
    CHECK(absl::StrContains(r.err, absl::StrCat("[rank ", rank, "] to-stderr")));
  }
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("PORT=([0-9]+) SOCKET=(\\S+)")));
  CHECK(std::stoi(m[1]) > 0);
  std::string socket = m[2];
  CHECK(absl::StrContains(r.err, "started an embedded musterd for this job (socket " + socket));
  CHECK(absl::StrContains(r.err, "all 2 local rank(s) exited 0"));
  CHECK_FALSE(FileExists(socket));  // the embedded daemon is gone with its files
}

TEST_CASE("a failing rank stops the others and muster-run names it with its last output") {
  TempDir dir;
  absl::Time start = absl::Now();
  auto r = Launch({"--nproc-per-node", "3", "--", "/bin/sh", "-c",
                   "if [ $RANK = 1 ]; then echo first words; echo last words; exit 3; fi; "
                   "exec sleep 60"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 1);
  CHECK(absl::Now() - start < absl::Seconds(20));
  std::smatch m;
  CHECK(std::regex_search(r.err, m,
                          std::regex("job run-[0-9]+ failed: rank 1 \\(pid [0-9]+\\) exited with "
                                     "status 3; its last output:\n  first words\n  last words")));
  CHECK(absl::StrContains(r.err, "rank 1 (pid"));
  CHECK(absl::StrContains(r.err, "stopping the other ranks"));

  auto killed = Launch({"--nproc-per-node", "2", "--", "/bin/sh", "-c",
                        "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 60"},
                       IsolatedEnv(dir));
  CHECK(killed.exit.code == 1);
  CHECK(absl::StrContains(killed.err, "rank 0 (pid"));
  CHECK(absl::StrContains(killed.err, "was killed by signal 9 (Killed)"));
}

TEST_CASE("--max-restarts restarts every rank with a new generation") {
  TempDir dir;
  auto r = Launch({"--nproc-per-node", "2", "--max-restarts", "2", "--", "/bin/sh", "-c",
                   "echo gen=$MUSTER_GENERATION torch=$TORCHELASTIC_RESTART_COUNT; "
                   "if [ $RANK = 0 ] && [ $MUSTER_GENERATION = 0 ]; then exit 5; fi; sleep 0.3"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  CHECK(absl::StrContains(r.err, "rank 0 (pid"));
  CHECK(absl::StrContains(r.err, "restarting all 2 local rank(s): attempt 2 of 3, generation 1"));
  CHECK(absl::StrContains(r.out, "[rank 0] gen=1 torch=1"));
  CHECK(absl::StrContains(r.out, "[rank 1] gen=1 torch=1"));
  CHECK_FALSE(absl::StrContains(r.out, "gen=2"));
}

TEST_CASE("SIGINT is forwarded to the ranks and muster-run exits 130") {
  TempDir dir;
  auto env = IsolatedEnv(dir);
  auto p = Subprocess::Start({MusterRun(), "--nproc-per-node", "2", "--", "/bin/sh", "-c",
                              "trap 'echo got INT; exit 0' INT; echo pid=$$; "
                              "while true; do sleep 0.05; done"},
                             dir.path(), env);
  REQUIRE(p.ok());
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::string out = (*p)->Stdout();
    if (absl::StrContains(out, "[rank 0] pid=") && absl::StrContains(out, "[rank 1] pid=")) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE((*p)->Signal(SIGINT).ok());
  auto exit = (*p)->Wait(absl::Seconds(15));
  REQUIRE(exit.ok());
  INFO((*p)->Stdout() << (*p)->Stderr());
  CHECK(exit->code == 130);
  CHECK(absl::StrContains((*p)->Stdout(), "[rank 0] got INT"));
  CHECK(absl::StrContains((*p)->Stdout(), "[rank 1] got INT"));
  CHECK(absl::StrContains((*p)->Stderr(), "interrupted by Interrupt; all ranks stopped"));
  std::smatch m;
  std::string out = (*p)->Stdout();
  REQUIRE(std::regex_search(out, m, std::regex("pid=([0-9]+)")));
  CHECK(::kill(std::stoi(m[1]), 0) != 0);  // the rank is gone
}

TEST_CASE("SIGINT while the embedded musterd starts stops muster-run at once with 130") {
  TempDir dir;
  // A musterd that never becomes ready (muster-run would wait 15 s for it)
  // and, like musterd before it serves, does not act on SIGTERM.
  const std::string fake = dir.File("fake-musterd"), pid_file = dir.File("fake.pid");
  {
    std::ofstream script(fake);
    script << "#!/bin/sh\ntrap '' TERM\necho $$ > " << pid_file << ".tmp && mv " << pid_file
           << ".tmp " << pid_file << "\nexec sleep 60\n";
  }
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  auto p = Subprocess::Start({MusterRun(), "--musterd", fake, "--nproc-per-node", "1", "--",
                              "/bin/sh", "-c", "touch " + dir.File("rank-ran")},
                             dir.path(), IsolatedEnv(dir));
  REQUIRE(p.ok());
  REQUIRE(Eventually([&] { return FileExists(pid_file); }, absl::Seconds(10)));
  const pid_t daemon = std::stoi(ReadFileOrEmpty(pid_file));
  const absl::Time sent = absl::Now();
  REQUIRE((*p)->Signal(SIGINT).ok());
  auto exit = (*p)->Wait(absl::Seconds(10));
  REQUIRE(exit.ok());
  INFO((*p)->Stdout() << (*p)->Stderr());
  CHECK(absl::Now() - sent < absl::Seconds(5));
  CHECK(exit->code == 130);
  CHECK(absl::StrContains((*p)->Stderr(), "interrupted by Interrupt before any rank started"));
  CHECK_FALSE(FileExists(dir.File("rank-ran")));
  CHECK(Eventually([&] { return Gone(daemon); }, absl::Seconds(5)));
}

TEST_CASE("SIGINT while muster-run stops the ranks after a failure ends the job: no restart") {
  TempDir dir;
  // Rank 0 fails; rank 1 ignores SIGTERM, so stopping it takes the 30 s
  // grace, during which muster-run is interrupted.
  auto p = Subprocess::Start(
      {MusterRun(), "--nproc-per-node", "2", "--max-restarts", "3", "--stop-grace-seconds", "30",
       "--", "/bin/sh", "-c",
       "if [ $RANK = 0 ]; then sleep 1; exit 1; fi; trap '' TERM; while true; do sleep 0.05; done"},
      dir.path(), IsolatedEnv(dir));
  REQUIRE(p.ok());
  REQUIRE(Eventually([&] { return absl::StrContains((*p)->Stderr(), "stopping the other ranks"); },
                     absl::Seconds(20)));
  REQUIRE((*p)->Signal(SIGINT).ok());
  auto exit = (*p)->Wait(absl::Seconds(15));
  REQUIRE(exit.ok());
  INFO((*p)->Stdout() << (*p)->Stderr());
  CHECK(exit->code == 130);
  CHECK(absl::StrContains((*p)->Stderr(), "interrupted by Interrupt; all ranks stopped"));
  CHECK_FALSE(absl::StrContains((*p)->Stderr(), "restarting"));
}

TEST_CASE("a rank has ended when its process has: what it left running is stopped") {
  TempDir dir;
  // The rank exits 0 while a process it started holds its output open.
  absl::Time start = absl::Now();
  auto r = Launch({"--nproc-per-node", "1", "--", "/bin/sh", "-c",
                   "sleep 60 & echo leftover=$!; "
                   "echo group=$(cut -d' ' -f5 /proc/$$/stat) session=$(cut -d' ' -f6 "
                   "/proc/$$/stat) pid=$$ $(grep SigIgn /proc/$$/status); exit 0"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  CHECK(absl::Now() - start < absl::Seconds(20));
  CHECK(absl::StrContains(r.err,
                          "rank 0 ended 2s ago but processes it started still hold its "
                          "output; stopping its process group"));
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("leftover=([0-9]+)")));
  const pid_t leftover = std::stoi(m[1]);
  CHECK(Eventually([&] { return Gone(leftover); }, absl::Seconds(5)));
  // Each rank leads a process group of its own in muster-run's session (one
  // scheduling group under autogroup), and ignores SIGTTIN and SIGTTOU:
  // reading the terminal fails instead of stopping it.
  REQUIRE(std::regex_search(
      r.out, m, std::regex("group=([0-9]+) session=([0-9]+) pid=([0-9]+) SigIgn:\\s*([0-9a-f]+)")));
  CHECK(m[1] == m[3]);
  CHECK(m[2] != m[3]);
  const uint64_t ignored = std::stoull(m[4], nullptr, 16);
  CHECK((ignored >> (SIGTTIN - 1) & 1) == 1);
  CHECK((ignored >> (SIGTTOU - 1) & 1) == 1);
}

TEST_CASE("ranks and the embedded musterd die with a muster-run killed by SIGKILL") {
  TempDir dir;
  auto p = Subprocess::Start(
      {MusterRun(), "--nproc-per-node", "1", "--", "/bin/sh", "-c", "echo pid=$$; exec sleep 60"},
      dir.path(), IsolatedEnv(dir));
  REQUIRE(p.ok());
  REQUIRE((*p)->AwaitStdout("[rank 0] pid=", absl::Seconds(20)));
  REQUIRE(
      Eventually([&] { return absl::StrContains((*p)->Stderr(), "socket "); }, absl::Seconds(5)));
  std::smatch m;
  std::string out = (*p)->Stdout(), err = (*p)->Stderr();
  REQUIRE(std::regex_search(out, m, std::regex("pid=([0-9]+)")));
  const pid_t rank = std::stoi(m[1]);
  REQUIRE(std::regex_search(err, m, std::regex("socket ([^,) ]+)")));
  const std::string socket = m[1];
  REQUIRE((*p)->Signal(SIGKILL).ok());
  REQUIRE((*p)->Wait(absl::Seconds(10)).ok());
  CHECK(Eventually([&] { return Gone(rank); }, absl::Seconds(5)));
  // Nothing answers at the embedded musterd's socket any more.
  auto probe =
      Run({RunfilePath("tools/musterctl"), "--socket", socket, "status"}, {}, absl::Seconds(20));
  REQUIRE(probe.ok());
  CHECK(probe->exit.code != 0);
  std::filesystem::remove_all(std::filesystem::path(socket).parent_path());  // left by SIGKILL
}

TEST_CASE("console lines end at \\n, \\r\\n or a lone \\r; a line without an end is cut") {
  TempDir dir;
  auto r = Launch({"--nproc-per-node", "1", "--", "/bin/sh", "-c",
                   "printf 'a\\rb\\r\\nc\\n'; head -c 70000 /dev/zero | tr '\\0' x"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  CHECK(absl::StrContains(r.out, "[rank 0] a\n[rank 0] b\n[rank 0] c\n"));
  CHECK(absl::StrContains(r.out, absl::StrCat("[rank 0] ", std::string(65536, 'x'), "\n[rank 0] ",
                                              std::string(70000 - 65536, 'x'), "\n")));
}

TEST_CASE("one node: the ranks reach the embedded store on loopback, whatever --master-addr") {
  TempDir dir;
  auto r = Launch({"--nproc-per-node", "1", "--master-addr", "192.0.2.1", "--", "/bin/sh", "-c",
                   "echo MASTER_ADDR=$MASTER_ADDR"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  CHECK(absl::StrContains(r.out, "[rank 0] MASTER_ADDR=127.0.0.1"));
}

TEST_CASE("muster-run whose output pipe closes still stops its ranks and its musterd") {
  TempDir dir;
  // `| head -n 1`: head exits after the first line; muster-run must not die
  // of SIGPIPE with its daemon and its files left behind.
  const std::string log = dir.File("muster-run.err");
  auto r = Run({"/bin/sh", "-c",
                MusterRun() +
                    " --nproc-per-node 1 -- /bin/sh -c 'for i in $(seq 200); do echo "
                    "line $i; sleep 0.01; done' 2>" +
                    log + " | head -n 1"},
               IsolatedEnv(dir), absl::Seconds(60));
  REQUIRE(r.ok());
  // sh waits for the whole pipeline: muster-run has ended.
  const std::string err = ReadFileOrEmpty(log);
  INFO(r->out << err);
  CHECK(r->out == "[rank 0] line 1\n");
  std::smatch m;
  REQUIRE(std::regex_search(err, m, std::regex("socket ([^,) ]+)")));
  const std::string socket = m[1];
  CHECK(absl::StrContains(err, "all 1 local rank(s) exited 0"));
  CHECK(Eventually([&] { return !FileExists(socket); }, absl::Seconds(10)));
}

TEST_CASE("muster-run uses a running musterd and never reuses a generation there") {
  auto daemon = TestDaemon::Start();
  REQUIRE(daemon.ok());
  std::map<std::string, std::string> env = {{"MUSTER_SOCKET", (*daemon)->socket_path()}};
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto r = Launch({"--nproc-per-node", "2", "--job-id", "persist", "--",
                     RunfilePath("test/muster-test-rank"), "init;barrier world"},
                    env);
    INFO(r.out << r.err);
    CHECK(absl::StrContains(r.err,
                            "using musterd 0.1.0 (pid " + std::to_string((*daemon)->pid()) + ")"));
    CHECK(absl::StrContains(r.out, "[rank 1] rank 1: barrier world ok"));
  }
  auto jobs = Run({RunfilePath("tools/musterctl"), (*daemon)->SocketFlag(), "jobs"});
  REQUIRE(jobs.ok());
  INFO(jobs->out);
  CHECK(absl::StrContains(jobs->out, "persist"));
  std::string squeezed;
  for (char c : jobs->out) {
    if (!(c == ' ' && !squeezed.empty() && squeezed.back() == ' ')) squeezed += c;
  }
  CHECK(absl::StrContains(squeezed, "persist 1 2 2 finished"));  // the second run: generation 1
}

// Waits until `p`'s stdout contains every one of `texts` (at most 30 s).
void AwaitOutput(Subprocess& p, const std::vector<std::string>& texts) {
  absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (true) {
    std::string out = p.Stdout();
    bool all = true;
    for (const std::string& t : texts) all &= absl::StrContains(out, t);
    if (all) return;
    INFO(out << p.Stderr());
    REQUIRE(p.Running());
    REQUIRE(absl::Now() < give_up);
    absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST_CASE("ranks whose musterd is killed fail (not swallowed) and muster-run reports the job") {
  // The ranks exit 1 on their first error, as a program that does not
  // handle it would; the daemon is not muster-run's, so only the ranks'
  // own errors can fail the job.
  auto daemon = TestDaemon::Start();
  REQUIRE(daemon.ok());
  TempDir dir;
  auto p = Subprocess::Start(
      {MusterRun(), "--nproc-per-node", "2", "--job-id", "orphans", "--",
       RunfilePath("test/muster-test-rank"), "init;arloop world;sleep 30000"},
      dir.path(),
      {{"MUSTER_SOCKET", (*daemon)->socket_path()}, {"MUSTER_TEST_EXIT_ON_ERROR", "1"}});
  REQUIRE(p.ok());
  AwaitOutput(**p,
              {"[rank 0] rank 0: arloop world running", "[rank 1] rank 1: arloop world running"});
  std::string gone = absl::StrCat("musterd (pid ", (*daemon)->pid(),
                                  ", unix:", (*daemon)->socket_path(), ") is gone");
  absl::Time killed = absl::Now();
  REQUIRE((*daemon)->Stop(SIGKILL).ok());
  auto exit = (*p)->Wait(absl::Seconds(20));
  REQUIRE(exit.ok());
  INFO((*p)->Stdout() << (*p)->Stderr());
  CHECK(exit->code == 1);
  CHECK(absl::Now() - killed < absl::Seconds(10));
  std::string err = (*p)->Stderr();
  std::smatch m;
  CHECK(std::regex_search(err, m,
                          std::regex("job orphans failed: rank [01] \\(pid [0-9]+\\) exited with "
                                     "status 1; its last output:\n[\\s\\S]*  rank [01]: arloop "
                                     "world error UNAVAILABLE: ")));
  CHECK(absl::StrContains(err, gone));
}

TEST_CASE("muster-run reports the job failed when its embedded musterd is killed") {
  TempDir dir;
  auto p =
      Subprocess::Start({MusterRun(), "--nproc-per-node", "2", "--job-id", "lost", "--",
                         RunfilePath("test/muster-test-rank"), "init;arloop world;sleep 30000"},
                        dir.path(), IsolatedEnv(dir));
  REQUIRE(p.ok());
  AwaitOutput(**p,
              {"[rank 0] rank 0: arloop world running", "[rank 1] rank 1: arloop world running"});
  std::smatch m;
  std::string err = (*p)->Stderr();
  REQUIRE(
      std::regex_search(err, m, std::regex("embedded musterd for this job \\(socket ([^,)]+)")));
  auto status = Run({RunfilePath("tools/musterctl"), "--socket=" + m[1].str(), "status", "--json"});
  REQUIRE(status.ok());
  std::smatch pid;
  REQUIRE(std::regex_search(status->out, pid, std::regex("\"pid\":([0-9]+)")));
  REQUIRE(::kill(std::stoi(pid[1]), SIGKILL) == 0);
  auto exit = (*p)->Wait(absl::Seconds(20));
  REQUIRE(exit.ok());
  INFO((*p)->Stdout() << (*p)->Stderr());
  CHECK(exit->code == 1);
  CHECK(absl::StrContains((*p)->Stderr(),
                          "job lost failed: the embedded musterd was killed by signal 9"));
}

TEST_CASE("an unmodified PyTorch gloo script runs under muster-run with 4 ranks") {
  auto probe = Run({"/usr/bin/python3", "-c", "import torch.distributed"});
  if (!probe.ok() || probe->exit.code != 0) {
    WARN("MUSTER_TEST_SKIPPED: python3-torch not installed");
    return;
  }
  TempDir dir;
  auto r = Launch(
      {"--nproc-per-node", "4", "--", "/usr/bin/python3", RunfilePath("examples/torch_gloo.py")},
      IsolatedEnv(dir), absl::Seconds(120));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(absl::StrContains(r.out, absl::StrCat("[rank ", rank, "] rank ", rank,
                                                "/4: all_reduce=10 broadcast=42 init_ms=")));
  }
}

TEST_CASE("muster-run rejects bad usage with exit 2") {
  TempDir dir;
  auto none = Launch({"--nproc-per-node", "2"}, IsolatedEnv(dir));
  CHECK(none.exit.code == 2);
  CHECK(absl::StrContains(none.err, "no training script or program"));
  auto nodes = Launch({"--nnodes", "2", "--", "true"}, IsolatedEnv(dir));
  CHECK(nodes.exit.code == 2);
  CHECK(absl::StrContains(nodes.err, "--master-addr and --master-port are required"));
  auto unsupported = Launch({"--numa_binding", "node", "train.py"}, IsolatedEnv(dir));
  CHECK(unsupported.exit.code == 2);
  CHECK(absl::StrContains(unsupported.err, "--numa-binding is not supported by muster-run"));
  // The job id names a directory under --log-dir: no path may be made of it.
  for (const char* id : {"../../etc", "..", "a/b"}) {
    auto escape =
        Launch({"--job-id", id, "--log-dir", dir.File("logs"), "--", "true"}, IsolatedEnv(dir));
    INFO(id << ": " << escape.err);
    CHECK(escape.exit.code == 2);
    CHECK(absl::StrContains(escape.err, "job id"));
  }
  auto missing = Launch({"--", "/nonexistent/binary"}, IsolatedEnv(dir));
  CHECK(missing.exit.code == 1);
  CHECK(absl::StrContains(missing.err, "cannot run /nonexistent/binary"));
  CHECK(absl::StrContains(missing.err, "exited with status 127"));
}

std::string TestRank() { return RunfilePath("test/muster-test-rank"); }

TEST_CASE("while a rank is held back, a progress line names it and how long is left") {
  TempDir dir;
  auto r = Launch(
      {"--nproc-per-node", "3", "--", "/bin/sh", "-c",
       "if [ \"$RANK\" = 2 ]; then sleep 3; fi; exec " + TestRank() + " 'init;barrier world'"},
      IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  CHECK(std::regex_search(r.err, std::regex("waiting for ranks: 2 of 3 joined \\(missing: 2\\); "
                                            "[0-9]+ s left of the ranks' default 30 min "
                                            "timeout")));
  CHECK(absl::StrContains(r.err, "muster-run: all 3 ranks joined"));
}

TEST_CASE("--log-dir, --redirects and --tee write torchrun's layout; the console shows the rest") {
  TempDir dir;
  const std::string logs = dir.File("logs");
  auto r = Launch(
      {"--nproc-per-node", "2", "--rdzv-id", "layout", "--log-dir", logs, "--redirects", "0:1",
       "--tee", "1:3", "--no-python", "/bin/sh", "-c", "echo out-$RANK; echo err-$RANK >&2"},
      IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  // Rank 0's stdout goes to its file only; rank 1's streams to both.
  CHECK_FALSE(absl::StrContains(r.out, "out-0"));
  CHECK(absl::StrContains(r.err, "[rank 0] err-0"));
  CHECK(absl::StrContains(r.out, "[rank 1] out-1"));
  CHECK(absl::StrContains(r.err, "[rank 1] err-1"));
  auto listing = Run({"/usr/bin/find", logs, "-type", "f"});
  REQUIRE(listing.ok());
  INFO(listing->out);
  std::smatch m;
  REQUIRE(std::regex_search(listing->out, m,
                            std::regex(logs + "/(layout_[a-z0-9_]{8})/attempt_0/0/stdout.log")));
  const std::string attempt = logs + "/" + std::string(m[1]) + "/attempt_0";
  CHECK(ReadFileOrEmpty(attempt + "/0/stdout.log") == "out-0\n");
  CHECK_FALSE(FileExists(attempt + "/0/stderr.log"));
  CHECK(ReadFileOrEmpty(attempt + "/1/stdout.log") == "out-1\n");
  CHECK(ReadFileOrEmpty(attempt + "/1/stderr.log") == "err-1\n");
  auto refused = Launch({"--redirects", "3", "--no-python", "/bin/true"}, IsolatedEnv(dir));
  CHECK(refused.exit.code == 2);
  CHECK(absl::StrContains(refused.err, "--redirects and --tee write under --log-dir"));
}

TEST_CASE("a failed rank's error file (TORCHELASTIC_ERROR_FILE) is quoted in the summary") {
  TempDir dir;
  auto r = Launch({"--nproc-per-node", "2", "--no-python", "/bin/sh", "-c",
                   "if [ \"$RANK\" = 1 ]; then printf '{\"message\": {\"message\": \"ValueError: "
                   "bad batch\", \"extraInfo\": {\"py_callstack\": \"...\"}}}' > "
                   "\"$TORCHELASTIC_ERROR_FILE\"; exit 3; fi; sleep 30"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 1);
  CHECK(std::regex_search(r.err, std::regex("rank 1 \\(pid [0-9]+\\) exited with status 3: "
                                            "ValueError: bad batch \\(its error file [^)]*"
                                            "/attempt_0/1/error.json\\)")));
}

TEST_CASE("--rdzv-backend c10d: nodes join through the store in arrival order") {
  TempDir dir;
  const int port = 20000 + ::getpid() % 20000;
  const std::string endpoint = absl::StrCat("127.0.0.1:", port);
  auto node = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {MusterRun(), "--nnodes",       "2",      "--nproc-per-node",
                                     "2",         "--rdzv-backend", "c10d",   "--rdzv-endpoint",
                                     endpoint,    "--rdzv-id",      "rdzvjob"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", TestRank(), "init;barrier world"});
    return args;
  };
  // The first is on the store's address; the second says it is not the host.
  TempDir out;
  auto first = Subprocess::Start(node({}), out.path(), IsolatedEnv(dir));
  REQUIRE(first.ok());
  absl::SleepFor(absl::Milliseconds(1500));
  auto second = Run(node({"--rdzv-conf", "is_host=false,join_timeout=60"}), IsolatedEnv(dir),
                    absl::Seconds(60));
  REQUIRE(second.ok());
  auto done = (*first)->Wait(absl::Seconds(60));
  INFO((*first)->Stdout() << (*first)->Stderr() << second->out << second->err);
  REQUIRE(done.ok());
  CHECK(done->exited);
  CHECK(done->code == 0);
  CHECK(second->exit.code == 0);
  CHECK(absl::StrContains((*first)->Stderr(), "node 0 of 2 (serving the job's store)"));
  CHECK(absl::StrContains(second->err, "node 1 of 2"));
  CHECK(absl::StrContains((*first)->Stderr(), "waiting for nodes: 1 of 2 joined"));
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& out = rank < 2 ? (*first)->Stdout() : second->out;
    CHECK(absl::StrContains(
        out, absl::StrCat("rank ", rank, ": init ok name=world rank=", rank, " size=4")));
  }
}

TEST_CASE("SIGINT while the nodes gather stops muster-run with 130, no rank started") {
  TempDir dir;
  const int port = 21000 + ::getpid() % 19000;
  // One node of two: it serves the store and waits for the other, which
  // never comes.
  auto p =
      Subprocess::Start({MusterRun(), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend",
                         "c10d", "--rdzv-endpoint", absl::StrCat("127.0.0.1:", port), "--rdzv-id",
                         "gatherjob", "--", "/bin/sh", "-c", "touch " + dir.File("rank-ran")},
                        dir.path(), IsolatedEnv(dir));
  REQUIRE(p.ok());
  REQUIRE(Eventually([&] { return absl::StrContains((*p)->Stderr(), "waiting for nodes"); },
                     absl::Seconds(20)));
  REQUIRE((*p)->Signal(SIGINT).ok());
  auto exit = (*p)->Wait(absl::Seconds(15));
  REQUIRE(exit.ok());
  INFO((*p)->Stdout() << (*p)->Stderr());
  CHECK(exit->code == 130);
  CHECK(absl::StrContains((*p)->Stderr(), "interrupted by Interrupt before any rank started"));
  CHECK_FALSE(FileExists(dir.File("rank-ran")));
}

TEST_CASE("--nnodes MIN:MAX closes with the nodes that came once no more come") {
  TempDir dir;
  const int port = 20000 + (::getpid() + 7) % 20000;
  auto r = Launch({"--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "muster",
                   "--rdzv-endpoint", absl::StrCat("127.0.0.1:", port), "--rdzv-conf",
                   "last_call_timeout=2", "--", TestRank(), "init;barrier world"},
                  IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  CHECK(absl::StrContains(r.err, "the job's nodes gathered: 1"));
  CHECK(absl::StrContains(r.out, "rank 1: init ok name=world rank=1 size=2"));
}

TEST_CASE(
    "--bind cores pins each local rank to one CPU muster-run may use; oversubscribed ranks are "
    "not bound") {
  const std::vector<int> cpus = AllowedCpus();
  REQUIRE(!cpus.empty());
  const std::string show_cpus =
      "echo CPUS=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)";
  auto cpus_line = [](int rank) { return absl::StrCat("[rank ", rank, "] CPUS="); };
  TempDir dir;
  // As many ranks as CPUs (at most 2): each on its own.
  const int fit = static_cast<int>(std::min<size_t>(cpus.size(), 2));
  auto r = Launch(
      {"--nproc-per-node", absl::StrCat(fit), "--bind", "cores", "--", "/bin/sh", "-c", show_cpus},
      IsolatedEnv(dir));
  INFO(r.out << r.err);
  CHECK(r.exit.code == 0);
  for (int rank = 0; rank < fit; ++rank) {
    CHECK(absl::StrContains(r.out, absl::StrCat(cpus_line(rank), cpus[rank], "\n")));
  }
  // More ranks than CPUs: none is bound, and muster-run says why.
  std::string inherited;
  {
    auto all =
        Launch({"--nproc-per-node", "1", "--", "/bin/sh", "-c", show_cpus}, IsolatedEnv(dir));
    REQUIRE(all.exit.code == 0);
    size_t at = all.out.find(cpus_line(0));
    REQUIRE(at != std::string::npos);
    at += cpus_line(0).size();
    inherited = all.out.substr(at, all.out.find('\n', at) - at);
  }
  const int over = static_cast<int>(cpus.size()) + 1;
  auto o = Launch(
      {"--nproc-per-node", absl::StrCat(over), "--bind", "cores", "--", "/bin/sh", "-c", show_cpus},
      IsolatedEnv(dir));
  INFO(o.out << o.err);
  CHECK(o.exit.code == 0);
  CHECK(absl::StrContains(o.err, absl::StrCat("--bind cores: ", over, " ranks on ", cpus.size(),
                                              " CPU(s): oversubscribed, so the ranks are not "
                                              "bound")));
  for (int rank = 0; rank < over; ++rank) {
    CHECK(absl::StrContains(o.out, absl::StrCat(cpus_line(rank), inherited, "\n")));
  }
  auto floating = Launch({"--nproc-per-node", "1", "--bind", "none", "--", "/bin/sh", "-c",
                          "grep -c . /proc/self/status >/dev/null"},
                         IsolatedEnv(dir));
  CHECK(floating.exit.code == 0);
  auto bad = Launch({"--bind", "sockets", "--", "true"}, IsolatedEnv(dir));
  CHECK(bad.exit.code == 2);
  CHECK(absl::StrContains(bad.err, "--bind must be 'cores' or 'none', not 'sockets'"));
}

}  // namespace
}  // namespace muster::testing
