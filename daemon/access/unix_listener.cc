#include "daemon/access/unix_listener.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {

absl::StatusOr<mode_t> ParseSocketMode(const std::string& text) {
  uint32_t mode = 0;
  bool ok = !text.empty() && text.size() <= 4;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '7';
    mode = mode * 8 + (c - '0');
  }
  if (!ok || mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket mode must be octal permission bits such as 0660, got '", text, "'"));
  }
  return static_cast<mode_t>(mode);
}

absl::StatusOr<int64_t> ResolveGroup(const std::string& name_or_gid) {
  if (name_or_gid.empty()) return -1;
  int64_t gid;
  if (absl::SimpleAtoi(name_or_gid, &gid) && gid >= 0) return gid;
  std::vector<char> buf(16384);
  group entry;
  group* found = nullptr;
  int err = ::getgrnam_r(name_or_gid.c_str(), &entry, buf.data(), buf.size(), &found);
  if (err != 0 || found == nullptr) {
    return absl::NotFoundError(absl::StrCat("no group '", name_or_gid, "' on this host"));
  }
  return static_cast<int64_t>(found->gr_gid);
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(UnixListenerOptions options,
                                                                 AccessPolicy* policy) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", options.path));
  }
  std::memcpy(addr.sun_path, options.path.data(), options.path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoToStatus(errno, "cannot create a unix socket");
  ::unlink(options.path.c_str());  // stale: the caller holds the socket's lock
  // Bind with no permissions for anyone, then open it up as configured, so
  // nobody connects in between.
  mode_t old_umask = ::umask(0777);
  int bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) {
    ::close(fd);
    return ErrnoToStatus(bind_errno, absl::StrCat("cannot bind unix socket ", options.path));
  }
  if (options.gid >= 0 &&
      ::chown(options.path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(options.gid)) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err,
                         absl::StrCat("cannot give ", options.path, " to group ", options.gid));
  }
  if (::chmod(options.path.c_str(), options.mode) != 0 || ::listen(fd, 512) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("cannot listen on ", options.path));
  }
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "eventfd");
  }
  return std::unique_ptr<UnixListener>(new UnixListener(std::move(options), policy, fd, wake));
}

UnixListener::UnixListener(UnixListenerOptions options, AccessPolicy* policy, int fd, int wake_fd)
    : options_(std::move(options)), policy_(policy), fd_(fd), wake_fd_(wake_fd) {}

UnixListener::~UnixListener() {
  Stop();
  ::close(fd_);
  ::close(wake_fd_);
}

void UnixListener::Serve(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { AcceptLoop(); });
}

void UnixListener::Stop() {
  if (stopped_.exchange(true)) return;
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void UnixListener::AcceptLoop() {
  while (!stopped_.load()) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      MLOG(ERROR) << "unix socket " << options_.path << ": poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      MLOG(WARNING) << "unix socket " << options_.path << ": accept: " << std::strerror(errno);
      absl::SleepFor(absl::Milliseconds(10));  // e.g. out of file descriptors
      continue;
    }
    ucred cred = {};
    socklen_t len = sizeof(cred);
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      MLOG(WARNING) << "unix socket " << options_.path
                    << ": cannot read the caller's credentials: " << std::strerror(errno);
      ::close(conn);
      continue;
    }
    // gRPC names a connection it was handed by its descriptor.
    policy_->RecordUnixPeer(absl::StrCat("fd:", conn),
                            policy_->UnixCaller(cred.uid, cred.gid, cred.pid));
    grpc::AddInsecureChannelFromFd(server_, conn);
  }
}

}  // namespace muster
