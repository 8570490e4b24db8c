#include "daemon/socket_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/paths.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// mkdir -p for the socket's parent directory.
absl::Status MakeParentDirs(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    std::string dir = path.substr(0, pos);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("cannot create directory ", dir));
    }
  }
  return absl::OkStatus();
}

std::string ReadHolderPid(int fd) {
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "unknown";
  int64_t pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &pid)) {
    return "unknown";
  }
  return absl::StrCat(pid);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SocketLock>> SocketLock::Acquire(const std::string& socket_path) {
  if (socket_path.empty() || socket_path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket must be an absolute path, got '", socket_path, "'"));
  }
  if (socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", socket_path, "' is ", socket_path.size(),
                     " bytes; unix sockets allow ", sizeof(sockaddr_un::sun_path) - 1));
  }
  RETURN_IF_ERROR(MakeParentDirs(socket_path));
  RETURN_IF_ERROR(CheckDefaultSocketOwner(socket_path));
  std::string lock_path = socket_path + ".lock";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot open lock file ", lock_path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    std::string holder = ReadHolderPid(fd);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("another musterd (pid ", holder, ") is already serving ", socket_path,
                       "; stop it first or start this one with a different --socket"));
    }
    return ErrnoToStatus(err, absl::StrCat("cannot lock ", lock_path));
  }
  std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("cannot write pid to ", lock_path));
  }
  return std::unique_ptr<SocketLock>(new SocketLock(socket_path, std::move(lock_path), fd));
}

void SocketLock::RemoveFiles() {
  ::unlink(socket_path_.c_str());
  ::unlink(lock_path_.c_str());
}

SocketLock::~SocketLock() { ::close(fd_); }

}  // namespace muster
