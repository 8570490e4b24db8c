// musterd's command line: flags, signal handling and the daemon's life,
// shared by the musterd binary and test builds of it (which adjust the
// DaemonOptions, e.g. to plug in a fake GPU runtime).
#ifndef MUSTER_DAEMON_MUSTERD_CLI_H_
#define MUSTER_DAEMON_MUSTERD_CLI_H_

#include <functional>

#include "daemon/daemon.h"

namespace muster {

// Parses flags, runs the daemon until SIGTERM/SIGINT and returns the exit
// status. `customize` (may be empty) edits the options before the start.
int RunMusterd(int argc, char** argv, const std::function<void(DaemonOptions&)>& customize);

}  // namespace muster

#endif  // MUSTER_DAEMON_MUSTERD_CLI_H_
