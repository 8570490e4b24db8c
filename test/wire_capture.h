// Test helpers that sit on the store's TCP path and record every byte:
//  - CaptureServer: a fake store on 127.0.0.1 (the test's own socket) that
//    records what clients send and answers the native AUTH like a server
//    that does not know the token (or not at all).
//  - RecordingRelay: a man in the middle between clients and a real store,
//    forwarding both directions unchanged and recording them.
// Both serve one connection at a time on their own thread; the accessors
// are thread-safe. The destructors stop the thread and close everything.
#ifndef MUSTER_TEST_WIRE_CAPTURE_H_
#define MUSTER_TEST_WIRE_CAPTURE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace muster::testing {

// A listening socket on 127.0.0.1 with a free port, or -1 (errno set).
int ListenOnLoopback(int* port);
// A connected TCP socket to 127.0.0.1:port, or -1. `nonblocking`: the
// connect may still be in progress when it returns.
int ConnectToLoopback(int port, bool nonblocking = false);
// Whether reading `fd` reports an orderly close (EOF, not a reset) within
// `timeout` (checked at least once, even if it is not positive); bytes
// that arrive first are skipped.
bool ReadsEof(int fd, absl::Duration timeout);
// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the new one.
uint64_t RaiseFileLimit();

class CaptureServer {
 public:
  enum class Mode {
    kSilent,      // read, never answer
    kBogusProof,  // answer AUTH with a nonce and a random (wrong) proof
    kNoProof,     // answer AUTH like a store without a token
  };
  explicit CaptureServer(Mode mode);
  ~CaptureServer();
  int port() const { return port_; }
  // Everything received so far, all connections concatenated.
  std::string Received() const;
  int connections() const { return connections_.load(); }
  // Waits until at least `bytes` were received.
  bool WaitForBytes(size_t bytes, absl::Duration timeout) const;

 private:
  void Run();
  const Mode mode_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  mutable std::mutex mu_;
  std::string received_;  // guarded by mu_
  std::thread thread_;
};

class RecordingRelay {
 public:
  explicit RecordingRelay(int target_port);
  ~RecordingRelay();
  int port() const { return port_; }
  std::string ClientToServer() const;
  std::string ServerToClient() const;

 private:
  void Run();
  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::string to_server_;  // guarded by mu_
  std::string to_client_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace muster::testing

#endif  // MUSTER_TEST_WIRE_CAPTURE_H_
