#include "test/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/spawn.h"
#include "common/status_macros.h"

extern char** environ;

namespace muster::testing {

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    std::string candidate =
        absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "muster", "/", relative);
    if (FileExists(candidate)) return candidate;
  }
  return relative;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/muster-test-XXXXXX";
  char* made = ::mkdtemp(tmpl);
  if (made == nullptr) {
    std::fprintf(stderr, "mkdtemp failed: %s\n", std::strerror(errno));
    std::abort();
  }
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ExitInfo::Describe() const {
  if (exited) return absl::StrCat("exited with status ", code);
  return absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv, const std::string& output_dir,
    const std::map<std::string, std::string>& env) {
  static std::atomic<int> counter{0};
  int n = counter++;
  std::string base = argv.empty() ? "proc" : std::filesystem::path(argv[0]).filename().string();
  std::string out = absl::StrCat(output_dir, "/", base, ".", n, ".stdout");
  std::string err = absl::StrCat(output_dir, "/", base, ".", n, ".stderr");

  int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) {
    absl::Status s = ErrnoToStatus(errno, "open output files");
    if (out_fd >= 0) ::close(out_fd);
    if (err_fd >= 0) ::close(err_fd);
    return s;
  }
  SpawnOptions options;
  options.argv = argv;
  options.env = env;
  options.stdout_fd = out_fd;
  options.stderr_fd = err_fd;
  options.who = "test";
  absl::StatusOr<pid_t> pid = muster::Spawn(options);
  if (!pid.ok()) {
    ::close(out_fd);
    ::close(err_fd);
    return pid.status();
  }
  ::close(out_fd);
  ::close(err_fd);
  return std::unique_ptr<Subprocess>(new Subprocess(*pid, out, err));
}

Subprocess::~Subprocess() {
  if (Running()) {
    ::kill(pid_, SIGKILL);
    (void)Wait(absl::Seconds(10));
  }
}

bool Subprocess::Running() {
  if (exit_.has_value()) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  ExitInfo info;
  if (r == pid_) {
    info.exited = WIFEXITED(status);
    info.code = info.exited ? WEXITSTATUS(status) : -1;
    info.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  exit_ = info;
  return false;
}

absl::Status Subprocess::Signal(int signal_number) {
  if (!Running()) return absl::FailedPreconditionError("process already exited");
  if (::kill(pid_, signal_number) != 0) return ErrnoToStatus(errno, "kill");
  return absl::OkStatus();
}

absl::StatusOr<ExitInfo> Subprocess::Wait(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return *exit_;
}

std::string Subprocess::Stdout() const { return ReadFileOrEmpty(stdout_path_); }
std::string Subprocess::Stderr() const { return ReadFileOrEmpty(stderr_path_); }

bool Subprocess::AwaitStdout(const std::string& text, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!absl::StrContains(Stdout(), text)) {
    // Its last output may have come just before it exited.
    if (!Running() || absl::Now() >= give_up) return absl::StrContains(Stdout(), text);
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& env,
                              absl::Duration timeout) {
  TempDir dir;
  ASSIGN_OR_RETURN(auto process, Subprocess::Start(argv, dir.path(), env));
  auto exit = process->Wait(timeout);
  if (!exit.ok()) return exit.status();
  return RunResult{*exit, process->Stdout(), process->Stderr()};
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool ClosedWithin(int fd, absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  bool closed = fd < 0;
  while (!closed && absl::Now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    closed = ::recv(fd, buf, sizeof(buf), 0) <= 0;
  }
  if (fd >= 0) ::close(fd);
  return closed;
}

}  // namespace muster::testing
