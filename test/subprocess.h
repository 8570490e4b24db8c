// Test helpers for running real processes: spawn with extra environment,
// capture stdout/stderr to files, wait with a deadline, signal.
//
// A Subprocess is owned by one thread. Its destructor SIGKILLs and reaps a
// child that is still running, so a failing test never leaks processes.
#ifndef MUSTER_TEST_SUBPROCESS_H_
#define MUSTER_TEST_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster::testing {

// Where a runfile (e.g. "daemon/musterd") lives in a Bazel test.
std::string RunfilePath(const std::string& relative);

// A fresh directory under /tmp (short enough for unix socket paths), removed
// with its contents by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// How a process ended.
struct ExitInfo {
  bool exited = false;  // normal exit: see code; else killed by signal
  int code = -1;
  int signal = 0;
  std::string Describe() const;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with the current environment plus `env`.
  // Output goes to files in `output_dir`.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv, const std::string& output_dir,
      const std::map<std::string, std::string>& env = {});
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool Running();
  absl::Status Signal(int signal_number);
  // Waits for exit; DeadlineExceeded if still running after `timeout`.
  absl::StatusOr<ExitInfo> Wait(absl::Duration timeout);
  std::string Stdout() const;
  std::string Stderr() const;
  // Waits until the output so far contains `text`; false if the process
  // exited without printing it or `timeout` passed.
  bool AwaitStdout(const std::string& text, absl::Duration timeout);

 private:
  Subprocess(pid_t pid, std::string out, std::string err)
      : pid_(pid), stdout_path_(std::move(out)), stderr_path_(std::move(err)) {}
  pid_t pid_;
  std::string stdout_path_;
  std::string stderr_path_;
  std::optional<ExitInfo> exit_;
};

struct RunResult {
  ExitInfo exit;
  std::string out;
  std::string err;
};

// Runs a command to completion (killed after `timeout`).
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& env = {},
                              absl::Duration timeout = absl::Seconds(30));

std::string ReadFileOrEmpty(const std::string& path);
bool FileExists(const std::string& path);

// A TCP connection to 127.0.0.1:`port` (-1 if refused).
int ConnectLoopback(int port);
// Whether the peer closes `fd` within `limit` (what it sends meanwhile is
// read and dropped); closes `fd` either way.
bool ClosedWithin(int fd, absl::Duration limit);

}  // namespace muster::testing

#endif  // MUSTER_TEST_SUBPROCESS_H_
