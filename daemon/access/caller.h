// Caller: who made a gRPC call to musterd, as the listener it arrived on
// established it — a local user identified by the kernel (SO_PEERCRED on
// the unix socket) or a peer that authenticated over TCP (cluster token
// and/or a TLS client certificate).
//
// A value type; thread-compatible.
#ifndef MUSTER_DAEMON_ACCESS_CALLER_H_
#define MUSTER_DAEMON_ACCESS_CALLER_H_

#include <sys/types.h>

#include <string>

namespace muster {

struct Caller {
  enum class Via { kUnixSocket, kTcp, kInProcess };
  Via via = Via::kInProcess;
  // The caller's user, group and process (unix socket only; -1 otherwise).
  int64_t uid = -1;
  int64_t gid = -1;
  int64_t pid = -1;
  // May see and act on every job: root, musterd's own user, a member of the
  // operator group, an authenticated TCP peer, or musterd itself.
  bool privileged = false;
  // "uid 1000 (pid 4242)" or "ipv4:10.0.0.2:51234": for logs and errors.
  std::string description;

  // Whether this caller may see and act on a job whose ranks run as `owner_uid`.
  bool MayAccess(int64_t owner_uid) const { return privileged || uid == owner_uid; }

  // musterd's own calls (tests, embedded use): privileged.
  static Caller InProcess() {
    Caller c;
    c.privileged = true;
    c.description = "musterd";
    return c;
  }
};

}  // namespace muster

#endif  // MUSTER_DAEMON_ACCESS_CALLER_H_
