// musterctl: inspect and control a running musterd. `musterctl --help`.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/paths.h"
#include "proto/admin.grpc.pb.h"
#include "tools/daemon_client.h"

namespace muster {
namespace {

struct CtlOptions {
  DaemonTarget target;
  bool json = false;
  absl::Duration timeout;
};

std::string FormatUptime(double seconds) {
  int64_t s = static_cast<int64_t>(seconds);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m ", s % 60, "s");
  if (s < 86400) return absl::StrCat(s / 3600, "h ", (s / 60) % 60, "m");
  return absl::StrCat(s / 86400, "d ", (s / 3600) % 24, "h");
}

// One line on stderr, exit code 1: the daemon could not answer.
int Unreachable(const CtlOptions& options, const absl::Status& status) {
  std::fprintf(stderr, "musterctl: cannot reach musterd at %s: %s\n",
               options.target.Describe().c_str(), std::string(status.message()).c_str());
  return 1;
}

int RunStatus(const CtlOptions& options) {
  auto channel = ConnectToDaemon(options.target);
  auto admin = muster::v1::Admin::NewStub(channel);
  muster::v1::HealthResponse health;
  auto context = ContextWithTimeout(options.timeout);
  grpc::Status rpc = admin->Health(context.get(), muster::v1::HealthRequest(), &health);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "Health"));
  muster::v1::StatusResponse status;
  context = ContextWithTimeout(options.timeout);
  rpc = admin->Status(context.get(), muster::v1::StatusRequest(), &status);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "Status"));
  bool healthy = health.status() == muster::v1::HealthResponse::SERVING;
  std::string health_text = muster::v1::HealthResponse::ServingStatus_Name(health.status());

  if (options.json) {
    JsonWriter w;
    w.BeginObject()
        .Key("health")
        .String(health_text)
        .Key("version")
        .String(status.version())
        .Key("pid")
        .Int(status.pid())
        .Key("hostname")
        .String(status.hostname())
        .Key("uptime_seconds")
        .Double(status.uptime_seconds())
        .Key("socket")
        .String(status.socket_path())
        .Key("grpc_address")
        .String(status.grpc_address())
        .Key("grpc_port")
        .Int(status.grpc_port())
        .Key("store_address")
        .String(status.store_address())
        .Key("store_port")
        .Int(status.store_port())
        .Key("store_keys")
        .Int(status.num_store_keys())
        .Key("store_connections")
        .Int(status.num_store_connections())
        .Key("sessions")
        .Int(status.num_sessions())
        .Key("jobs")
        .Int(status.num_jobs())
        .Key("groups")
        .Int(status.num_groups())
        .EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::vector<std::pair<std::string, std::string>> rows = {
        {"health", health_text},
        {"version", status.version()},
        {"host", status.hostname()},
        {"pid", absl::StrCat(status.pid())},
        {"uptime", FormatUptime(status.uptime_seconds())},
        {"socket", status.socket_path()},
        {"grpc", status.grpc_address()},
        {"store", status.store_port() == 0
                      ? std::string("not running")
                      : absl::StrCat(status.store_address(), " (", status.num_store_keys(),
                                     " keys, ", status.num_store_connections(), " connections)")},
        {"sessions", absl::StrCat(status.num_sessions())},
        {"jobs", absl::StrCat(status.num_jobs())},
        {"groups", absl::StrCat(status.num_groups())},
    };
    for (const auto& [name, value] : rows) {
      std::printf("%-10s %s\n", name.c_str(), value.c_str());
    }
  }
  if (!healthy) {
    std::fprintf(stderr, "musterctl: musterd at %s is %s\n", options.target.Describe().c_str(),
                 health_text.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  muster::CtlOptions options;
  std::string socket_path;
  std::string address;
  double timeout_seconds = 5;
  muster::FlagSet flags(
      "musterctl",
      "musterctl: inspect and control a running musterd.\n"
      "Usage: musterctl [flags] COMMAND\n"
      "\n"
      "Commands:\n"
      "  status    the daemon's identity, endpoints and counts; exit 0 when\n"
      "            healthy, 1 with a one-line reason when unreachable or draining");
  flags.AddString("socket", &socket_path,
                  "Unix socket of the daemon. Default: $MUSTER_SOCKET, else musterd's default.");
  flags.AddString("addr", &address,
                  "TCP host:port of the daemon's gRPC server (instead of --socket).");
  flags.AddBool("json", &options.json, "Print JSON instead of a table.");
  flags.AddDouble("timeout", &timeout_seconds, "Seconds to wait for the daemon's answer.");
  std::vector<std::string> args = flags.ParseOrExit(argc, argv);

  if (!socket_path.empty() && !address.empty()) {
    std::fprintf(stderr, "musterctl: give --socket or --addr, not both\n");
    return 2;
  }
  if (!(timeout_seconds > 0)) {
    std::fprintf(stderr, "musterctl: --timeout must be positive\n");
    return 2;
  }
  options.target.address = address;
  options.target.socket_path = socket_path.empty() ? muster::ClientSocketPath() : socket_path;
  options.timeout = absl::Seconds(timeout_seconds);
  if (args.empty()) {
    std::fprintf(stderr, "musterctl: missing command (see musterctl --help)\n");
    return 2;
  }
  if (args[0] == "status" && args.size() == 1) return muster::RunStatus(options);
  std::fprintf(stderr, "musterctl: unknown command '%s' (see musterctl --help)\n", args[0].c_str());
  return 2;
}
