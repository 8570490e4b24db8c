// Well-known locations shared by musterd, musterctl and the SDK.
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_PATHS_H_
#define MUSTER_COMMON_PATHS_H_

#include <string>

namespace muster {

// The daemon's default unix socket: /run/muster/musterd.sock for root,
// $XDG_RUNTIME_DIR/muster/musterd.sock for other users, else
// /tmp/muster-<uid>/musterd.sock. MUSTER_SOCKET, when set, wins for clients
// (the daemon only reads its --socket flag).
std::string DefaultSocketPath();

// MUSTER_SOCKET if set and non-empty, else DefaultSocketPath().
std::string ClientSocketPath();

}  // namespace muster

#endif  // MUSTER_COMMON_PATHS_H_
