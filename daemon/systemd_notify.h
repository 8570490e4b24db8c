// Tells systemd about the daemon's state (sd_notify protocol: one datagram
// to the unix socket named by $NOTIFY_SOCKET, "@" meaning the abstract
// namespace). Without NOTIFY_SOCKET every call is a successful no-op.
//
// Thread-safe: each call opens and closes its own socket.
#ifndef MUSTER_DAEMON_SYSTEMD_NOTIFY_H_
#define MUSTER_DAEMON_SYSTEMD_NOTIFY_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace muster {

// Sends `state`, e.g. "READY=1\nMAINPID=123" or "STOPPING=1".
absl::Status NotifySystemd(absl::string_view state);

}  // namespace muster

#endif  // MUSTER_DAEMON_SYSTEMD_NOTIFY_H_
