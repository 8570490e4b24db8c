// MetricsServer: musterd's /metrics endpoint for Prometheus
// (`--metrics-listen ADDR:PORT`). Plain HTTP/1.x on one TCP address: GET
// /metrics answers the text that `render` builds for this scrape
// ("text/plain; version=0.0.4"); other paths are 404, other methods 405.
// One thread serves up to kMaxConnections connections at once (poll); a
// client has 5 s to send its request (at most 8 KiB of it) and 5 s more to
// take the reply, and when all are taken a new connection closes the
// oldest one still sending its request, so clients that hold connections
// open cannot keep a scrape out.
//
// Thread-safety: Start and the destructor from one thread; `render` runs on
// the server's thread.
#ifndef MUSTER_DAEMON_METRICS_METRICS_SERVER_H_
#define MUSTER_DAEMON_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

class MetricsServer {
 public:
  // Listens on `host`:`port` (port 0: a free one).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              std::function<std::string()> render);
  // Stops serving and joins the thread.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  uint64_t scrapes() const { return scrapes_.load(); }

 private:
  static constexpr size_t kMaxConnections = 64;
  struct Connection;
  MetricsServer(int listen_fd, int wake_fd, int port, std::function<std::string()> render);
  void Serve();
  void Accept(std::vector<Connection>* conns);
  // Read and Write: true once the connection is done with.
  bool Read(Connection& c);
  bool Write(Connection& c);
  std::string Answer(const std::string& request);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop
  const int port_;
  const std::function<std::string()> render_;
  std::atomic<uint64_t> scrapes_{0};
  std::thread thread_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_METRICS_METRICS_SERVER_H_
