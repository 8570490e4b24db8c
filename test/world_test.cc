// Multi-process tests of ranks, the world and process groups: real musterd
// processes and real rank processes (muster-test-rank) that join jobs,
// create groups, hit barriers, fail and misbehave.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

std::unique_ptr<TestDaemon> StartDaemon() {
  auto daemon = TestDaemon::Start();
  INFO(daemon.status().ToString());
  REQUIRE(daemon.ok());
  return *std::move(daemon);
}

struct RankRun {
  std::unique_ptr<Subprocess> process;
  std::string out;
  ExitInfo exit;
};

// Rank processes of one job, all started before any is waited for.
class Job {
 public:
  Job(TestDaemon& daemon, std::string job_id, int world)
      : daemon_(daemon), job_id_(std::move(job_id)), world_(world) {}

  void Start(int rank, const std::string& script, std::map<std::string, std::string> env = {}) {
    env.emplace("RANK", std::to_string(rank));
    env.emplace("WORLD_SIZE", std::to_string(world_));
    env.emplace("MASTER_ADDR", "127.0.0.1");
    env.emplace("MASTER_PORT", std::to_string(daemon_.store_port()));
    env.emplace("MUSTER_SOCKET", daemon_.socket_path());
    env.emplace("MUSTER_JOB_ID", job_id_);
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), script}, dir_.path(), env);
    REQUIRE(p.ok());
    runs_.push_back(RankRun{std::move(*p), "", {}});
  }
  // Waits for every rank; returns all their output lines.
  std::string WaitAll(absl::Duration timeout = absl::Seconds(60)) {
    std::string all;
    for (RankRun& r : runs_) {
      auto exit = r.process->Wait(timeout);
      INFO(r.process->Stdout() << r.process->Stderr());
      REQUIRE(exit.ok());
      r.exit = *exit;
      r.out = r.process->Stdout();
      all += r.out;
      if (!(r.exit.exited && r.exit.code == 0)) {
        all += absl::StrCat("[process ", r.process->pid(), " ", r.exit.Describe(),
                            "; stderr: ", r.process->Stderr(), "]\n");
      }
    }
    return all;
  }
  // Waits until rank process `i` (in Start order) printed `text`.
  void AwaitLine(int i, const std::string& text, absl::Duration timeout = absl::Seconds(60)) {
    Subprocess& p = *runs_[i].process;
    const bool printed = p.AwaitStdout(text, timeout);
    INFO("rank process " << i << " stdout: " << p.Stdout() << " stderr: " << p.Stderr());
    REQUIRE(printed);
  }
  // A path in the job's temp dir, for a rank's "waitfile".
  std::string File(const std::string& name) const { return dir_.File(name); }
  // Creates File(name): ranks waiting for it go on.
  void Release(const std::string& name) { std::ofstream(dir_.File(name)) << name; }
  std::vector<RankRun>& runs() { return runs_; }

 private:
  TestDaemon& daemon_;
  std::string job_id_;
  int world_;
  TempDir dir_;
  std::vector<RankRun> runs_;
};

std::string Ctl(TestDaemon& daemon, std::vector<std::string> args, int* code = nullptr) {
  std::vector<std::string> argv = {RunfilePath("tools/musterctl"), daemon.SocketFlag()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = Run(argv);
  REQUIRE(r.ok());
  if (code != nullptr) *code = r->exit.code;
  return r->out + r->err;
}

// `text` with every run of spaces collapsed to one (for table checks).
std::string Squeeze(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  return out;
}

// The number after "key=" in the rank's line for `step`, or -1.
int64_t Field(const std::string& out, const std::string& line_start, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, line_start)) continue;
    size_t at = line.find(key + "=");
    if (at == absl::string_view::npos) return -1;
    int64_t v = -1;
    absl::string_view rest = line.substr(at + key.size() + 1);
    (void)absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &v);
    return v;
  }
  return -1;
}

TEST_CASE(
    "four ranks init from the environment, form groups and subgroups, and show in "
    "musterctl") {
  auto daemon = StartDaemon();
  Job job(*daemon, "train", 4);
  for (int r = 0; r < 4; ++r) {
    job.Start(r,
              "init;group pair 0,1;subgroups 2;enumerate 0,3/1,2;barrier world;barrier pair;"
              "barrier world;store;mark listed;waitfile " +
                  job.File("go"));
  }
  // The ranks stay registered until musterctl has listed them.
  for (int r = 0; r < 4; ++r) job.AwaitLine(r, absl::StrCat("rank ", r, ": mark listed"));
  int code = 0;
  std::string groups = Ctl(*daemon, {"groups", "--job", "train"}, &code);
  CHECK(code == 0);
  std::string group = Ctl(*daemon, {"group", "world", "--job=train", "--json"}, &code);
  std::string ranks = Ctl(*daemon, {"ranks"});
  std::string jobs = Ctl(*daemon, {"jobs"});
  std::string status = Ctl(*daemon, {"status", "--json"});
  job.Release("go");
  std::string out = job.WaitAll();
  INFO(out);
  for (auto& r : job.runs()) CHECK(r.exit.code == 0);
  for (int r = 0; r < 4; ++r) {
    std::string p = absl::StrCat("rank ", r, ": ");
    CHECK(absl::StrContains(out, p + "init ok name=world rank=" + std::to_string(r) +
                                     " size=4 ranks=0,1,2,3 backend=cpu:gloo"));
    CHECK(absl::StrContains(
        out, p + "group pair 0,1 ok name=pair rank=" + std::to_string(r < 2 ? r : -1) + " size=2"));
    CHECK(absl::StrContains(out, p + "barrier pair " + (r < 2 ? "ok" : "error")));
    CHECK(absl::StrContains(out, p + "store ok from0=0"));
  }
  // new_subgroups(2): {0,1} {2,3}; by enumeration: {0,3} {1,2}.
  // Automatic names count every group this rank created ("pair" was 1).
  CHECK(absl::StrContains(
      out, "rank 3: subgroups 2 ok count=2 mine: name=group_3 rank=1 size=2 ranks=2,3"));
  CHECK(absl::StrContains(
      out, "rank 0: subgroups 2 ok count=2 mine: name=group_2 rank=0 size=2 ranks=0,1"));
  CHECK(absl::StrContains(
      out, "rank 3: enumerate 0,3/1,2 ok count=2 mine: name=group_4 rank=1 size=2 ranks=0,3"));
  CHECK(absl::StrContains(
      out, "rank 2: enumerate 0,3/1,2 ok count=2 mine: name=group_5 rank=1 size=2 ranks=1,2"));
  CHECK(absl::StrContains(out,
                          "rank 2: barrier pair error INVALID_ARGUMENT: rank 2 is not a member"));
  INFO(groups);
  CHECK(absl::StrContains(Squeeze(groups), "train world cpu:gloo ready 4 0,1,2,3"));
  CHECK(absl::StrContains(Squeeze(groups), "train pair cpu:gloo ready 2 0,1"));
  CHECK(absl::StrContains(group, "\"name\":\"world\""));
  CHECK(absl::StrContains(group, "\"state\":\"ready\""));
  CHECK(absl::StrContains(group, "{\"global_rank\":3,\"group_rank\":3,\"node\":"));
  CHECK(absl::StrContains(ranks, "STATE"));
  CHECK(absl::StrContains(ranks, "alive"));
  CHECK(absl::StrContains(Squeeze(jobs), "train 0 4 4 running"));
  CHECK(absl::StrContains(status, "\"sessions\":4"));
  CHECK(absl::StrContains(status, "\"jobs\":1"));
}

TEST_CASE("ranks join from explicit options, with no environment variables") {
  auto daemon = StartDaemon();
  Job job(*daemon, "unused", 2);
  // Empty values count as unset: every setting comes from InitOptions.
  std::map<std::string, std::string> no_env = {{"RANK", ""},          {"WORLD_SIZE", ""},
                                               {"MASTER_ADDR", ""},   {"MASTER_PORT", ""},
                                               {"MUSTER_SOCKET", ""}, {"MUSTER_JOB_ID", ""}};
  for (int r = 0; r < 2; ++r) {
    job.Start(r,
              absl::StrCat("xinit ", r, " 2 ", daemon->store_port(), " ", daemon->socket_path(),
                           " explicit;barrier world;allreduce world 5"),
              no_env);
  }
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(absl::StrContains(out, "rank 0: xinit 0 2 "));
  CHECK(absl::StrContains(out, "explicit ok name=world rank=0 size=2 ranks=0,1"));
  CHECK(absl::StrContains(out, "explicit ok name=world rank=1 size=2 ranks=0,1"));
  CHECK(absl::StrContains(out, "rank 1: allreduce world 5 ok"));
  std::string jobs = Ctl(*daemon, {"jobs"});
  CHECK(absl::StrContains(jobs, "explicit"));
}

TEST_CASE("a rank killed with SIGKILL fails the others' barrier within 2 s, naming it") {
  auto daemon = StartDaemon();
  Job job(*daemon, "crashy", 4);
  for (int r = 0; r < 3; ++r) job.Start(r, "init;barrier world;barrier world 30000;failures");
  job.Start(3, "init;barrier world;sleep 300;crash");
  std::string out = job.WaitAll();
  INFO(out);
  auto& victim = job.runs()[3];
  CHECK(victim.exit.signal == SIGKILL);
  int64_t pid = victim.process->pid();
  for (int r = 0; r < 3; ++r) {
    std::string p = absl::StrCat("rank ", r, ": barrier world 30000 error ABORTED: ");
    CHECK(absl::StrContains(out, p + "barrier 2 on group 'world' aborted: rank 3 (host "));
    CHECK(absl::StrContains(out, absl::StrCat("pid ", pid, ") failed: its process exited")));
    int64_t elapsed = Field(out, absl::StrCat("rank ", r, ": barrier world 30000"), "elapsed_ms");
    CHECK(elapsed >= 200);  // it really waited for rank 3
    CHECK(elapsed < 2300);  // 300 ms of sleep + under 2 s to notice
    CHECK(absl::StrContains(out, absl::StrCat("rank ", r, ": failures ok rank 3 (host")));
  }
  std::string group = Ctl(*daemon, {"group", "world"});
  CHECK(absl::StrContains(group, "state    broken: rank 3"));
  std::string ranks = Ctl(*daemon, {"ranks", "--json"});
  CHECK(absl::StrContains(ranks, "\"rank\":3"));
  CHECK(absl::StrContains(ranks, "\"state\":\"failed\""));
  // The daemon survived and serves a new job.
  Job next(*daemon, "after", 2);
  next.Start(0, "init;barrier world");
  next.Start(1, "init;barrier world");
  std::string out2 = next.WaitAll();
  CHECK(absl::StrContains(out2, "rank 0: barrier world ok"));
  CHECK(absl::StrContains(out2, "rank 1: barrier world ok"));
}

TEST_CASE(
    "group formation that never completes fails with DEADLINE_EXCEEDED naming the "
    "missing ranks") {
  auto daemon = StartDaemon();
  Job job(*daemon, "partial", 4);
  // Ranks 1 and 3 never start; the world group cannot form.
  std::map<std::string, std::string> env = {{"MUSTER_TEST_INIT_TIMEOUT_MS", "1000"}};
  job.Start(0, "init", env);
  job.Start(2, "init", env);
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(absl::StrContains(out,
                          "rank 0: init error DEADLINE_EXCEEDED: formation of group 'world' "
                          "timed out; ranks that never arrived: 1, 3"));
  CHECK(absl::StrContains(out, "rank 2: init error DEADLINE_EXCEEDED"));
}

TEST_CASE("bad registrations are clear errors and do not disturb other jobs") {
  auto daemon = StartDaemon();
  Job good(*daemon, "good", 2);
  good.Start(0, "init;mark joined;waitfile " + good.File("go") + ";barrier world");
  good.Start(1, "init;mark joined;waitfile " + good.File("go") + ";barrier world");
  for (int r = 0; r < 2; ++r) good.AwaitLine(r, absl::StrCat("rank ", r, ": mark joined"));
  {
    Job bad(*daemon, "badrank", 4);
    bad.Start(4, "init");
    std::string out = bad.WaitAll();
    CHECK(absl::StrContains(out,
                            "init error INVALID_ARGUMENT: rank 4 is outside the world of size 4"));
  }
  {
    Job dup(*daemon, "good", 2);  // rank 1 of "good" is alive
    dup.Start(1, "init");
    std::string out = dup.WaitAll();
    CHECK(absl::StrContains(
        out, "init error ALREADY_EXISTS: rank 1 of job 'good' is already registered"));
  }
  {
    Job mismatch(*daemon, "good", 3);
    mismatch.Start(2, "init");
    std::string out = mismatch.WaitAll();
    CHECK(absl::StrContains(
        out,
        "init error INVALID_ARGUMENT: rank 2 says world size 3 but job 'good' has world size 2"));
  }
  {
    Job badjob(*daemon, "no spaces", 1);
    badjob.Start(0, "init");
    std::string out = badjob.WaitAll();
    CHECK(absl::StrContains(out, "init error INVALID_ARGUMENT: job id 'no spaces' may only use"));
  }
  {
    Job badbackend(*daemon, "be", 1);
    badbackend.Start(0, "init;groupb g 0 mpi;groupb h 0 cpu:;group w 0,5;group d 0,0", {});
    std::string out = badbackend.WaitAll();
    INFO(out);
    CHECK(absl::StrContains(out, "groupb g 0 mpi error INVALID_ARGUMENT: unknown backend 'mpi'"));
    CHECK(
        absl::StrContains(out, "groupb h 0 cpu: error INVALID_ARGUMENT: malformed backend config"));
    CHECK(absl::StrContains(
        out,
        "group w 0,5 error INVALID_ARGUMENT: rank 5 in group 'w' is outside the world of size 1"));
    CHECK(absl::StrContains(out, "group d 0,0 error INVALID_ARGUMENT: rank 0 appears twice"));
  }
  int code = 0;
  std::string unknown = Ctl(*daemon, {"group", "nope"}, &code);
  CHECK(code == 1);
  CHECK(absl::StrContains(unknown, "no group 'nope'"));
  good.Release("go");
  std::string out = good.WaitAll();
  CHECK(absl::StrContains(out, "rank 0: barrier world ok"));
  CHECK(absl::StrContains(out, "rank 1: barrier world ok"));
}

TEST_CASE("two jobs on one daemon are independent, also when one of them fails") {
  auto daemon = StartDaemon();
  Job a(*daemon, "job-a", 2);
  Job b(*daemon, "job-b", 2);
  a.Start(0, "init;barrier world;barrier world 20000");
  a.Start(1, "init;barrier world;crash");
  b.Start(0, "init;group same 0,1;barrier world;sleep 1000;barrier world;barrier same");
  b.Start(1, "init;group same 0,1;barrier world;sleep 1000;barrier world;barrier same");
  std::string out_a = a.WaitAll();
  std::string out_b = b.WaitAll();
  INFO(out_a << out_b);
  CHECK(absl::StrContains(out_a, "rank 0: barrier world 20000 error ABORTED"));
  CHECK(absl::StrContains(out_b, "rank 0: barrier same ok"));
  CHECK(absl::StrContains(out_b, "rank 1: barrier same ok"));
  CHECK_FALSE(absl::StrContains(out_b, "error"));
  std::string jobs = Ctl(*daemon, {"jobs"});
  CHECK(absl::StrContains(Squeeze(jobs), "job-a 0 2 2 failed"));
  CHECK(absl::StrContains(Squeeze(jobs), "job-b 0 2 2 finished"));
}

TEST_CASE("a third-party backend registered by name is usable for groups") {
  auto daemon = StartDaemon();
  Job job(*daemon, "custom", 2);
  for (int r = 0; r < 2; ++r) {
    job.Start(r,
              "backend echo;init;groupb e 0,1 echo;groupb mixed 0,1 cpu:echo,cuda:nccl;barrier e;"
              "echocalls;allreduce e 5;echocalls;allreduce mixed 3;echocalls;groupb n 0,1 nccl;"
              "allreduce n 2");
  }
  std::string out = job.WaitAll();
  INFO(out);
  // The registered backend's own communicator ran the collectives.
  for (int r = 0; r < 2; ++r) {
    std::string p = absl::StrCat("rank ", r, ": ");
    CHECK(absl::StrContains(out, p + "echocalls ok calls=0"));
    CHECK(absl::StrContains(out, p + "allreduce e 5 ok"));
    CHECK(absl::StrContains(out, p + "echocalls ok calls=1"));
    CHECK(absl::StrContains(out, p + "allreduce mixed 3 ok"));
    CHECK(absl::StrContains(out, p + "echocalls ok calls=2"));
    // A CUDA-only group has no backend for CPU tensors.
    CHECK(absl::StrContains(out, p + "allreduce n 2 error INVALID_ARGUMENT: all_reduce: CPU "
                                     "tensors on a group without a cpu backend (group 'n', "
                                     "backend 'cuda:nccl'"));
  }
  CHECK(absl::StrContains(
      out, "rank 0: groupb e 0,1 echo ok name=e rank=0 size=2 ranks=0,1 backend=cpu:echo"));
  CHECK(absl::StrContains(out,
                          "rank 1: groupb mixed 0,1 cpu:echo,cuda:nccl ok name=mixed rank=1 size=2 "
                          "ranks=0,1 backend=cpu:echo,cuda:nccl"));
  CHECK(absl::StrContains(out, "rank 1: barrier e ok"));
}

TEST_CASE("musterctl abort fails a job's pending operations with the operator's reason") {
  auto daemon = StartDaemon();
  Job job(*daemon, "victim", 3);
  job.Start(0, "init;mark joined;barrier world 20000;failures");
  job.Start(1, "init;mark joined;barrier world 20000;failures");
  // Rank 2 never enters the barrier: it waits until the abort is done.
  job.Start(2, "init;mark joined;waitfile " + job.File("go"));
  for (int r = 0; r < 3; ++r) job.AwaitLine(r, absl::StrCat("rank ", r, ": mark joined"));
  absl::SleepFor(absl::Milliseconds(300));  // ranks 0 and 1 wait in the barrier by now
  int code = 0;
  Ctl(*daemon, {"abort", "victim", "--reason", "maintenance window"}, &code);
  CHECK(code == 0);
  job.Release("go");
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(absl::StrContains(out,
                          "rank 0: barrier world 20000 error ABORTED: barrier 1 on group 'world' "
                          "aborted: job aborted: maintenance window"));
  CHECK(absl::StrContains(out, "rank 1: failures ok job aborted: maintenance window"));
  Ctl(*daemon, {"abort", "nosuchjob"}, &code);
  CHECK(code == 1);
}

TEST_CASE("destroying a group cancels its pending receives at once, not a second each") {
  // Each rank posts five receives nobody sends to, then drops the group.
  // Every receive fails CANCELLED; the destroy does not wait, per pending
  // receive, for signs that musterd went away (1 s each before).
  auto daemon = StartDaemon();
  Job job(*daemon, "drop", 2);
  for (int r = 0; r < 2; ++r) job.Start(r, "init;group pair 0,1;droprecvs pair 5");
  std::string out = job.WaitAll();
  INFO(out);
  for (int r = 0; r < 2; ++r) {
    const std::string line =
        absl::StrCat("rank ", r, ": droprecvs pair 5 ok cancelled=5 destroy_ms=");
    size_t at = out.find(line);
    REQUIRE(at != std::string::npos);
    int64_t ms = -1;
    std::string digits;
    for (size_t i = at + line.size(); i < out.size() && std::isdigit(out[i]); ++i) digits += out[i];
    REQUIRE(absl::SimpleAtoi(digits, &ms));
    CHECK(ms < 2500);
  }
}

TEST_CASE("a Work outlives its group: Wait after the group was destroyed returns its status") {
  auto daemon = StartDaemon();
  Job job(*daemon, "keep", 2);
  job.Start(0, "init;group pair 0,1;keepwork pair");
  job.Start(1, "init;group pair 0,1;keepwork pair");
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(absl::StrContains(out, "rank 0: keepwork pair ok completed=1 sum=2"));
  CHECK(absl::StrContains(out, "rank 1: keepwork pair ok completed=1 sum=2"));
}

TEST_CASE("local synchronization, tags, rank lookups, destroy and the c10d-style API") {
  auto daemon = StartDaemon();
  Job job(*daemon, "misc", 3);
  // Only members 0 and 2 create "edge" (local synchronization): rank 1
  // never calls, and formation still completes.
  job.Start(0,
            "cinit;group edge 0,2,local;tagged t mytag 0,1,2;lookup edge 2;lookup edge 1;"
            "barrier edge;destroy edge;barrier edge;sleep 300");
  job.Start(1, "cinit;tagged t mytag 0,1,2;waitfile " + job.File("go"));
  job.Start(2,
            "cinit;group edge 0,2,local;tagged t mytag 0,1,2;barrier edge;destroy edge;"
            "destroy edge;sleep 300");
  job.AwaitLine(0, "rank 0: group edge 0,2,local ok");
  std::string edge = Ctl(*daemon, {"group", "edge", "--job", "misc", "--json"});
  job.Release("go");
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(absl::StrContains(out,
                          "rank 0: cinit ok second call: FAILED_PRECONDITION: "
                          "InitProcessGroup was already called"));
  CHECK(
      absl::StrContains(out, "rank 0: group edge 0,2,local ok name=edge rank=0 size=2 ranks=0,2"));
  CHECK(absl::StrContains(out, "rank 2: group edge 0,2,local ok name=edge rank=1 size=2"));
  CHECK(absl::StrContains(out,
                          "rank 1: tagged t mytag 0,1,2 ok name=t rank=1 size=3 ranks=0,1,2 "
                          "backend=cpu:gloo tag=mytag"));
  CHECK(absl::StrContains(out, "rank 0: lookup edge 2 ok group_rank=1 global_rank=2"));
  CHECK(absl::StrContains(out,
                          "rank 0: lookup edge 1 error INVALID_ARGUMENT: rank 1 is not in "
                          "group 'edge'"));
  CHECK(absl::StrContains(out, "rank 0: barrier edge ok"));
  CHECK(absl::StrContains(out, "rank 0: destroy edge ok"));
  CHECK(absl::StrContains(out,
                          "rank 0: barrier edge error FAILED_PRECONDITION: group 'edge' was "
                          "destroyed"));
  CHECK(absl::StrContains(out,
                          "rank 2: destroy edge error FAILED_PRECONDITION: group 'edge' was "
                          "already destroyed by rank 2"));
  CHECK(absl::StrContains(edge, "\"local_synchronization\":true"));
  std::string groups = Ctl(*daemon, {"groups", "--job", "misc"});
  CHECK(absl::StrContains(Squeeze(groups), "misc edge cpu:gloo destroyed 2 0,2"));
}

TEST_CASE(
    "collectives run across rank processes in shared memory; musterctl shows the "
    "sequence numbers") {
  auto daemon = StartDaemon();
  Job job(*daemon, "coll", 4);
  for (int r = 0; r < 4; ++r) {
    job.Start(r,
              "init;allreduce world 100000;bcast world 1001 3;gatherobj world;a2a world;"
              "subgroups 2;allreduce group_1 33;allreduce group_2 33;cbarrier world;"
              "ring world 3000000;ring world 1;async world 5;mark ran;waitfile " +
                  job.File("go"));
  }
  // Every rank ran all its collectives and stays registered until listed.
  for (int r = 0; r < 4; ++r) job.AwaitLine(r, absl::StrCat("rank ", r, ": mark ran"));
  std::string group = Ctl(*daemon, {"group", "world", "--job", "coll", "--json"});
  std::string table = Ctl(*daemon, {"group", "world", "--job", "coll"});
  job.Release("go");
  std::string out = job.WaitAll();
  INFO(out << group << table);
  for (int r = 0; r < 4; ++r) {
    std::string p = absl::StrCat("rank ", r, ": ");
    CHECK(absl::StrContains(out, p + "allreduce world 100000 ok seq=1"));
    CHECK(absl::StrContains(out, p + "bcast world 1001 3 ok"));
    CHECK(absl::StrContains(out, p + "gatherobj world ok a,bb,ccc,dddd"));
    CHECK(absl::StrContains(out, p + "a2a world ok"));
    CHECK(absl::StrContains(out, p + "allreduce group_" + std::to_string(r / 2 + 1) + " 33 ok"));
    CHECK(absl::StrContains(out, p + "cbarrier world ok"));
    CHECK(absl::StrContains(out, p + "ring world 3000000 ok"));
    CHECK(absl::StrContains(out, p + "ring world 1 ok"));
    CHECK(absl::StrContains(out, p + "async world 5 ok"));
  }
  // world ran: all_reduce, broadcast, 2 all_gathers (sizes, data), one
  // all_to_all, the barrier, 5 async all_reduces: 11 (p2p has no sequence).
  CHECK(absl::StrContains(group, "\"last_submitted_seq\":11,\"last_completed_seq\":11"));
  CHECK(absl::StrContains(table, "SUBMITTED"));
}

TEST_CASE(
    "all_gather_coalesced, gather_object and scatter_object move blobs of different sizes at "
    "world 3") {
  auto daemon = StartDaemon();
  Job job(*daemon, "blobs", 3);
  for (int r = 0; r < 3; ++r) {
    job.Start(r,
              "init;agcoal world;gatherbytes world 2;scatterbytes world 0;gatherbytes world 0;"
              "scatterbytes world 2");
  }
  std::string out = job.WaitAll();
  INFO(out);
  for (int r = 0; r < 3; ++r) {
    std::string p = absl::StrCat("rank ", r, ": ");
    CHECK(absl::StrContains(out, p + "agcoal world ok"));
    // Only the root receives the gathered blobs (rank 1's is empty).
    CHECK(absl::StrContains(out,
                            p + "gatherbytes world 2 ok " + (r == 2 ? "n=3 [a,,ccc]" : "n=0 []")));
    CHECK(absl::StrContains(out,
                            p + "gatherbytes world 0 ok " + (r == 0 ? "n=3 [a,,ccc]" : "n=0 []")));
    std::string want = r == 0 ? "[A]" : r == 1 ? "[]" : "[CCCCC]";
    CHECK(absl::StrContains(out, p + "scatterbytes world 0 ok " + want));
    CHECK(absl::StrContains(out, p + "scatterbytes world 2 ok " + want));
  }
}

TEST_CASE(
    "collectives on AllocShared buffers read peers' memory in place; ordinary buffers over "
    "CMA or the slots give the same results") {
  auto daemon = StartDaemon();
  // 300001 int64 (2.3 MB, odd) per rank: over every direct threshold.
  struct Case {
    const char* job;
    const char* mode;
    std::map<std::string, std::string> env;
    int peers;  // peers' allocations mapped by each rank
  };
  for (const Case& c :
       {Case{"zc", "shared", {}, 2}, Case{"cma", "plain", {{"MUSTER_SHM_CMA_MIN_BYTES", "1"}}, 0},
        Case{"slots", "plain", {{"MUSTER_SHM_CMA_MIN_BYTES", "off"}}, 0}}) {
    Job job(*daemon, c.job, 3);
    for (int r = 0; r < 3; ++r) {
      job.Start(r, absl::StrCat("init;bigcoll world 300001 ", c.mode), c.env);
    }
    std::string out = job.WaitAll();
    INFO(c.job << "\n" << out);
    for (int r = 0; r < 3; ++r) {
      CHECK(absl::StrContains(out, absl::StrCat("rank ", r, ": bigcoll world 300001 ", c.mode,
                                                " ok mapped_peers=", c.peers)));
    }
  }
}

TEST_CASE(
    "point to point matches by (peer, tag) in any tag order and receives from any source; the "
    "group keeps working") {
  auto daemon = StartDaemon();
  Job job(*daemon, "p2ptags", 4);
  for (int r = 0; r < 4; ++r) {
    job.Start(r, "init;tagorder world;allreduce world 8;anysrc world;allreduce world 8");
  }
  std::string out = job.WaitAll();
  INFO(out);
  for (int r = 0; r < 4; ++r) {
    std::string p = absl::StrCat("rank ", r, ": ");
    CHECK(absl::StrContains(out, p + "tagorder world ok"));
    CHECK(absl::StrContains(out, p + "allreduce world 8 ok seq=1"));
    CHECK(absl::StrContains(out, p + "anysrc world ok"));
    CHECK(absl::StrContains(out, p + "allreduce world 8 ok seq=2"));
  }
  // Rank 0 was told every sender once.
  size_t at = out.find("rank 0: anysrc world ok senders=");
  REQUIRE(at != std::string::npos);
  std::string senders = out.substr(at + 32, out.find('\n', at) - at - 32);
  std::vector<std::string> got = absl::StrSplit(senders, ',');
  std::sort(got.begin(), got.end());
  CHECK(got == std::vector<std::string>{"1", "2", "3"});
}

TEST_CASE(
    "Work::Wait(timeout) gives up at its deadline whichever thread runs the collective; the "
    "collective goes on") {
  auto daemon = StartDaemon();
  Job job(*daemon, "timedwait", 2);
  job.Start(0,
            "init;timedwait world 300 plain;timedwait world 300 inline;"
            "timedwait world 300 callback");
  job.Start(1,
            "init;sleep 1500;timedwait world 20000 plain;sleep 1500;timedwait world 20000 plain;"
            "sleep 1500;timedwait world 20000 plain");
  std::string out = job.WaitAll();
  INFO(out);
  for (const char* mode : {"plain", "inline", "callback"}) {
    std::string line = absl::StrCat("rank 0: timedwait world 300 ", mode);
    CHECK(absl::StrContains(out, line + " ok first=DEADLINE_EXCEEDED"));
    int64_t ms = Field(out, line, "first_ms");
    CHECK(ms >= 290);
    CHECK(ms < 900);  // not the peer's 1.5 s
  }
  CHECK(absl::StrContains(out, "rank 1: timedwait world 20000 plain ok first=OK"));
}

TEST_CASE("a rank that arrives after the group timed out fails that collective too, at once") {
  auto daemon = StartDaemon();
  Job job(*daemon, "late", 2);
  std::map<std::string, std::string> env = {{"MUSTER_TEST_INIT_TIMEOUT_MS", "2000"}};
  job.Start(0, "init;allreduce world 8;allreduce world 8", env);
  job.Start(1, "init;sleep 4000;allreduce world 8;allreduce world 8", env);
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(
      absl::StrContains(out,
                        "rank 0: allreduce world 8 error DEADLINE_EXCEEDED: all_reduce #1(int32, "
                        "count 8, SUM) on group 'world' timed out waiting for ranks 1 to arrive"));
  CHECK(absl::StrContains(out,
                          "rank 1: allreduce world 8 error ABORTED: all_reduce #1(int32, count 8, "
                          "SUM) on group 'world' aborted: rank 0: all_reduce #1(int32, count 8, "
                          "SUM) on group 'world' timed out waiting for ranks 1 to arrive"));
  CHECK_FALSE(absl::StrContains(out, "allreduce world 8 ok"));
  size_t late = out.find("rank 1: allreduce world 8 error");
  REQUIRE(late != std::string::npos);
  CHECK(Field(out.substr(late), "rank 1: allreduce", "elapsed_ms") < 1000);
}

TEST_CASE("mismatched collectives across processes fail with both signatures") {
  auto daemon = StartDaemon();
  Job job(*daemon, "desync", 2);
  job.Start(0, "init;allreduce world 64;cbarrier world");
  job.Start(1, "init;bcast world 64 0;cbarrier world");
  std::string out = job.WaitAll();
  INFO(out);
  CHECK(absl::StrContains(out,
                          "rank 0: allreduce world 64 error FAILED_PRECONDITION: collectives "
                          "on group 'world' do not match: rank 0 called all_reduce #1(int32, "
                          "count 64, SUM) but rank 1 called broadcast #1(float32, count 64, "
                          "root 0)"));
  CHECK(absl::StrContains(out, "rank 1: bcast world 64 0 error FAILED_PRECONDITION"));
  CHECK(absl::StrContains(out, "rank 0: cbarrier world ok"));
}

TEST_CASE(
    "a rank killed mid-collective fails the others within 2 s; a silent rank times out "
    "naming it") {
  auto daemon = StartDaemon();
  {
    Job job(*daemon, "killed", 3);
    job.Start(0, "init;allreduce world 8");
    job.Start(1, "init;allreduce world 8");
    job.Start(2, "init;sleep 400;crash");
    std::string out = job.WaitAll();
    INFO(out);
    for (int r = 0; r < 2; ++r) {
      std::string line = absl::StrCat("rank ", r,
                                      ": allreduce world 8 error ABORTED: all_reduce #1(int32, "
                                      "count 8, SUM) on group 'world' aborted: rank 2 (host ");
      CHECK(absl::StrContains(out, line));
      int64_t ms = Field(out, absl::StrCat("rank ", r, ": allreduce"), "elapsed_ms");
      CHECK(ms >= 300);
      CHECK(ms < 2400);
    }
  }
  {
    Job job(*daemon, "silent", 3);
    std::map<std::string, std::string> env = {{"MUSTER_TEST_INIT_TIMEOUT_MS", "1500"}};
    job.Start(0, "init;allreduce world 8", env);
    job.Start(1, "init;allreduce world 8", env);
    job.Start(2, "init;sleep 4000", env);
    std::string out = job.WaitAll();
    INFO(out);
    CHECK(absl::StrContains(out,
                            "allreduce world 8 error DEADLINE_EXCEEDED: all_reduce #1(int32, "
                            "count 8, SUM) on group 'world' timed out waiting for ranks 2 "
                            "to arrive"));
  }
  {
    // A segment left by a daemon that died (pid 1 never runs musterd, and a
    // pid far beyond pid_max never runs anything): the next daemon removes
    // the dead one's.
    FILE* f = std::fopen("/dev/shm/muster.999999999.7", "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
    auto next = StartDaemon();
    // (Tests run in parallel: another test's daemon may be the one that
    // removed it, so only the outcome is checked, not which daemon logged.)
    CHECK_FALSE(FileExists("/dev/shm/muster.999999999.7"));
  }
  {
    Job job(*daemon, "monitored", 4);
    job.Start(0, "init;mbarrier world 800");
    job.Start(1, "init;mbarrier world 800");
    job.Start(2, "init;sleep 3000");
    job.Start(3, "init;sleep 3000");
    std::string out = job.WaitAll();
    INFO(out);
    CHECK(absl::StrContains(out,
                            "mbarrier world 800 error DEADLINE_EXCEEDED: barrier #1 on group "
                            "'world' timed out waiting for ranks 2, 3 to arrive"));
  }
  {
    // Rank 0's all_reduce before the barrier is stuck (the others never
    // call it): its monitored barrier still gives up at its own timeout,
    // naming who musterd did not see, not when the all_reduce ends.
    Job job(*daemon, "monitoredstuck", 4);
    std::map<std::string, std::string> env = {{"MUSTER_TEST_INIT_TIMEOUT_MS", "6000"}};
    job.Start(0, "init;pending world;mbarrier world 800", env);
    job.Start(1, "init;sleep 1500;mbarrier world 800", env);
    job.Start(2, "init;sleep 3000", env);
    job.Start(3, "init;sleep 3000", env);
    std::string out = job.WaitAll();
    INFO(out);
    CHECK(absl::StrContains(out,
                            "rank 0: mbarrier world 800 error DEADLINE_EXCEEDED: "
                            "monitored_barrier on group 'world': barrier 1 on group 'world' "
                            "timed out; ranks that never arrived: 1, 2, 3"));
    const int64_t elapsed = Field(out, "rank 0: mbarrier", "elapsed_ms");
    CHECK(elapsed >= 0);
    CHECK(elapsed < 1500);
  }
  CHECK(daemon->process().Running());
}

}  // namespace
}  // namespace muster::testing
