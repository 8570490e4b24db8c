// Well-known locations shared by musterd, musterctl and the SDK.
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_PATHS_H_
#define MUSTER_COMMON_PATHS_H_

#include <string>

#include "absl/status/status.h"

namespace muster {

// The daemon's default unix socket: /run/muster/musterd.sock for root,
// $XDG_RUNTIME_DIR/muster/musterd.sock for other users, else
// /tmp/muster-<uid>/musterd.sock. MUSTER_SOCKET, when set, wins for clients
// (the daemon only reads its --socket flag).
std::string DefaultSocketPath();

// MUSTER_SOCKET if set and non-empty, else DefaultSocketPath().
std::string ClientSocketPath();

// OK if only the caller (its effective uid) or root can have put a socket
// at `socket_path`: its directory is a real directory (not a symlink) owned
// by the caller or root and not writable by others, or, if others may
// write it, sticky (like /tmp) with the socket, when present, owned by the
// caller or root. Else PermissionDenied naming the directory, its owner
// and mode: another user may have made it to pose as musterd (the default
// /tmp/muster-<uid> can be created by anyone first).
absl::Status CheckSocketOwner(const std::string& socket_path);

// CheckSocketOwner when `socket_path` is DefaultSocketPath(), else OK: a
// path the user named (MUSTER_SOCKET, --socket) is theirs to trust, e.g. a
// daemon run by a service account. musterd checks before it listens, the
// clients before they connect.
absl::Status CheckDefaultSocketOwner(const std::string& socket_path);

}  // namespace muster

#endif  // MUSTER_COMMON_PATHS_H_
