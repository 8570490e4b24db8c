// Elastic jobs with real processes: a rank killed with SIGKILL under
// `muster-run --restart-policy rank` is replaced while the others keep
// running (their pids unchanged), every rank joins the job's next epoch and
// the job completes with the right result; musterctl shows the epoch, the
// restarts and the reconfiguration; a finished job id runs again on a
// persistent daemon.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

std::string MusterRun() { return RunfilePath("tools/muster-run"); }
std::string ElasticRank() { return RunfilePath("test/muster-elastic-rank"); }
std::string Musterctl() { return RunfilePath("tools/musterctl"); }

// What the ranks of one run printed.
struct RankLines {
  std::map<int, std::set<int>> pids;  // rank -> pids that started it
  std::map<int, std::string> finals;  // rank -> its FINAL line's "total=... epoch=..."
  std::map<int, int> final_pid;
};

RankLines Parse(const std::string& out) {
  RankLines lines;
  std::regex start("START rank=([0-9]+) pid=([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), start); it != std::sregex_iterator();
       ++it) {
    lines.pids[std::stoi((*it)[1])].insert(std::stoi((*it)[2]));
  }
  std::regex final_line(
      "FINAL rank=([0-9]+) (total=[0-9]+ steps=[0-9]+ epoch=[0-9]+) pid=([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), final_line);
       it != std::sregex_iterator(); ++it) {
    lines.finals[std::stoi((*it)[1])] = (*it)[2];
    lines.final_pid[std::stoi((*it)[1])] = std::stoi((*it)[3]);
  }
  return lines;
}

// Sum over steps 1..S of step * (1 + 2 + ... + world).
long long Expected(int steps, int world) {
  long long total = 0;
  for (int s = 1; s <= steps; ++s) total += static_cast<long long>(s) * world * (world + 1) / 2;
  return total;
}

TEST_CASE(
    "SIGKILL of one rank of 4 under --restart-policy rank: only it is restarted, the others "
    "keep their processes, all join epoch 1 and the job completes") {
  auto daemon = TestDaemon::Start();
  REQUIRE(daemon.ok());
  const int steps = 30;
  auto r = Run({MusterRun(),
                "--socket",
                (*daemon)->socket_path(),
                "--nproc-per-node",
                "4",
                "--job-id",
                "elastic",
                "--restart-policy",
                "rank",
                "--max-restarts",
                "1",
                "--",
                ElasticRank(),
                "--steps",
                absl::StrCat(steps),
                "--kill-rank",
                "2",
                "--kill-step",
                "10",
                "--step-ms",
                "5"},
               {}, absl::Seconds(120));
  REQUIRE(r.ok());
  INFO(r->out << r->err);
  CHECK(r->exit.code == 0);
  RankLines lines = Parse(r->out);
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    // The survivors kept their one process; rank 2 had two.
    CHECK(lines.pids[rank].size() == (rank == 2 ? 2u : 1u));
    CHECK(lines.finals[rank] ==
          absl::StrCat("total=", Expected(steps, 4), " steps=", steps, " epoch=1"));
    CHECK(lines.pids[rank].count(lines.final_pid[rank]) == 1);
  }
  CHECK(absl::StrContains(r->err, "rank 2 (pid"));
  CHECK(absl::StrContains(r->err, "restarting it (restart 1 of 1), the other ranks keep running"));
  CHECK(absl::StrContains(r->out, "RECONFIGURED rank=0 epoch=1"));
  // The replacement got MUSTER_RESTART_COUNT=1 and was in epoch 1 after Init.
  CHECK(std::regex_search(r->out, std::regex("START rank=2 pid=[0-9]+ epoch=1 restarts=1")));

  // musterctl shows the epoch, the restart and how epoch 1 came about.
  auto jobs = Run({Musterctl(), (*daemon)->SocketFlag(), "jobs", "--json"});
  REQUIRE(jobs.ok());
  INFO(jobs->out);
  CHECK(absl::StrContains(jobs->out, "\"epoch\":1"));
  CHECK(std::regex_search(jobs->out, std::regex("\"replaced\":\\[2\\],\"took_ms\":[0-9]+")));
  CHECK(absl::StrContains(jobs->out, "failed: its process exited without leaving the job"));
  auto table = Run({Musterctl(), (*daemon)->SocketFlag(), "jobs"});
  REQUIRE(table.ok());
  CHECK(std::regex_search(table->out, std::regex("job elastic[^\n]* epoch 1: rank 2 \\(host [^)]*"
                                                 "\\) failed: [^;]*; replaced rank\\(s\\) 2; "
                                                 "formed [0-9]+ ms after the first failure")));
}

TEST_CASE("a finished job id runs again on a persistent daemon (a fresh epoch, same generation)") {
  auto daemon = TestDaemon::Start();
  REQUIRE(daemon.ok());
  auto run_once = [&](int steps) {
    std::vector<std::unique_ptr<Subprocess>> ranks;
    std::vector<std::unique_ptr<TempDir>> dirs;
    for (int rank = 0; rank < 3; ++rank) {
      dirs.push_back(std::make_unique<TempDir>());
      std::map<std::string, std::string> env = {
          {"RANK", absl::StrCat(rank)},
          {"WORLD_SIZE", "3"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", absl::StrCat((*daemon)->store_port())},
          {"MUSTER_SOCKET", (*daemon)->socket_path()},
          {"MUSTER_JOB_ID", "again"},
      };
      auto p = Subprocess::Start({ElasticRank(), "--steps", absl::StrCat(steps)},
                                 dirs.back()->path(), env);
      REQUIRE(p.ok());
      ranks.push_back(std::move(*p));
    }
    std::string out;
    for (auto& p : ranks) {
      auto exit = p->Wait(absl::Seconds(60));
      REQUIRE(exit.ok());
      INFO(p->Stdout() << p->Stderr());
      CHECK(exit->code == 0);
      out += p->Stdout();
    }
    return Parse(out);
  };
  RankLines first = run_once(3);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(first.finals[rank] == absl::StrCat("total=", Expected(3, 3), " steps=3 epoch=0"));
  }
  // Every rank left: the same id, generation 0, runs again (it was refused
  // with ALREADY_EXISTS before); the new run is the job's next epoch.
  RankLines second = run_once(4);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(second.finals[rank] == absl::StrCat("total=", Expected(4, 3), " steps=4 epoch=1"));
  }
  auto ranks = Run({Musterctl(), (*daemon)->SocketFlag(), "ranks", "--json"});
  REQUIRE(ranks.ok());
  INFO(ranks->out);
  CHECK(absl::StrContains(ranks->out, "\"restarts\":1"));
}

TEST_CASE(
    "shrink and grow: a world of 4 loses rank 3 and goes on as 3; a new process for rank 3 is "
    "admitted at the next epoch and the world is 4 again") {
  auto daemon = TestDaemon::Start();
  REQUIRE(daemon.ok());
  const int steps = 80;
  auto env = [&](int rank, int restarts) {
    return std::map<std::string, std::string>{
        {"RANK", absl::StrCat(rank)},
        {"WORLD_SIZE", "4"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", absl::StrCat((*daemon)->store_port())},
        {"MUSTER_SOCKET", (*daemon)->socket_path()},
        {"MUSTER_JOB_ID", "shrinkgrow"},
        {"MUSTER_RESTART_COUNT", absl::StrCat(restarts)},
    };
  };
  std::vector<std::string> args = {ElasticRank(), "--steps", absl::StrCat(steps), "--shrink", "1",
                                   "--step-ms",   "20"};
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    dirs.push_back(std::make_unique<TempDir>());
    auto p = Subprocess::Start(args, dirs.back()->path(), env(rank, 0));
    REQUIRE(p.ok());
    ranks.push_back(std::move(*p));
  }
  auto eventually = [](const std::function<bool()>& condition) {
    for (int i = 0; i < 1200; ++i) {
      if (condition()) return true;
      absl::SleepFor(absl::Milliseconds(25));
    }
    return false;
  };
  REQUIRE(eventually([&] { return absl::StrContains(ranks[3]->Stdout(), "START rank=3"); }));
  absl::SleepFor(absl::Milliseconds(400));  // some steps in a world of 4
  REQUIRE(ranks[3]->Signal(SIGKILL).ok());
  (void)ranks[3]->Wait(absl::Seconds(10));
  // The survivors go on as a world of 3.
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << ": " << ranks[rank]->Stdout() << ranks[rank]->Stderr());
    REQUIRE(eventually([&] {
      return absl::StrContains(ranks[rank]->Stdout(), "epoch=1") &&
             absl::StrContains(ranks[rank]->Stdout(), "world=3");
    }));
  }
  absl::SleepFor(absl::Milliseconds(300));  // some steps in a world of 3
  // A new process for rank 3 joins; the others admit it at their next step.
  dirs.push_back(std::make_unique<TempDir>());
  auto newcomer = Subprocess::Start(args, dirs.back()->path(), env(3, 1));
  REQUIRE(newcomer.ok());
  std::string all;
  for (int rank = 0; rank < 3; ++rank) {
    auto exit = ranks[rank]->Wait(absl::Seconds(90));
    REQUIRE(exit.ok());
    INFO(ranks[rank]->Stdout() << ranks[rank]->Stderr());
    CHECK(exit->code == 0);
    all += ranks[rank]->Stdout();
  }
  auto exit = (*newcomer)->Wait(absl::Seconds(30));
  REQUIRE(exit.ok());
  INFO((*newcomer)->Stdout() << (*newcomer)->Stderr());
  CHECK(exit->code == 0);
  all += (*newcomer)->Stdout();
  INFO(all);
  RankLines lines = Parse(all);
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(lines.pids[rank].size() == 1u);  // the killed process's output is not in `all`
    CHECK(absl::StrContains(lines.finals[rank], absl::StrCat("steps=", steps, " epoch=2")));
  }
  CHECK(std::regex_search(all, std::regex("FINAL rank=3 [^\n]* world=4")));
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(absl::StrContains(all, absl::StrCat("GREW rank=", rank, " epoch=2 world=4")));
    CHECK(absl::StrContains(all, absl::StrCat("RECONFIGURED rank=", rank, " epoch=1")));
    CHECK(lines.final_pid[rank] == ranks[rank]->pid());
  }
  CHECK(std::regex_search((*newcomer)->Stdout(), std::regex("START rank=3 pid=[0-9]+ epoch=2")));
}

TEST_CASE(
    "a job started with room to grow: 3 of WORLD_SIZE 4 start (MUSTER_MIN_WORLD_SIZE 3), the "
    "4th is admitted later") {
  auto daemon = TestDaemon::Start();
  REQUIRE(daemon.ok());
  auto env = [&](int rank) {
    return std::map<std::string, std::string>{
        {"RANK", absl::StrCat(rank)},
        {"WORLD_SIZE", "4"},
        {"MUSTER_MIN_WORLD_SIZE", "3"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", absl::StrCat((*daemon)->store_port())},
        {"MUSTER_SOCKET", (*daemon)->socket_path()},
        {"MUSTER_JOB_ID", "roomy"},
    };
  };
  std::vector<std::string> args = {ElasticRank(), "--steps",   "60", "--shrink",
                                   "1",           "--step-ms", "20"};
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    if (rank == 3) {
      // The first three run as a world of 3 before the fourth comes.
      for (int i = 0; i < 400 && !absl::StrContains(ranks[0]->Stdout(), "RESUME"); ++i) {
        absl::SleepFor(absl::Milliseconds(25));
      }
      absl::SleepFor(absl::Milliseconds(300));
    }
    dirs.push_back(std::make_unique<TempDir>());
    auto p = Subprocess::Start(args, dirs.back()->path(), env(rank));
    REQUIRE(p.ok());
    ranks.push_back(std::move(*p));
  }
  std::string all;
  for (auto& p : ranks) {
    auto exit = p->Wait(absl::Seconds(90));
    REQUIRE(exit.ok());
    INFO(p->Stdout() << p->Stderr());
    CHECK(exit->code == 0);
    all += p->Stdout();
  }
  INFO(all);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(std::regex_search(all,
                            std::regex(absl::StrCat("START rank=", rank, " pid=[0-9]+ epoch=1 "))));
    CHECK(absl::StrContains(all, absl::StrCat("GREW rank=", rank, " epoch=2 world=4")));
  }
  CHECK(std::regex_search(all, std::regex("START rank=3 pid=[0-9]+ epoch=2 ")));
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(std::regex_search(
        all,
        std::regex(absl::StrCat("FINAL rank=", rank, " [^\\n]*steps=60 epoch=2 [^\\n]*world=4"))));
  }
}

}  // namespace
}  // namespace muster::testing
