// StoreFrontend: serves the store wire protocols (PyTorch 1.13 and 2.2+
// TCPStore, muster's native protocol with its token handshake) from a
// BlockingStore kept elsewhere — musterd's etcd backend. StoreServer keeps
// the data itself on one loop thread; this front-end owns no data, so every
// request may block on the network and each connection has its own thread
// (a node serves its own ranks: tens to hundreds of connections).
//
// Requests are parsed by the same RequestParser as StoreServer's (limits,
// dialects, handshake order). Waits block in BlockingStore::WaitCancellable
// on the connection's thread while one watcher thread (epoll) watches the
// sockets of every waiting connection: input during a wait (a 1.13 client
// that gave up, a 2.x CANCEL_WAIT) or a close cancels it, like StoreServer's
// parked waits. A store call that fails (etcd unreachable:
// UNAVAILABLE naming the endpoint) fails that request: a native client gets
// the error, a torch client's connection is closed (its protocol has no
// error reply). Queue commands (PyTorch 2.8+) go to BlockingStore's queue
// calls; WAIT and CHECK count a non-empty queue of a key's name as present.
//
// With a token, a connection that has not authenticated counts toward
// max_unauthenticated_connections, not max_connections, and is closed at
// auth_timeout; when that pool is full a newcomer replaces its oldest
// connection if that one has been trying for min(auth_timeout / 4, 1 s),
// else it is refused at accept; a torch client not in
// allow_unauthenticated is refused at its first bytes, before anything it
// declares is buffered.
//
// Thread-safety: Start/Stop/port are thread-safe; one thread accepts, one
// thread per connection serves it, one watches waiting connections' sockets
// (all owned by the front-end, joined by Stop).
#ifndef MUSTER_DAEMON_STORE_STORE_FRONTEND_H_
#define MUSTER_DAEMON_STORE_STORE_FRONTEND_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/store_wire.h"
#include "daemon/store/blocking_store.h"
#include "daemon/store/cidr.h"

namespace muster {

struct StoreFrontendOptions {
  std::string listen_address = "0.0.0.0";
  int port = 29500;  // 0 picks a free port
  wire::StoreLimits limits;
  // Authenticated connections (and all of them without a token).
  uint64_t max_connections = 4096;
  // Non-empty: native clients must prove it; torch clients only from
  // allow_unauthenticated (others are refused at their first bytes).
  std::string token;
  CidrSet allow_unauthenticated;
  // With a token: connections still authenticating, counted apart (so idle
  // ones cannot keep token holders out), and how long one may take.
  uint64_t max_unauthenticated_connections = 128;
  absl::Duration auth_timeout = absl::Seconds(10);
};

class StoreFrontend {
 public:
  static absl::StatusOr<std::unique_ptr<StoreFrontend>> Start(StoreFrontendOptions options,
                                                              std::shared_ptr<BlockingStore> store);
  ~StoreFrontend();
  // Closes the listener and every connection (cancelling their waits) and
  // joins the threads. Idempotent.
  void Stop();
  int port() const { return port_; }
  int64_t connections() const { return connections_.load(); }

 private:
  struct Connection;
  StoreFrontend(StoreFrontendOptions options, std::shared_ptr<BlockingStore> store);
  void AcceptLoop();
  void Serve(Connection* c);
  // The unauthenticated pool is full: closes its oldest connection if it
  // has been authenticating for longer than min(auth_timeout / 4, 1 s).
  bool ReplaceOldestUnauthenticated(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `c` proved the token: it leaves the unauthenticated pool. False if
  // max_connections authenticated connections are open already.
  bool Authenticated(Connection* c);
  // While a connection's wait blocks, the watcher thread watches its socket:
  // input or a close cancels the wait. Unwatch says whether that happened.
  absl::Status Watch(int fd, WaitCancel* cancel);
  bool Unwatch(int fd);
  void WatchLoop();

  StoreFrontendOptions options_;
  std::shared_ptr<BlockingStore> store_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> connections_{0};
  std::thread acceptor_;
  // Thread: waits in epoll on the sockets of connections whose requests
  // block (one thread for all of them, not one per wait).
  std::thread watcher_;
  int epoll_fd_ = -1;
  struct Watched {
    WaitCancel* cancel = nullptr;
    bool interrupted = false;
  };
  absl::Mutex watch_mu_;
  std::map<int, Watched> watched_ ABSL_GUARDED_BY(watch_mu_);
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Connection>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_FRONTEND_H_
