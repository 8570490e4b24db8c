// A rank's musterd going away is an error in the rank: real musterd and
// rank processes (muster-test-rank); musterd is killed with SIGKILL or
// stopped with SIGTERM while the ranks run all_reduce in a loop on a
// node-local group, or wait in one whose peer never arrives. Every pending
// and later call of every rank must fail with UNAVAILABLE naming the
// daemon's pid and socket, within a second of the kill, and a musterd
// restarted on the same socket must not bring the ranks back.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

struct Rank {
  std::unique_ptr<Subprocess> process;
  ExitInfo exit;
  std::string out;
};

// Rank processes of one job on `daemon`.
class Job {
 public:
  Job(TestDaemon& daemon, std::string job_id, int world, const TempDir& dir)
      : daemon_(daemon), job_id_(std::move(job_id)), world_(world), dir_(dir) {}

  void Start(int rank, const std::string& script, std::map<std::string, std::string> env = {}) {
    env.emplace("RANK", std::to_string(rank));
    env.emplace("WORLD_SIZE", std::to_string(world_));
    env.emplace("MASTER_ADDR", "127.0.0.1");
    env.emplace("MASTER_PORT", std::to_string(daemon_.store_port()));
    env.emplace("MUSTER_SOCKET", daemon_.socket_path());
    env.emplace("MUSTER_JOB_ID", job_id_);
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), script}, dir_.path(), env);
    REQUIRE(p.ok());
    ranks_.push_back(Rank{std::move(*p), {}, ""});
  }

  Rank& rank(int i) { return ranks_[i]; }

  // Waits until rank `i` printed a line containing `text`.
  void AwaitLine(int i, const std::string& text, absl::Duration timeout = absl::Seconds(60)) {
    Subprocess& p = *ranks_[i].process;
    const bool printed = p.AwaitStdout(text, timeout);
    INFO("rank " << i << " stdout: " << p.Stdout() << " stderr: " << p.Stderr());
    REQUIRE(printed);
  }

  // Waits for every rank to exit.
  void WaitAll(absl::Duration timeout = absl::Seconds(60)) {
    for (Rank& r : ranks_) {
      auto exit = r.process->Wait(timeout);
      INFO(r.process->Stdout() << r.process->Stderr());
      REQUIRE(exit.ok());
      r.exit = *exit;
      r.out = r.process->Stdout();
    }
  }

 private:
  TestDaemon& daemon_;
  std::string job_id_;
  int world_;
  const TempDir& dir_;
  std::vector<Rank> ranks_;
};

// The line of `out` that starts with `start`, or "".
std::string Line(const std::string& out, const std::string& start) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, start)) return std::string(line);
  }
  return "";
}

// The at_us= value of a line, or -1.
int64_t AtMicros(const std::string& line) {
  size_t at = line.rfind("at_us=");
  int64_t v = -1;
  if (at != std::string::npos) (void)absl::SimpleAtoi(line.substr(at + 6), &v);
  return v;
}

// Checks that `line` is an UNAVAILABLE error naming the daemon.
void CheckGone(const std::string& line, const std::string& daemon) {
  INFO(line);
  CHECK(absl::StrContains(line, " error UNAVAILABLE: "));
  CHECK(absl::StrContains(line, daemon + " is gone: the session stream ended ("));
}

// Starts the ranks of two jobs on `daemon`, stops it with `signal_number`
// when they are in their collectives, restarts a musterd on its socket and
// checks what every rank saw. Returns the longest time from the signal to
// an in-flight collective's failure.
absl::Duration KillWhileRanksRun(int signal_number) {
  auto started = TestDaemon::Start();
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  std::unique_ptr<TestDaemon> daemon = std::move(*started);
  TempDir dir;
  const std::string go = dir.File("go");
  // "loop": two ranks all_reduce on their world group (shared memory) until
  // it fails, then try more calls that all need the daemon.
  Job loop(*daemon, "loop", 2, dir);
  for (int r = 0; r < 2; ++r) {
    loop.Start(r,
               "init;arloop world;artime world;barrier world;group later 0,1;ring world 64;"
               "destroy world;failures");
  }
  // "stuck": rank 0 waits in an all_reduce that rank 1 joins only after
  // musterd is gone and a new one serves the socket.
  Job stuck(*daemon, "stuck", 2, dir);
  stuck.Start(0, "init;mark waiting;artime world;artime world;barrier world");
  stuck.Start(1, absl::StrCat("init;waitfile ", go, ";artime world;barrier world;group late 0,1"));
  for (int r = 0; r < 2; ++r) loop.AwaitLine(r, absl::StrCat("rank ", r, ": arloop world running"));
  stuck.AwaitLine(0, "rank 0: mark waiting");
  absl::SleepFor(absl::Milliseconds(300));  // rank 0 of "stuck" sleeps on the futex by now

  const std::string gone =
      absl::StrCat("musterd (pid ", daemon->pid(), ", unix:", daemon->socket_path(), ")");
  int64_t signalled_us = absl::ToUnixMicros(absl::Now());
  REQUIRE(daemon->process().Signal(signal_number).ok());
  auto exit = daemon->process().Wait(absl::Seconds(10));
  REQUIRE(exit.ok());
  if (signal_number == SIGKILL) {
    CHECK(exit->signal == SIGKILL);
  } else {
    CHECK(exit->exited);
    CHECK(exit->code == 0);
  }
  // A new musterd on the same socket: the ranks must not come back to it.
  TestDaemonOptions again;
  again.socket_path = daemon->socket_path();
  auto successor = TestDaemon::Start(again);
  INFO(successor.status().ToString());
  REQUIRE(successor.ok());
  { std::ofstream(go) << "go"; }

  loop.WaitAll();
  stuck.WaitAll();
  int64_t slowest_us = 0;
  for (int r = 0; r < 2; ++r) {
    const std::string& out = loop.rank(r).out;
    INFO(out << loop.rank(r).process->Stderr());
    CHECK(loop.rank(r).exit.exited);
    CHECK(loop.rank(r).exit.code == 0);
    std::string p = absl::StrCat("rank ", r, ": ");
    std::string failed = Line(out, p + "arloop world error");
    CheckGone(failed, gone);
    int64_t after_us = AtMicros(failed) - signalled_us;
    CHECK(after_us >= 0);
    CHECK(after_us < 1000000);
    slowest_us = std::max(slowest_us, after_us);
    // Every later call fails the same way, at once.
    for (const char* step :
         {"artime world", "barrier world", "group later 0,1", "ring world 64", "destroy world"}) {
      CheckGone(Line(out, p + step), gone);
    }
    CHECK(absl::StrContains(Line(out, p + "failures ok"), gone + " is gone"));
  }
  {
    const std::string& out = stuck.rank(0).out;
    INFO(out << stuck.rank(0).process->Stderr());
    CHECK(stuck.rank(0).exit.code == 0);
    // The all_reduce that waited for rank 1 was woken, not left to its timeout.
    std::string woken = Line(out, "rank 0: artime world error");
    CheckGone(woken, gone);
    int64_t after_us = AtMicros(woken) - signalled_us;
    CHECK(after_us >= 0);
    CHECK(after_us < 1000000);
    slowest_us = std::max(slowest_us, after_us);
    if (signal_number == SIGKILL) {
      // Woken by its own session's end (a stopping musterd may also abort
      // the segment first, which says less).
      CHECK(absl::StrContains(woken, "all_reduce #1(int32, count 256, SUM) on group 'world': "));
    }
    CheckGone(Line(out, "rank 0: barrier world"), gone);
  }
  {
    // Rank 1 calls only once the successor serves the socket: still the
    // old daemon's death (no silent reattach).
    const std::string& out = stuck.rank(1).out;
    INFO(out << stuck.rank(1).process->Stderr());
    CHECK(stuck.rank(1).exit.code == 0);
    for (const char* step : {"artime world", "barrier world", "group late 0,1"}) {
      CheckGone(Line(out, absl::StrCat("rank 1: ", step)), gone);
    }
  }
  // The successor never saw these jobs.
  auto ranks = Run({RunfilePath("tools/musterctl"), (*successor)->SocketFlag(), "ranks"});
  REQUIRE(ranks.ok());
  CHECK_FALSE(absl::StrContains(ranks->out, "loop"));
  CHECK_FALSE(absl::StrContains(ranks->out, "stuck"));
  return absl::Microseconds(slowest_us);
}

TEST_CASE("musterd killed with SIGKILL: every rank's calls fail UNAVAILABLE within 1 s") {
  absl::Duration slowest = KillWhileRanksRun(SIGKILL);
  WARN("SIGKILL: slowest kill-to-error " << absl::FormatDuration(slowest));
}

TEST_CASE("musterd stopped with SIGTERM: every rank's calls fail UNAVAILABLE within 1 s") {
  absl::Duration slowest = KillWhileRanksRun(SIGTERM);
  WARN("SIGTERM: slowest signal-to-error " << absl::FormatDuration(slowest));
}

}  // namespace
}  // namespace muster::testing
