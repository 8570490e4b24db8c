// MetricsServer: musterd's /metrics endpoint for Prometheus
// (`--metrics-listen ADDR:PORT`). Plain HTTP/1.x on one TCP address: GET
// /metrics answers the text that `render` builds for this scrape
// ("text/plain; version=0.0.4"); other paths are 404, other methods 405.
// One thread serves connections one at a time; a client has 5 s to send
// its request (at most 8 KiB of it), so a stalled client delays a scrape
// by at most that and cannot hold memory.
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
  MetricsServer(int listen_fd, int wake_fd, int port, std::function<std::string()> render);
  void Serve();
  void HandleConnection(int fd);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop
  const int port_;
  const std::function<std::string()> render_;
  std::atomic<uint64_t> scrapes_{0};
  std::thread thread_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_METRICS_METRICS_SERVER_H_
