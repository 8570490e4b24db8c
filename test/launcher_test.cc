// Tests of muster-run with real processes: embedded daemon lifecycle, rank
// environment, output prefixes, failure summaries, restarts with a new
// generation, SIGINT, an existing daemon, and unmodified PyTorch.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

std::string MusterRun() { return RunfilePath("tools/muster-run"); }

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
  CHECK(absl::StrContains(none.err, "no command to run"));
  auto nodes = Launch({"--nnodes", "2", "--", "true"}, IsolatedEnv(dir));
  CHECK(nodes.exit.code == 2);
  CHECK(absl::StrContains(nodes.err, "--master-addr and --master-port are required"));
  auto missing = Launch({"--", "/nonexistent/binary"}, IsolatedEnv(dir));
  CHECK(missing.exit.code == 1);
  CHECK(absl::StrContains(missing.err, "cannot run /nonexistent/binary"));
  CHECK(absl::StrContains(missing.err, "exited with status 127"));
}

}  // namespace
}  // namespace muster::testing
