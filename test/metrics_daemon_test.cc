// musterd's /metrics with real daemons and ranks: off unless asked for;
// --metrics-listen 127.0.0.1:0 reports its port in the ready file; every
// scrape parses strictly as Prometheus text; and the numbers move with a
// job's work: ranks and groups by state, collectives completed in shared
// memory, store keys, a rank's failure and the group it broke.
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
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return absl::UnavailableError("cannot connect to /metrics");
  }
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

}  // namespace
}  // namespace muster::testing
