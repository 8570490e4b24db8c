#include "test/daemon_harness.h"

#include <signal.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace muster::testing {

absl::StatusOr<std::unique_ptr<TestDaemon>> TestDaemon::Start(TestDaemonOptions options) {
  std::unique_ptr<TestDaemon> daemon(new TestDaemon());
  daemon->dir_ = std::make_unique<TempDir>();
  daemon->socket_path_ =
      options.socket_path.empty() ? daemon->dir_->File("musterd.sock") : options.socket_path;
  daemon->ready_file_ = daemon->dir_->File("ready.json");
  std::vector<std::string> argv = {RunfilePath(options.binary),
                                   "--socket=" + daemon->socket_path_,
                                   "--grpc-port=0",
                                   "--store-port=0",
                                   "--listen=127.0.0.1",
                                   "--ready-file=" + daemon->ready_file_};
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  ASSIGN_OR_RETURN(daemon->process_, Subprocess::Start(argv, daemon->dir_->path(), options.env));

  absl::Time deadline = absl::Now() + options.ready_timeout;
  while (!FileExists(daemon->ready_file_)) {
    if (!daemon->process_->Running()) {
      auto exit = daemon->process_->Wait(absl::ZeroDuration());
      return absl::FailedPreconditionError(
          absl::StrCat("musterd ", exit.ok() ? exit->Describe() : "ended",
                       " before it was ready; stderr: ", daemon->process_->Stderr()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("musterd not ready after ",
                                                      absl::FormatDuration(options.ready_timeout),
                                                      "; stderr: ", daemon->process_->Stderr()));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSIGN_OR_RETURN(auto ready, ParseFlatJsonObject(ReadFileOrEmpty(daemon->ready_file_)));
  int64_t pid = 0;
  if (!absl::SimpleAtoi(ready["pid"], &pid) || pid != daemon->process_->pid() ||
      !absl::SimpleAtoi(ready["grpc_port"], &daemon->grpc_port_) ||
      !absl::SimpleAtoi(ready["store_port"], &daemon->store_port_)) {
    return absl::InternalError(
        absl::StrCat("bad ready file: ", ReadFileOrEmpty(daemon->ready_file_)));
  }
  daemon->version_ = ready["version"];
  return daemon;
}

absl::StatusOr<ExitInfo> TestDaemon::Stop(int signal_number, absl::Duration timeout) {
  if (process_->Running()) RETURN_IF_ERROR(process_->Signal(signal_number));
  return process_->Wait(timeout);
}

TestDaemon::~TestDaemon() {
  if (process_ != nullptr && process_->Running()) (void)Stop(SIGTERM, absl::Seconds(10));
}

}  // namespace muster::testing
