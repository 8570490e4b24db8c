#include "test/wire_capture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/time/clock.h"
#include "common/store_wire.h"

namespace muster::testing {
namespace {

constexpr int kPollMillis = 20;

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

bool SendAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

std::string RandomBytes(size_t n) {
  std::random_device rd;
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rd());
  return s;
}

}  // namespace

int ListenOnLoopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = Loopback(0);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 4096) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

int ConnectToLoopback(int port, bool nonblocking) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  sockaddr_in addr = Loopback(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
      !(nonblocking && errno == EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool ReadsEof(int fd, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Polls at least once, so a past deadline still sees a close that came.
    absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char buf[256];
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;  // a reset is not EOF
  }
}

uint64_t RaiseFileLimit() {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

CaptureServer::CaptureServer(Mode mode) : mode_(mode) {
  listen_fd_ = ListenOnLoopback(&port_);
  thread_ = std::thread([this] { Run(); });
}

CaptureServer::~CaptureServer() {
  stop_ = true;
  thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string CaptureServer::Received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

bool CaptureServer::WaitForBytes(size_t bytes, absl::Duration timeout) const {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Received().size() >= bytes) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return Received().size() >= bytes;
}

void CaptureServer::Run() {
  const size_t kHello = 1 + 4 + wire::kAuthNonceBytes;
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollMillis) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ++connections_;
    size_t got = 0;
    bool answered = false;
    while (!stop_) {
      pollfd c{fd, POLLIN, 0};
      if (::poll(&c, 1, kPollMillis) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        received_.append(buf, n);
      }
      got += n;
      if (!answered && got >= kHello && mode_ != Mode::kSilent) {
        std::string reply;
        wire::PutU8(&reply, wire::kReplyOk);
        reply += RandomBytes(wire::kAuthNonceBytes);
        wire::PutBytes(&reply,
                       mode_ == Mode::kBogusProof ? RandomBytes(wire::kAuthProofBytes) : "");
        SendAll(fd, reply);
        answered = true;
      }
    }
    ::close(fd);
  }
}

RecordingRelay::RecordingRelay(int target_port) : target_port_(target_port) {
  listen_fd_ = ListenOnLoopback(&port_);
  thread_ = std::thread([this] { Run(); });
}

RecordingRelay::~RecordingRelay() {
  stop_ = true;
  thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string RecordingRelay::ClientToServer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return to_server_;
}

std::string RecordingRelay::ServerToClient() const {
  std::lock_guard<std::mutex> lock(mu_);
  return to_client_;
}

void RecordingRelay::Run() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollMillis) <= 0) continue;
    int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    int server = ConnectToLoopback(target_port_);
    if (server < 0) {
      ::close(client);
      continue;
    }
    int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    bool open = true;
    while (!stop_ && open) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(fds, 2, kPollMillis) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[16384];
        ssize_t n = ::recv(fds[i].fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          open = false;
          break;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          (i == 0 ? to_server_ : to_client_).append(buf, n);
        }
        if (!SendAll(i == 0 ? server : client, std::string(buf, n))) open = false;
      }
    }
    ::close(client);
    ::close(server);
  }
}

}  // namespace muster::testing
