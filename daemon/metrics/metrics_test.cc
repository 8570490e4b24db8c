// The metrics text format and the /metrics endpoint: what MetricsText writes
// parses strictly (escapes, histograms), the parser refuses what Prometheus
// would, and MetricsServer answers GET /metrics, 404 elsewhere, 405 for
// other methods, serves a scrape while other clients hold connections, and
// gives up on a client that never finishes its request.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "daemon/metrics/metrics_server.h"
#include "daemon/metrics/metrics_text.h"
#include "daemon/metrics/prometheus_parser.h"

namespace muster {
namespace {

std::string Fetch(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, n);
  ::close(fd);
  return reply;
}

TEST_CASE("MetricsText writes families, escaped labels and histograms that parse strictly") {
  MetricsText m;
  m.Family("muster_things_total", "counter", "Things.\nOn two lines \\ with a backslash.");
  m.Sample("muster_things_total", {{"kind", "a \"quoted\"\nvalue\\"}}, 3);
  m.Sample("muster_things_total", {{"kind", "b"}}, 0);
  m.Family("muster_wait_seconds", "histogram", "Waits.");
  Histogram h(Histogram::LatencyBounds());
  h.Observe(5e-6);
  h.Observe(0.002);
  h.Observe(100);
  m.HistogramSamples("muster_wait_seconds", {{"op", "get"}}, h.snapshot());
  m.Family("muster_level", "gauge", "A gauge.");
  m.Sample("muster_level", 0.25);
  auto parsed = ParsePrometheusText(m.text());
  INFO(m.text());
  REQUIRE(parsed.ok());
  CHECK(parsed->Value("muster_things_total{kind=\"a \"quoted\"\nvalue\\\"}") == 3);
  CHECK(parsed->Value("muster_wait_seconds_count{op=\"get\"}") == 3);
  CHECK(parsed->Value("muster_wait_seconds_bucket{op=\"get\",le=\"1e-05\"}") == 1);
  CHECK(parsed->Value("muster_wait_seconds_bucket{op=\"get\",le=\"+Inf\"}") == 3);
  CHECK(parsed->Value("muster_wait_seconds_sum{op=\"get\"}") == Approx(100.002005));
  CHECK(parsed->Value("muster_level") == 0.25);
}

TEST_CASE("the parser refuses what Prometheus would not take") {
  auto refused = [](const std::string& text, const std::string& says) {
    auto p = ParsePrometheusText(text);
    INFO(text);
    REQUIRE_FALSE(p.ok());
    CHECK(absl::StrContains(p.status().message(), says));
  };
  refused("x 1\n", "before its family");
  refused("# TYPE x_total counter\nx_total -1\n", "negative counter");
  refused("# TYPE x counter\nx 1\n", "_total");
  refused("# TYPE x gauge\nx{a=b} 1\n", "not quoted");
  refused("# TYPE x gauge\nx{1a=\"b\"} 1\n", "bad label name");
  refused("# TYPE x gauge\nx 1\n# TYPE y gauge\ny 1\nx{a=\"2\"} 1\n", "together");
  refused("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
          "cumulative");
  refused("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\n", "+Inf");
  refused("# TYPE x gauge\nx 1", "newline");
}

TEST_CASE("MetricsServer serves GET /metrics and nothing else") {
  int renders = 0;
  auto server = MetricsServer::Start("127.0.0.1", 0, [&renders] {
    ++renders;
    return std::string("# TYPE up gauge\nup 1\n");
  });
  REQUIRE(server.ok());
  int port = (*server)->port();
  CHECK(port > 0);
  std::string ok = Fetch(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n"));
  CHECK(absl::StrContains(ok, "Content-Type: text/plain; version=0.0.4"));
  CHECK(absl::EndsWith(ok, "\r\n\r\n# TYPE up gauge\nup 1\n"));
  CHECK(absl::StartsWith(Fetch(port, "GET / HTTP/1.1\r\n\r\n"), "HTTP/1.1 404"));
  CHECK(absl::StartsWith(Fetch(port, "POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405"));
  CHECK(renders == 1);
  CHECK((*server)->scrapes() == 1);
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

TEST_CASE("clients holding connections open neither delay a scrape nor stay forever") {
  auto server = MetricsServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  REQUIRE(server.ok());
  const int port = (*server)->port();
  // Before: one connection at a time, 5 s each: three stalled clients denied
  // every scrape. Now more stalled clients than the server keeps.
  std::vector<int> stalled;
  for (int i = 0; i < 100; ++i) {
    stalled.push_back(Connect(port));
    REQUIRE(::send(stalled.back(), "GET /met", 8, 0) == 8);
  }
  absl::Time start = absl::Now();
  std::string served = Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n");
  CHECK(absl::StartsWith(served, "HTTP/1.1 200 OK"));
  CHECK(absl::Now() - start < absl::Seconds(3));
  // The stalled ones are closed: the oldest to make room, the rest after 5 s.
  for (int fd : stalled) {
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char c;
    ssize_t n = ::recv(fd, &c, 1, 0);
    // Closed: an orderly end, or a reset (closed with its request unread);
    // not a timeout.
    CHECK((n == 0 || (n < 0 && errno == ECONNRESET)));
    ::close(fd);
  }
}

TEST_CASE("a scrape whose reply is on its way is not the one closed to make room") {
  const std::string body(16 << 20, '#');  // larger than the sockets' buffers
  auto server = MetricsServer::Start("127.0.0.1", 0, [&body] { return body; });
  REQUIRE(server.ok());
  const int port = (*server)->port();
  int scrape = Connect(port);
  const std::string get = "GET /metrics HTTP/1.0\r\n\r\n";
  REQUIRE(::send(scrape, get.data(), get.size(), 0) == static_cast<ssize_t>(get.size()));
  absl::SleepFor(absl::Milliseconds(200));  // its reply fills the buffers, then waits
  std::vector<int> stalled;
  for (int i = 0; i < 100; ++i) {
    stalled.push_back(Connect(port));
    REQUIRE(::send(stalled.back(), "GET /met", 8, 0) == 8);
  }
  std::string reply;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::recv(scrape, buf, sizeof(buf), 0)) > 0) reply.append(buf, n);
  ::close(scrape);
  INFO("reply of " << reply.size() << " bytes");
  CHECK(absl::StartsWith(reply, "HTTP/1.1 200 OK"));
  CHECK(absl::EndsWith(reply, "\r\n\r\n" + body));
  for (int fd : stalled) ::close(fd);
}

}  // namespace
}  // namespace muster
