#include "common/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {

std::string DefaultSocketPath() {
  if (::geteuid() == 0) return "/run/muster/musterd.sock";
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat(runtime_dir, "/muster/musterd.sock");
  }
  return absl::StrCat("/tmp/muster-", ::geteuid(), "/musterd.sock");
}

std::string ClientSocketPath() {
  const char* env = std::getenv("MUSTER_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  return DefaultSocketPath();
}

absl::Status CheckSocketOwner(const std::string& socket_path) {
  const uid_t me = ::geteuid();
  const size_t slash = socket_path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : socket_path.substr(0, slash);
  auto refuse = [&](const std::string& why) {
    return absl::PermissionDeniedError(
        absl::StrCat("refusing the musterd socket ", socket_path, ": ", why,
                     ". Another user may have made it to pose as musterd; remove it (or point "
                     "MUSTER_SOCKET / --socket at a directory of yours)"));
  };
  struct stat d;
  if (::lstat(dir.c_str(), &d) != 0) {
    if (errno == ENOENT) return absl::OkStatus();  // nothing there: nobody serves it
    return absl::UnavailableError(absl::StrCat("cannot inspect ", dir, " (the directory of socket ",
                                               socket_path, "): ", std::strerror(errno)));
  }
  if (!S_ISDIR(d.st_mode)) return refuse(absl::StrCat(dir, " is not a directory (a symlink?)"));
  if (d.st_uid != me && d.st_uid != 0) {
    return refuse(absl::StrCat("its directory ", dir, " belongs to uid ", d.st_uid,
                               ", not to you (uid ", me, ") or root"));
  }
  if ((d.st_mode & (S_IWGRP | S_IWOTH)) == 0) return absl::OkStatus();
  if ((d.st_mode & S_ISVTX) == 0) {
    return refuse(absl::StrCat("its directory ", dir, " (mode ",
                               absl::StrFormat("%04o", d.st_mode & 07777),
                               ") may be written by other users"));
  }
  struct stat f;
  if (::lstat(socket_path.c_str(), &f) != 0) return absl::OkStatus();  // not there yet
  if (f.st_uid != me && f.st_uid != 0) {
    return refuse(absl::StrCat("it belongs to uid ", f.st_uid, ", not to you (uid ", me,
                               ") or root, in the shared directory ", dir));
  }
  return absl::OkStatus();
}

absl::Status CheckDefaultSocketOwner(const std::string& socket_path) {
  if (socket_path != DefaultSocketPath()) return absl::OkStatus();
  return CheckSocketOwner(socket_path);
}

}  // namespace muster
