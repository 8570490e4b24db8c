#include "common/status_macros.h"

#include <cerrno>
#include <cstring>

namespace muster {

absl::Status ErrnoToStatus(int errno_value, absl::string_view context) {
  std::string message = absl::StrCat(context, ": ", std::strerror(errno_value));
  switch (errno_value) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
    case EADDRINUSE:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(message);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EAGAIN:
    case EINTR:
    case ENETUNREACH:
    case EHOSTUNREACH:
      return absl::UnavailableError(message);
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace muster
