// ProcessGone: whether a process id still names a running process, for
// code that waits on or cleans up after other processes (the daemon's
// registry, a collective waiting for a peer's writes).
//
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_PROCESS_H_
#define MUSTER_COMMON_PROCESS_H_

#include <cstdint>

namespace muster {

// True if `pid` no longer runs: no such process, or one that exited and
// waits to be reaped (a zombie, or dead). False while it runs, when the
// caller may not signal it (it exists), and for a pid <= 0 (not a
// process's id: nothing known about it).
bool ProcessGone(int64_t pid);

}  // namespace muster

#endif  // MUSTER_COMMON_PROCESS_H_
