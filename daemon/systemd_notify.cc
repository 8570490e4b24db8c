#include "daemon/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muster {

absl::Status NotifySystemd(absl::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || env[0] == '\0') return absl::OkStatus();
  std::string path = env;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET '", path, "' is not usable"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  socklen_t len = offsetof(sockaddr_un, sun_path) + path.size();
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "sd_notify socket");
  ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                          reinterpret_cast<sockaddr*>(&addr), len);
  int err = errno;
  ::close(fd);
  if (sent < 0) return ErrnoToStatus(err, absl::StrCat("sd_notify to ", path));
  return absl::OkStatus();
}

}  // namespace muster
