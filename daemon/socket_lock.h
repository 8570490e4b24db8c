// SocketLock: makes one musterd the sole owner of a unix socket path.
//
// gRPC unlinks an existing socket file before binding, so a second daemon
// started on the same --socket would silently steal the first one's path.
// Before binding, musterd takes an exclusive flock(2) on "<socket>.lock"
// (and writes its pid there); a second daemon finds the lock held and refuses
// to start. The kernel drops the lock when the holder dies, so a crashed
// daemon never blocks its successor; the stale socket is then replaced.
//
// Thread-compatible: one owner; the lock lives as long as the object.
#ifndef MUSTER_DAEMON_SOCKET_LOCK_H_
#define MUSTER_DAEMON_SOCKET_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

class SocketLock {
 public:
  // Creates the socket's parent directory if needed and takes the lock.
  // FailedPrecondition if another live musterd holds it (its pid in the
  // message); InvalidArgument if the path is too long for a unix socket.
  static absl::StatusOr<std::unique_ptr<SocketLock>> Acquire(const std::string& socket_path);

  ~SocketLock();
  SocketLock(const SocketLock&) = delete;
  SocketLock& operator=(const SocketLock&) = delete;

  // Removes the socket file and the lock file; call after the server stopped.
  void RemoveFiles();

 private:
  SocketLock(std::string socket_path, std::string lock_path, int fd)
      : socket_path_(std::move(socket_path)), lock_path_(std::move(lock_path)), fd_(fd) {}

  std::string socket_path_;
  std::string lock_path_;
  int fd_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_SOCKET_LOCK_H_
