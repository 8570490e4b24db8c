// musterd's /metrics with real daemons and ranks: off unless asked for;
// --metrics-listen 127.0.0.1:0 reports its port in the ready file; every
// scrape parses strictly as Prometheus text; and the numbers move with a
// job's work: ranks and groups by state, collectives completed in shared
// memory, store keys, a rank's failure and the group it broke; the per-op
// collective counters (from the flight recorder) move exactly by what a
// scripted job issued: calls, bytes and durations per op, and a mismatched
// collective in the failures by cause.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/metrics/prometheus_parser.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

absl::StatusOr<ParsedMetrics> Scrape(int port) {
  int fd = ConnectLoopback(port);
  if (fd < 0) return absl::UnavailableError("cannot connect to /metrics");
  std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  (void)::send(fd, request.data(), request.size(), 0);
  std::string reply;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, n);
  ::close(fd);
  size_t body = reply.find("\r\n\r\n");
  if (!absl::StartsWith(reply, "HTTP/1.1 200 OK") || body == std::string::npos) {
    return absl::InternalError("bad reply: " + reply.substr(0, 200));
  }
  return ParsePrometheusText(reply.substr(body + 4));
}

struct Ranks {
  std::vector<std::unique_ptr<Subprocess>> processes;
  TempDir dir;
};

void Start(Ranks& ranks, TestDaemon& daemon, const std::string& job, int world,
           const std::vector<std::string>& scripts) {
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = {
        {"RANK", absl::StrCat(r)},
        {"WORLD_SIZE", absl::StrCat(world)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", absl::StrCat(daemon.store_port())},
        {"MUSTER_SOCKET", daemon.socket_path()},
        {"MUSTER_JOB_ID", job},
    };
    auto p = Subprocess::Start({RunfilePath("test/muster-test-rank"), scripts[r]}, ranks.dir.path(),
                               env);
    REQUIRE(p.ok());
    ranks.processes.push_back(std::move(*p));
  }
}

TEST_CASE("no /metrics unless --metrics-listen; the ready file names its port when it is on") {
  auto plain = TestDaemon::Start();
  REQUIRE(plain.ok());
  CHECK_FALSE(absl::StrContains(ReadFileOrEmpty((*plain)->ready_file()), "metrics_port"));
  auto bad = TestDaemon::Start({{"--metrics-listen=nowhere"}});
  CHECK_FALSE(bad.ok());
}

TEST_CASE("/metrics parses as Prometheus text and moves with a job's work") {
  auto daemon = TestDaemon::Start({{"--metrics-listen=127.0.0.1:0"}});
  REQUIRE(daemon.ok());
  std::smatch m;
  std::string ready = ReadFileOrEmpty((*daemon)->ready_file());
  REQUIRE(std::regex_search(ready, m, std::regex("\"metrics_port\":([0-9]+)")));
  int port = std::stoi(m[1]);

  auto idle = Scrape(port);
  INFO(idle.status());
  REQUIRE(idle.ok());
  CHECK(idle->types.at("muster_store_operations_total") == "counter");
  CHECK(idle->Value("muster_jobs{state=\"running\"}") == 0);
  CHECK(idle->Value("muster_ranks{state=\"alive\"}") == 0);
  CHECK(idle->Value("muster_rank_failures_total") == 0);
  CHECK(idle->types.count("muster_store_operation_duration_seconds") == 1);

  // A job of 3 ranks: collectives in shared memory; rank 2 then dies while
  // the others wait in a barrier.
  Ranks ranks;
  Start(ranks, **daemon, "metered", 3,
        {"init;xops world;store;mark done;barrier world 30000",
         "init;xops world;store;mark done;barrier world 30000",
         "init;xops world;store;mark done;waitfile " + ranks.dir.File("die") + ";crash"});
  // Wait until every rank finished its collectives.
  for (int i = 0; i < 600; ++i) {
    int done = 0;
    for (auto& p : ranks.processes) done += absl::StrContains(p->Stdout(), "mark done");
    if (done == 3) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  auto busy = Scrape(port);
  REQUIRE(busy.ok());
  CHECK(busy->Value("muster_jobs{state=\"running\"}") == 1);
  CHECK(busy->Value("muster_ranks{state=\"alive\"}") == 3);
  CHECK(busy->Value("muster_groups{state=\"ready\"}") >= 1);
  CHECK(busy->Value("muster_segment_collectives{backend=\"cpu:gloo\"}") > 10);
  CHECK(busy->Value("muster_store_keys") > 0);
  CHECK(busy->Value("muster_store_operations_total{op=\"set\"}") > 0);
  CHECK(busy->Value("muster_store_operation_duration_seconds_count") > 0);
  CHECK(busy->Value("muster_sessions") == 3);

  {
    std::FILE* f = std::fopen(ranks.dir.File("die").c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
  }
  for (auto& p : ranks.processes) (void)p->Wait(absl::Seconds(60));
  auto after = Scrape(port);
  REQUIRE(after.ok());
  CHECK(after->Value("muster_rank_failures_total") == 1);
  CHECK(after->Value("muster_group_breaks_total{cause=\"member_failed\"}") >= 1);
  CHECK(after->Value("muster_jobs{state=\"failed\"}") == 1);
  CHECK(after->Value("muster_ranks{state=\"failed\"}") == 1);
  CHECK(after->Value("muster_metrics_scrapes_total") == 3);
}

bool AllPrinted(Ranks& ranks, const std::string& text) {
  for (auto& p : ranks.processes) {
    if (!absl::StrContains(p->Stdout(), text)) return false;
  }
  return true;
}

void AwaitPrinted(Ranks& ranks, const std::string& text) {
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (!AllPrinted(ranks, text) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  std::string outputs;
  for (auto& p : ranks.processes) outputs += p->Stdout() + p->Stderr();
  INFO(outputs);
  REQUIRE(AllPrinted(ranks, text));
}

TEST_CASE("per-op collective metrics move exactly with the collectives a job issued") {
  auto daemon = TestDaemon::Start({{"--metrics-listen=127.0.0.1:0"}});
  REQUIRE(daemon.ok());
  std::smatch m;
  std::string ready = ReadFileOrEmpty((*daemon)->ready_file());
  REQUIRE(std::regex_search(ready, m, std::regex("\"metrics_port\":([0-9]+)")));
  int port = std::stoi(m[1]);

  // Two ranks form group "m"; once both said "ready", the counters are read;
  // then each issues 3 all_reduce int32x10 (40 bytes), 2 broadcast
  // float32x7 (28 bytes) and a barrier on "m", and finally a mismatched
  // call (rank 0 all_reduce, rank 1 broadcast under the same sequence
  // number) that fails on both.
  Ranks ranks;
  const std::string go = ranks.dir.File("go");
  const std::string ops =
      "allreduce m 10;allreduce m 10;allreduce m 10;bcast m 7 0;bcast m 7 0;cbarrier m;";
  Start(ranks, **daemon, "per-op", 2,
        {"init;group m 0,1;mark ready;waitfile " + go + ";" + ops +
             "allreduce m 10;mark done;sleep 30000",
         "init;group m 0,1;mark ready;waitfile " + go + ";" + ops +
             "bcast m 7 0;mark done;sleep 30000"});
  AwaitPrinted(ranks, "mark ready");
  absl::SleepFor(absl::Milliseconds(300));  // a sweep or two: init's own calls are counted
  auto before = Scrape(port);
  INFO(before.status());
  REQUIRE(before.ok());
  {
    std::FILE* f = std::fopen(go.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
  }
  AwaitPrinted(ranks, "mark done");
  std::string out0 = ranks.processes[0]->Stdout(), out1 = ranks.processes[1]->Stdout();
  INFO(out0 << out1);
  // The last call of each script is the mismatched one.
  auto last_code = [](const std::string& out, const std::string& rank, const std::string& step) {
    std::string code = "missing";
    std::regex re("rank " + rank + ": " + step + " (ok|error ([A-Z_]+))");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it) {
      code = (*it)[1] == "ok" ? "OK" : std::string((*it)[2]);
    }
    return code;
  };
  const std::string fail0 = last_code(out0, "0", "allreduce m 10"),
                    fail1 = last_code(out1, "1", "bcast m 7 0");
  CHECK(fail0 != "OK");
  CHECK(fail1 != "OK");
  REQUIRE(fail0 != "missing");
  REQUIRE(fail1 != "missing");
  auto cause = [](const std::string& code) {
    return code == "FAILED_PRECONDITION" ? "mismatch"
           : code == "ABORTED"           ? "aborted"
           : code == "DEADLINE_EXCEEDED" ? "timeout"
           : code == "UNAVAILABLE"       ? "peer_gone"
                                         : "other";
  };
  // A failed call is in the record once its rank recorded how it ended.
  absl::SleepFor(absl::Milliseconds(300));
  auto after = Scrape(port);
  INFO(after.status());
  REQUIRE(after.ok());
  auto delta = [&](const std::string& sample) {
    double b = before->Value(sample);
    return after->Value(sample) - (b < 0 ? 0 : b);
  };
  const std::string ar = "{op=\"all_reduce\",backend=\"gloo\"}";
  const std::string bc = "{op=\"broadcast\",backend=\"gloo\"}";
  const std::string br = "{op=\"barrier\",backend=\"gloo\"}";
  CHECK(after->types.at("muster_collectives_total") == "counter");
  CHECK(after->types.at("muster_collective_duration_seconds") == "histogram");
  // Per rank: 3 + 1 all_reduce (rank 0), 2 + 1 broadcast (rank 1), 1 barrier.
  CHECK(delta("muster_collectives_total" + ar) == 3 * 2 + 1);
  CHECK(delta("muster_collectives_total" + bc) == 2 * 2 + 1);
  CHECK(delta("muster_collectives_total" + br) == 2);
  CHECK(delta("muster_collective_bytes_total" + ar) == 6 * 40);
  CHECK(delta("muster_collective_bytes_total" + bc) == 4 * 28);
  CHECK(delta("muster_collective_bytes_total" + br) == 0);
  CHECK(delta("muster_collective_duration_seconds_count" + ar) == 6);
  CHECK(delta("muster_collective_duration_seconds_count" + bc) == 4);
  CHECK(delta("muster_collective_duration_seconds_bucket{op=\"all_reduce\",backend=\"gloo\","
              "le=\"+Inf\"}") == 6);
  CHECK(delta("muster_collective_duration_seconds_sum" + ar) > 0);
  CHECK(delta("muster_collective_failures_total{op=\"all_reduce\",backend=\"gloo\",cause=\"" +
              std::string(cause(fail0)) + "\"}") == 1);
  CHECK(delta("muster_collective_failures_total{op=\"broadcast\",backend=\"gloo\",cause=\"" +
              std::string(cause(fail1)) + "\"}") == 1);
  // The signature check names the mismatch on at least one side.
  CHECK((fail0 == "FAILED_PRECONDITION" || fail1 == "FAILED_PRECONDITION"));
  CHECK(after->Value("muster_collective_records_missed_total{backend=\"gloo\"}") == 0);
  // Nothing is counted twice: a later scrape (more sweeps) adds nothing.
  absl::SleepFor(absl::Milliseconds(250));
  auto again = Scrape(port);
  REQUIRE(again.ok());
  CHECK(again->Value("muster_collectives_total" + ar) ==
        after->Value("muster_collectives_total" + ar));
  CHECK(again->Value("muster_collective_bytes_total" + bc) ==
        after->Value("muster_collective_bytes_total" + bc));
}

}  // namespace
}  // namespace muster::testing
