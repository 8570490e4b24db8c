// The flight recorder end to end: real musterd and rank processes run a
// scripted sequence of collectives; `musterctl trace` shows what each rank
// issued (op, dtype, count, root, seq), as JSON Lines and as a table aligned
// by sequence number; a member killed mid-job breaks the group and musterd
// writes every local member's records to a dump named by `musterctl group`
// and `musterctl jobs` (and so does a collective that times out);
// `musterctl why` names a rank that has not entered
// the collective the others are in; a call queued behind a running one shows
// as submitted, the running one as started.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

using Record = std::map<std::string, std::string>;

std::string Ctl(TestDaemon& daemon, std::vector<std::string> args, int* code = nullptr) {
  std::vector<std::string> argv = {RunfilePath("tools/musterctl"), daemon.SocketFlag()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = Run(argv);
  REQUIRE(r.ok());
  if (code != nullptr) *code = r->exit.code;
  return r->out + r->err;
}

// Flat JSON objects, one per line (lines that are not are skipped; a
// trailing comma, as in a dump's record list, is dropped).
std::vector<Record> ParseLines(const std::string& text) {
  std::vector<Record> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripSuffix(line, ",");
    if (!absl::StartsWith(line, "{\"job\"")) continue;
    auto parsed = ParseFlatJsonObject(line);
    if (parsed.ok()) out.push_back(*parsed);
  }
  return out;
}

// Records of `rank` with a sequence number, by it.
std::map<int, Record> OfRank(const std::vector<Record>& records, int rank) {
  std::map<int, Record> out;
  for (const Record& r : records) {
    if (r.at("rank") != std::to_string(rank) || r.at("seq") == "0") continue;
    out[std::stoi(r.at("seq"))] = r;
  }
  return out;
}

void WaitForFile(const std::string& path, absl::Duration timeout) {
  absl::Time until = absl::Now() + timeout;
  while (!FileExists(path) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
}

TEST_CASE("musterctl trace shows what every rank issued; a broken group leaves a dump") {
  auto started = TestDaemon::Start();
  REQUIRE(started.ok());
  TestDaemon& daemon = **started;
  TempDir dir;
  const std::string traced = dir.File("traced"), go = dir.File("go");
  // Group "t" of ranks 0-2 (rank 3 is not a member): seq 1 all_reduce
  // int32x10, 2 broadcast float32x7 from group rank 1, 3 barrier, 4
  // all_gather_object, 5 all_reduce int32x3. Then rank 2 dies while 0 and
  // 1 are in all_reduce #6.
  const std::string common =
      "init;group t 0,1,2;allreduce t 10;bcast t 7 1;cbarrier t;gatherobj t;allreduce t 3;"
      "mark traced;waitfile " +
      go + ";";
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < 4; ++r) {
    std::string script = r == 3   ? "init;group t 0,1,2;mark traced;waitfile " + go + ";sleep 500"
                         : r == 2 ? common + "sleep 300;crash"
                                  : common + "allreduce t 5;sleep 500";
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", "4"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(daemon.store_port())},
                                              {"MUSTER_SOCKET", daemon.socket_path()},
                                              {"MUSTER_JOB_ID", "tr"}};
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), script}, dir.path(), env);
    REQUIRE(p.ok());
    ranks.push_back(std::move(*p));
  }
  // Every rank is past its scripted collectives once each printed "mark".
  absl::Time until = absl::Now() + absl::Seconds(60);
  auto all_marked = [&] {
    for (auto& p : ranks) {
      if (!absl::StrContains(p->Stdout(), "mark traced")) return false;
    }
    return true;
  };
  while (!all_marked() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  std::string outputs;
  for (auto& p : ranks) outputs += p->Stdout() + p->Stderr();
  INFO(outputs);
  REQUIRE(all_marked());

  int code = -1;
  std::string json = Ctl(daemon, {"trace", "tr", "t", "--json"}, &code);
  INFO(json);
  CHECK(code == 0);
  std::vector<Record> records = ParseLines(json);
  struct Expected {
    const char* op;
    const char* dtype;
    const char* count;
    const char* root;
  };
  const Expected expected[] = {{"all_reduce", "int32", "10", "-1"},
                               {"broadcast", "float32", "7", "1"},
                               {"barrier", "uint8", "0", "-1"},
                               {"all_gather_object", "uint8", nullptr, "-1"},
                               {"all_reduce", "int32", "3", "-1"}};
  for (int rank = 0; rank < 3; ++rank) {
    std::map<int, Record> mine = OfRank(records, rank);
    INFO("rank " << rank);
    REQUIRE(mine.size() == 5);
    for (int seq = 1; seq <= 5; ++seq) {
      const Record& r = mine[seq];
      const Expected& e = expected[seq - 1];
      INFO("seq " << seq);
      CHECK(r.at("group") == "t");
      CHECK(r.at("group_rank") == std::to_string(rank));
      CHECK(r.at("op") == e.op);
      CHECK(r.at("dtype") == e.dtype);
      if (e.count != nullptr) CHECK(r.at("count") == e.count);
      CHECK(r.at("root") == e.root);
      CHECK(r.at("device") == "cpu");
      CHECK(r.at("state") == "completed");
      int64_t submitted = 0, started_at = 0, completed = 0;
      CHECK(absl::SimpleAtoi(r.at("submitted_unix_nanos"), &submitted));
      CHECK(absl::SimpleAtoi(r.at("started_unix_nanos"), &started_at));
      CHECK(absl::SimpleAtoi(r.at("completed_unix_nanos"), &completed));
      CHECK(submitted > 0);
      CHECK(submitted <= started_at);
      CHECK(started_at <= completed);
    }
    // all_gather_object's count: this rank's blob (rank + 1 letters).
    CHECK(mine[4].at("count") == std::to_string(rank + 1));
  }
  CHECK(OfRank(records, 3).empty());  // not a member

  // --rank and --last.
  std::vector<Record> last =
      ParseLines(Ctl(daemon, {"trace", "tr", "t", "--rank", "1", "--last", "2", "--json"}));
  REQUIRE(last.size() == 2);
  CHECK(last[0].at("rank") == "1");
  CHECK(last[0].at("seq") == "4");
  CHECK(last[1].at("seq") == "5");

  // The table: a column per rank, a row per sequence number.
  std::string table = Ctl(daemon, {"trace", "tr", "t"}, &code);
  INFO(table);
  CHECK(code == 0);
  CHECK(absl::StrContains(table, "job tr  group t"));
  CHECK(absl::StrContains(table, "RANK 0"));
  CHECK(absl::StrContains(table, "RANK 2"));
  CHECK_FALSE(absl::StrContains(table, "RANK 3"));
  bool row = false;
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    if (absl::StartsWith(line, "2 ") && absl::StrContains(line, "broadcast") &&
        absl::StrContains(line, "float32x7 root 1")) {
      row = true;
      CHECK(std::count(line.begin(), line.end(), 'o') >= 3);  // "ok" per rank
    }
  }
  CHECK(row);
  CHECK(Ctl(daemon, {"trace", "tr", "nosuch"}, &code).find("no formed group") != std::string::npos);
  CHECK(code == 1);

  // Rank 2 dies while 0 and 1 are in all_reduce #6: the group breaks and
  // musterd writes the recorder of all three local members.
  { std::ofstream(go) << "go"; }
  std::string dump;
  until = absl::Now() + absl::Seconds(20);
  while (dump.empty() && absl::Now() < until) {
    // (The members array makes the object non-flat: find the field.)
    std::string group = Ctl(daemon, {"group", "t", "--job", "tr", "--json"});
    size_t at = group.find("\"dump_path\":\"");
    if (at != std::string::npos) {
      size_t end = group.find('"', at + 13);
      dump = group.substr(at + 13, end - at - 13);
    }
    if (dump.empty()) absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(!dump.empty());
  CHECK(absl::StartsWith(dump, daemon.dir().path()));
  WaitForFile(dump, absl::Seconds(10));
  std::string text = ReadFileOrEmpty(dump);
  INFO(text);
  REQUIRE(!text.empty());
  CHECK(absl::StrContains(text, "\"group\":\"t\""));
  CHECK(absl::StrContains(text, "\"state\":\"broken\""));
  CHECK(absl::StrContains(text, "rank 2"));  // the reason names the dead rank
  std::vector<Record> dumped = ParseLines(text);
  for (int rank = 0; rank < 3; ++rank) {
    std::map<int, Record> mine = OfRank(dumped, rank);
    INFO("rank " << rank);
    REQUIRE(mine.size() >= 5);
    for (int seq = 1; seq <= 5; ++seq) CHECK(mine[seq].at("op") == expected[seq - 1].op);
    if (rank < 2) {
      // The survivors' all_reduce #6 is in it (failed, or still waiting).
      REQUIRE(mine.count(6) == 1);
      CHECK(mine[6].at("op") == "all_reduce");
      CHECK(mine[6].at("count") == "5");
      CHECK(mine[6].at("state") != "completed");
    } else {
      CHECK(mine.rbegin()->first == 5);
    }
  }
  std::string jobs = Ctl(daemon, {"jobs"});
  CHECK(absl::StrContains(jobs, "job tr dump: " + dump));
  for (auto& p : ranks) (void)p->Wait(absl::Seconds(30));
}

TEST_CASE("musterctl why names the rank that has not entered a collective, within 1 s") {
  auto started = TestDaemon::Start();
  REQUIRE(started.ok());
  TestDaemon& daemon = **started;
  TempDir dir;
  const std::string go = dir.File("go");
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < 4; ++r) {
    // Rank 3 stops before the second all_reduce, which ranks 0-2 enter.
    std::string script = r == 3 ? "init;allreduce world 4;waitfile " + go + ";allreduce world 4"
                                : "init;allreduce world 4;allreduce world 4";
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", "4"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(daemon.store_port())},
                                              {"MUSTER_SOCKET", daemon.socket_path()},
                                              {"MUSTER_JOB_ID", "stuck"}};
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), script}, dir.path(), env);
    REQUIRE(p.ok());
    ranks.push_back(std::move(*p));
  }
  // The first all_reduce's sequence number, from rank 3's report.
  int64_t first = -1;
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (first < 0 && absl::Now() < until) {
    std::string out = ranks[3]->Stdout();
    size_t at = out.find("allreduce world 4 ok seq=");
    if (at != std::string::npos) first = std::stoll(out.substr(at + 25));
    if (first < 0) absl::SleepFor(absl::Milliseconds(20));
  }
  INFO(ranks[3]->Stdout() << ranks[3]->Stderr());
  REQUIRE(first > 0);
  const std::string expected =
      absl::StrCat("rank 3 has not entered all_reduce #", first + 1, " that ranks 0-2 entered ");
  std::string why;
  absl::Duration took;
  until = absl::Now() + absl::Seconds(20);
  while (absl::Now() < until) {
    absl::Time t0 = absl::Now();
    int code = -1;
    why = Ctl(daemon, {"why", "stuck"}, &code);
    took = absl::Now() - t0;
    REQUIRE(code == 0);
    if (absl::StrContains(why, expected)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  INFO(why);
  CHECK(absl::StrContains(why, "job stuck group world: " + expected));
  CHECK(took < absl::Seconds(1));
  CHECK(absl::StrContains(
      why, absl::StrCat("rank 0: last completed #", first, "; in all_reduce #", first + 1)));
  CHECK(absl::StrContains(
      why, absl::StrCat("rank 3: last completed #", first, "; not in a collective")));
  std::string json = Ctl(daemon, {"why", "stuck", "--json"});
  CHECK(absl::StrContains(json, "\"lagging\":[3]"));
  CHECK(absl::StrContains(json, absl::StrCat("\"seq\":", first + 1)));
  CHECK(absl::StrContains(json, "\"op\":\"all_reduce\""));

  { std::ofstream(go) << "go"; }
  for (auto& p : ranks) {
    auto exit = p->Wait(absl::Seconds(30));
    REQUIRE(exit.ok());
    CHECK(exit->code == 0);
  }
  // Everyone finished: nothing lags.
  why = Ctl(daemon, {"why", "stuck"});
  INFO(why);
  CHECK(absl::StrContains(why, absl::StrCat("job stuck group world: finished: every member left "
                                            "after #",
                                            first + 1, " (all_reduce)")));
}

// The dump path of group `name` of `job` once musterctl shows one ("" if
// none within `timeout`).
std::string WaitForDump(TestDaemon& daemon, const std::string& job, const std::string& name,
                        absl::Duration timeout) {
  absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    std::string group = Ctl(daemon, {"group", name, "--job", job, "--json"});
    size_t at = group.find("\"dump_path\":\"");
    if (at != std::string::npos) {
      size_t end = group.find('"', at + 13);
      if (end > at + 13) return group.substr(at + 13, end - at - 13);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return "";
}

TEST_CASE("a collective that times out leaves a dump (the member broke the segment)") {
  auto started = TestDaemon::Start();
  REQUIRE(started.ok());
  TestDaemon& daemon = **started;
  TempDir dir;
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < 2; ++r) {
    // Rank 1 never calls all_reduce #2: rank 0's times out (group timeout 5 s).
    std::string script = r == 0 ? "init;allreduce world 4;allreduce world 4;sleep 2000"
                                : "init;allreduce world 4;sleep 9000";
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", "2"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(daemon.store_port())},
                                              {"MUSTER_SOCKET", daemon.socket_path()},
                                              {"MUSTER_JOB_ID", "late"},
                                              {"MUSTER_TEST_INIT_TIMEOUT_MS", "5000"}};
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), script}, dir.path(), env);
    REQUIRE(p.ok());
    ranks.push_back(std::move(*p));
  }
  std::string dump = WaitForDump(daemon, "late", "world", absl::Seconds(30));
  INFO(ranks[0]->Stdout() << ranks[0]->Stderr());
  REQUIRE(!dump.empty());
  WaitForFile(dump, absl::Seconds(10));
  std::string text = ReadFileOrEmpty(dump);
  INFO(text);
  CHECK(absl::StrContains(text, "timed out"));
  std::vector<Record> dumped = ParseLines(text);
  std::map<int, Record> zero = OfRank(dumped, 0), one = OfRank(dumped, 1);
  REQUIRE(zero.count(2) == 1);
  CHECK(zero[2].at("op") == "all_reduce");
  CHECK(zero[2].at("state") == "failed");
  CHECK(zero[2].at("error") == "DEADLINE_EXCEEDED");
  REQUIRE(!one.empty());
  CHECK(one.rbegin()->first == 1);
  CHECK(one[1].at("state") == "completed");
  for (auto& p : ranks) (void)p->Wait(absl::Seconds(30));
}

TEST_CASE("a call queued behind a running one shows as submitted, the running one as started") {
  auto started = TestDaemon::Start();
  REQUIRE(started.ok());
  TestDaemon& daemon = **started;
  TempDir dir;
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < 2; ++r) {
    // Rank 0 submits all_reduce #2 and #3 and waits for neither: the
    // executor starts #2 (recorded as it starts), which waits for rank 1;
    // #3 queues behind it (recorded at once, as submitted).
    std::string script = r == 0 ? "init;allreduce world 4;pending world;pending world;sleep 8000"
                                : "init;allreduce world 4;sleep 8000";
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", "2"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(daemon.store_port())},
                                              {"MUSTER_SOCKET", daemon.socket_path()},
                                              {"MUSTER_JOB_ID", "queued"}};
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), script}, dir.path(), env);
    REQUIRE(p.ok());
    ranks.push_back(std::move(*p));
  }
  std::map<int, Record> zero;
  std::string json;
  absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until) {
    json = Ctl(daemon, {"trace", "queued", "world", "--json"});
    zero = OfRank(ParseLines(json), 0);
    if (zero.count(2) == 1 && zero.count(3) == 1 && zero[2].at("state") == "started") break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  INFO(json << ranks[0]->Stdout() << ranks[0]->Stderr());
  REQUIRE(zero.count(2) == 1);
  REQUIRE(zero.count(3) == 1);
  CHECK(zero[1].at("state") == "completed");
  CHECK(zero[2].at("state") == "started");
  CHECK(zero[2].at("op") == "all_reduce");
  CHECK(zero[2].at("count") == "16");
  CHECK(zero[3].at("state") == "submitted");
  CHECK(zero[3].at("started_unix_nanos") == "0");
  int64_t submitted = 0, started_at = 0;
  CHECK(absl::SimpleAtoi(zero[2].at("submitted_unix_nanos"), &submitted));
  CHECK(absl::SimpleAtoi(zero[2].at("started_unix_nanos"), &started_at));
  CHECK(submitted > 0);
  CHECK(submitted <= started_at);
  std::string why = Ctl(daemon, {"why", "queued"});
  // The newest call rank 0 entered is #3 (queued).
  CHECK(absl::StrContains(why, "rank 1 has not entered all_reduce #3 that rank 0 entered"));
}

}  // namespace
}  // namespace muster::testing
