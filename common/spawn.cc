#include "common/spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

extern char** environ;

namespace muster {
namespace {

// Writes `parts` to stderr with write(2) only (async-signal-safe).
void SayInChild(const char* a, const char* b, const char* c) {
  for (const char* s : {a, ": cannot run ", b, ": ", c, "\n"}) {
    (void)!::write(STDERR_FILENO, s, std::strlen(s));
  }
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("nothing to run (empty argv)");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    if (options.env.count(entry.substr(0, entry.find('='))) == 0) env_strings.push_back(entry);
  }
  for (const auto& [name, value] : options.env) {
    env_strings.push_back(absl::StrCat(name, "=", value));
  }
  std::vector<char*> c_argv, c_env;
  for (const std::string& a : options.argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const std::string& e : env_strings) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  int null_fd = -1;
  if (options.stdin_fd < 0 && options.null_stdin) {
    null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0) return ErrnoToStatus(errno, "open /dev/null");
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : options.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  }
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int saved = errno;
    if (null_fd >= 0) ::close(null_fd);
    return ErrnoToStatus(saved, "fork");
  }
  if (pid == 0) {
    if (options.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    if (options.new_process_group) ::setpgid(0, 0);
    if (options.ignore_terminal_stops) {
      ::signal(SIGTTIN, SIG_IGN);
      ::signal(SIGTTOU, SIG_IGN);
    }
    int in = options.stdin_fd >= 0 ? options.stdin_fd : null_fd;
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    if (options.stdout_fd >= 0) ::dup2(options.stdout_fd, STDOUT_FILENO);
    if (options.stderr_fd >= 0) ::dup2(options.stderr_fd, STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    if (!options.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      SayInChild(options.who.c_str(), c_argv[0], std::strerror(errno));
      ::_exit(127);
    }
    if (!options.keep_signal_mask) ::sigprocmask(SIG_SETMASK, &options.signal_mask, nullptr);
    if (options.search_path) {
      ::execvpe(c_argv[0], c_argv.data(), c_env.data());
    } else {
      ::execve(c_argv[0], c_argv.data(), c_env.data());
    }
    SayInChild(options.who.c_str(), c_argv[0], std::strerror(errno));
    ::_exit(127);
  }
  // Also from here, so that the group exists when Spawn returns (a signal to
  // it must not miss the child). Fails harmlessly once the child has exec'd.
  if (options.new_process_group) ::setpgid(pid, pid);
  if (null_fd >= 0) ::close(null_fd);
  return pid;
}

}  // namespace muster
