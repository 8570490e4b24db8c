// UnixListener: musterd's unix socket. It binds the socket with the
// configured mode and group, accepts connections on its own thread, asks
// the kernel who is connecting (SO_PEERCRED: uid, gid, pid), records that
// in the AccessPolicy under the name gRPC will report for the connection,
// and hands the connection to the gRPC server.
//
// Lifecycle: Start() after the gRPC server is built and started; Stop()
// (idempotent) before the server shuts down. Thread-safe.
#ifndef MUSTER_DAEMON_ACCESS_UNIX_LISTENER_H_
#define MUSTER_DAEMON_ACCESS_UNIX_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/access/access_policy.h"

namespace grpc {
class Server;
}

namespace muster {

struct UnixListenerOptions {
  std::string path;
  // Permission bits of the socket file (who may connect at all).
  mode_t mode = 0660;
  // Group owning the socket file; -1 keeps musterd's group.
  int64_t gid = -1;
};

class UnixListener {
 public:
  // Binds and listens (replacing a stale socket file; the caller holds the
  // socket's lock). Connections are served once Serve() is called.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(UnixListenerOptions options,
                                                            AccessPolicy* policy);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting; connections go to `server` (started, outlives Stop()).
  void Serve(grpc::Server* server);
  // Stops accepting and closes the listening socket. Idempotent.
  void Stop();

 private:
  UnixListener(UnixListenerOptions options, AccessPolicy* policy, int fd, int wake_fd);
  void AcceptLoop();

  const UnixListenerOptions options_;
  AccessPolicy* const policy_;
  const int fd_;
  const int wake_fd_;  // eventfd: Stop() wakes the accept loop
  grpc::Server* server_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

// Parses an octal mode such as "0660" (at most 0777).
absl::StatusOr<mode_t> ParseSocketMode(const std::string& text);
// The gid of a group name or number; "" -> -1 (none).
absl::StatusOr<int64_t> ResolveGroup(const std::string& name_or_gid);

}  // namespace muster

#endif  // MUSTER_DAEMON_ACCESS_UNIX_LISTENER_H_
