#include "daemon/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace muster {
namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr absl::Duration kRequestTimeout = absl::Seconds(5);

std::string Response(const std::string& status, const std::string& type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::function<std::string()> render) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = absl::StrCat(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen: cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  int fd = -1;
  std::string why;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        ::listen(fd, 2 * static_cast<int>(kMaxConnections)) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen: cannot listen on ", host, ":", port, ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int actual =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(fd, wake, actual, std::move(render)));
}

MetricsServer::MetricsServer(int listen_fd, int wake_fd, int port,
                             std::function<std::string()> render)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsServer::~MetricsServer() {
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

// One connection's progress: reading its request, then writing its reply.
struct MetricsServer::Connection {
  int fd = -1;
  absl::Time deadline;  // to finish the request, then to take the reply
  std::string request;
  std::string reply;  // non-empty once answered
  size_t sent = 0;
};

void MetricsServer::Serve() {
  std::vector<Connection> conns;
  while (true) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    absl::Time next = absl::InfiniteFuture();
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.reply.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, c.deadline);
    }
    int wait = next == absl::InfiniteFuture()
                   ? -1
                   : static_cast<int>(
                         std::max<int64_t>(0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
    if (::poll(fds.data(), fds.size(), wait) < 0) {
      if (errno == EINTR) continue;
      MLOG(ERROR) << "metrics: poll failed: " << std::strerror(errno);
      break;
    }
    if (fds[1].revents != 0) break;
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      bool done = now > c.deadline;  // a client that does not finish: dropped
      if (!done && fds[i + 2].revents != 0) done = c.reply.empty() ? Read(c) : Write(c);
      if (done) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    conns.erase(
        std::remove_if(conns.begin(), conns.end(), [](const Connection& c) { return c.fd < 0; }),
        conns.end());
    if (fds[0].revents != 0) Accept(&conns);
  }
  for (Connection& c : conns) ::close(c.fd);
}

void MetricsServer::Accept(std::vector<Connection>* conns) {
  while (true) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (conns->size() >= kMaxConnections) {
      // Full: the oldest still sending its request goes (else the oldest),
      // so that clients holding connections open cannot keep a scrape out,
      // nor cut off one whose reply is on its way.
      auto victim = std::find_if(conns->begin(), conns->end(),
                                 [](const Connection& c) { return c.reply.empty(); });
      if (victim == conns->end()) victim = conns->begin();
      ::close(victim->fd);
      conns->erase(victim);
    }
    Connection c;
    c.fd = fd;
    c.deadline = absl::Now() + kRequestTimeout;
    conns->push_back(std::move(c));
  }
}

bool MetricsServer::Read(Connection& c) {
  char buf[2048];
  ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
  if (n == 0) return true;
  if (n < 0) return errno != EAGAIN && errno != EINTR;
  c.request.append(buf, static_cast<size_t>(n));
  if (c.request.size() > kMaxRequestBytes) {
    c.reply = Response("431 Request Header Fields Too Large", "text/plain", "too large\n");
  } else if (absl::StrContains(c.request, "\r\n\r\n") || absl::StrContains(c.request, "\n\n")) {
    c.reply = Answer(c.request);
  } else {
    return false;  // more to come
  }
  c.deadline = absl::Now() + kRequestTimeout;
  return Write(c);
}

bool MetricsServer::Write(Connection& c) {
  while (c.sent < c.reply.size()) {
    ssize_t n =
        ::send(c.fd, c.reply.data() + c.sent, c.reply.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    return n == 0 || (errno != EAGAIN && errno != EINTR);
  }
  return true;  // all sent: closed (Connection: close)
}

std::string MetricsServer::Answer(const std::string& request) {
  std::string line = request.substr(0, request.find_first_of("\r\n"));
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  std::string method = line.substr(0, sp1);
  std::string target = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string path = target.substr(0, target.find('?'));
  if (method != "GET" && method != "HEAD") {
    return Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n");
  }
  if (path != "/metrics") {
    return Response("404 Not Found", "text/plain", "only /metrics is served here\n");
  }
  ++scrapes_;
  std::string body = render_();
  std::string reply = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body);
  if (method == "HEAD") reply.resize(reply.size() - body.size());
  return reply;
}

}  // namespace muster
