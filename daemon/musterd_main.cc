// musterd: the per-node muster daemon. `musterd --help` lists every flag.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/flags.h"
#include "common/logging.h"
#include "common/paths.h"
#include "common/version.h"
#include "daemon/daemon.h"

namespace {

bool SetLogLevel(const std::string& name) {
  if (name == "debug") {
    muster::SetMinLogLevel(muster::LogLevel::kDebug);
  } else if (name == "info") {
    muster::SetMinLogLevel(muster::LogLevel::kInfo);
  } else if (name == "warning") {
    muster::SetMinLogLevel(muster::LogLevel::kWarning);
  } else if (name == "error") {
    muster::SetMinLogLevel(muster::LogLevel::kError);
  } else {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  muster::SetLogProgramName("musterd");
  muster::DaemonOptions options;
  int64_t grpc_port = options.grpc_port;
  double grace_seconds = absl::ToDoubleSeconds(options.shutdown_grace);
  std::string log_level = "info";
  bool print_version = false;

  muster::FlagSet flags(
      "musterd",
      "musterd: the per-node muster daemon (rendezvous store, process groups, collectives).\n"
      "Usage: musterd [flags]\n"
      "Serves gRPC on a unix socket (local ranks, musterctl) and on TCP (peer daemons).\n"
      "Stops gracefully on SIGTERM or SIGINT (exit 0).");
  flags.AddString("socket", &options.socket_path,
                  "Unix socket for local ranks and musterctl. Empty means the default:\n"
                  "/run/muster/musterd.sock as root, else $XDG_RUNTIME_DIR/muster/musterd.sock,\n"
                  "else /tmp/muster-<uid>/musterd.sock.");
  flags.AddString("listen", &options.listen_address,
                  "Address the TCP gRPC server binds to (0.0.0.0, 127.0.0.1, ::, ...).");
  flags.AddInt("grpc-port", &grpc_port, "TCP port of the gRPC server; 0 picks a free port.");
  flags.AddString(
      "ready-file", &options.ready_file,
      "Once serving, write {\"pid\",\"grpc_port\",\"store_port\",\"socket\",\"version\"}\n"
      "as one JSON object to this path (atomically); removed on shutdown.");
  flags.AddDouble("shutdown-grace-seconds", &grace_seconds,
                  "On SIGTERM/SIGINT, how long in-flight RPCs may finish before they are\n"
                  "cancelled (0 to 60).");
  flags.AddString("log-level", &log_level, "Least severe log level: debug, info, warning, error.");
  flags.AddBool("version", &print_version, "Print the version and exit.");
  std::vector<std::string> positional = flags.ParseOrExit(argc, argv);

  if (print_version) {
    std::printf("musterd %s\n", muster::kVersion);
    return 0;
  }
  if (!positional.empty()) {
    std::fprintf(stderr, "musterd: unexpected argument '%s' (see musterd --help)\n",
                 positional[0].c_str());
    return 2;
  }
  if (!SetLogLevel(log_level)) {
    std::fprintf(stderr, "musterd: --log-level must be debug, info, warning or error, got '%s'\n",
                 log_level.c_str());
    return 2;
  }
  if (!(grace_seconds >= 0 && grace_seconds <= 60)) {
    std::fprintf(stderr, "musterd: --shutdown-grace-seconds must be in [0, 60]\n");
    return 2;
  }
  if (grpc_port < 0 || grpc_port > 65535) {
    std::fprintf(stderr, "musterd: --grpc-port must be in [0, 65535], got %lld\n",
                 static_cast<long long>(grpc_port));
    return 2;
  }
  options.grpc_port = static_cast<int>(grpc_port);
  options.shutdown_grace = absl::Seconds(grace_seconds);
  if (options.socket_path.empty()) options.socket_path = muster::DefaultSocketPath();

  // Block the stop signals in every thread (gRPC's threads inherit this
  // mask); the main thread collects them with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = muster::Daemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "musterd: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  MLOG(INFO) << "received " << strsignal(signal_number) << ", stopping";
  (*daemon)->Shutdown();
  return 0;
}
