// TestDaemon: a real musterd process for integration tests. It binds free
// ports (--grpc-port 0), uses a private socket in a temp dir, and Start()
// returns only once the daemon wrote its --ready-file; the ports and pid
// come from that file. The destructor stops a daemon that is still running.
//
// Owned by one test thread.
#ifndef MUSTER_TEST_DAEMON_HARNESS_H_
#define MUSTER_TEST_DAEMON_HARNESS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "test/subprocess.h"

namespace muster::testing {

struct TestDaemonOptions {
  std::vector<std::string> extra_args;
  std::map<std::string, std::string> env;
  // Use this socket instead of a fresh one (e.g. to start a second daemon
  // on the first one's socket).
  std::string socket_path;
  absl::Duration ready_timeout = absl::Seconds(20);
  // Runfile path of the daemon binary (test builds of musterd).
  std::string binary = "daemon/musterd";
};

class TestDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<TestDaemon>> Start(TestDaemonOptions options = {});
  ~TestDaemon();

  int pid() const { return process_->pid(); }
  int grpc_port() const { return grpc_port_; }
  int store_port() const { return store_port_; }
  const std::string& socket_path() const { return socket_path_; }
  const std::string& ready_file() const { return ready_file_; }
  const std::string& version() const { return version_; }
  const TempDir& dir() const { return *dir_; }
  Subprocess& process() { return *process_; }
  // --socket=… as musterctl takes it.
  std::string SocketFlag() const { return "--socket=" + socket_path_; }

  // Sends `signal_number` (default SIGTERM) and waits for the exit.
  absl::StatusOr<ExitInfo> Stop(int signal_number = 15, absl::Duration timeout = absl::Seconds(10));

 private:
  TestDaemon() = default;
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Subprocess> process_;
  std::string socket_path_;
  std::string ready_file_;
  std::string version_;
  int grpc_port_ = 0;
  int store_port_ = 0;
};

}  // namespace muster::testing

#endif  // MUSTER_TEST_DAEMON_HARNESS_H_
