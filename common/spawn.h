// Spawn: starts a program (fork + exec) with the current environment plus
// overrides and the standard streams it is given. Everything the child
// needs is prepared before fork, so it is safe in multi-threaded callers.
// Used by muster-run (ranks, the embedded musterd), muster-bench and the
// test harness.
//
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_SPAWN_H_
#define MUSTER_COMMON_SPAWN_H_

#include <signal.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

struct SpawnOptions {
  // argv[0] is a path, or with search_path a name looked up in $PATH.
  std::vector<std::string> argv;
  bool search_path = false;
  // Added to (or replacing) the caller's environment.
  std::map<std::string, std::string> env;
  // The child's streams: a descriptor to give it, or -1 to keep the
  // caller's (stdin: -1 means /dev/null when null_stdin).
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  bool null_stdin = true;
  // The child leads its own process group (signals to it reach its
  // children too).
  bool new_process_group = false;
  // The child ignores SIGTTIN and SIGTTOU (kept across exec): from a
  // background process group, reading or configuring the caller's terminal
  // then fails (EIO) instead of stopping it. (Not a session of its own:
  // with autogroup scheduling each session is a scheduling group, and a
  // rank's sched_yield no longer hands its CPU to a rank of another.)
  bool ignore_terminal_stops = false;
  // The child is killed (SIGKILL) when the calling thread's process dies.
  bool die_with_parent = false;
  // The child's signal mask; default: nothing blocked. SIGPIPE is reset to
  // its default action.
  sigset_t signal_mask{};
  bool keep_signal_mask = false;  // inherit the caller's mask instead
  // Non-empty: the child runs only on these CPUs (sched_setaffinity).
  std::vector<int> cpus;
  // Names the caller in the message the child prints if exec fails.
  std::string who = "muster";
};

// The child's pid; an error if it could not be forked (an exec failure
// shows as exit status 127, with a message on the child's stderr).
absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

}  // namespace muster

#endif  // MUSTER_COMMON_SPAWN_H_
