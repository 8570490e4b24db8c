// musterctl: inspect and control a running musterd. `musterctl --help`.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/paths.h"
#include "common/store_wire.h"
#include "proto/admin.grpc.pb.h"
#include "proto/store.grpc.pb.h"
#include "tools/daemon_client.h"

namespace muster {
namespace {

struct CtlOptions {
  DaemonTarget target;
  bool json = false;
  absl::Duration timeout;
  std::string prefix;
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

// Store errors: unreachable daemon vs. an answer that is an error.
int StoreError(const CtlOptions& options, const grpc::Status& rpc, const std::string& what) {
  if (rpc.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return Unreachable(options, FromGrpc(rpc, what));
  }
  std::fprintf(stderr, "musterctl: store %s: %s\n", what.c_str(), rpc.error_message().c_str());
  return 1;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "musterctl: %s (see musterctl --help)\n", message.c_str());
  return 2;
}

int RunStore(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() < 2) return Usage("store needs a subcommand: get, set, add, del, keys, wait");
  const std::string& sub = args[1];
  auto stub = muster::v1::Store::NewStub(ConnectToDaemon(options.target));
  // Blocking calls wait up to --timeout on the daemon; the RPC gets 5 s more.
  int64_t wait_ms = absl::ToInt64Milliseconds(options.timeout);
  auto context = ContextWithTimeout(options.timeout + absl::Seconds(5));
  grpc::Status rpc;
  if (sub == "get" && args.size() == 3) {
    v1::GetRequest req;
    req.set_key(args[2]);
    req.mutable_timeout()->set_millis(wait_ms);
    v1::GetResponse resp;
    rpc = stub->Get(context.get(), req, &resp);
    if (!rpc.ok()) return StoreError(options, rpc, "get");
    if (options.json) {
      JsonWriter w;
      w.BeginObject().Key("key").String(args[2]).Key("value").String(resp.value()).EndObject();
      std::printf("%s\n", w.str().c_str());
    } else {
      std::fwrite(resp.value().data(), 1, resp.value().size(), stdout);
      std::printf("\n");
    }
    return 0;
  }
  if (sub == "set" && args.size() == 4) {
    v1::SetRequest req;
    req.set_key(args[2]);
    req.set_value(args[3]);
    v1::SetResponse resp;
    rpc = stub->Set(context.get(), req, &resp);
    return rpc.ok() ? 0 : StoreError(options, rpc, "set");
  }
  if (sub == "add" && args.size() == 4) {
    int64_t delta;
    if (!absl::SimpleAtoi(args[3], &delta))
      return Usage("store add KEY DELTA: DELTA must be an integer");
    v1::AddRequest req;
    req.set_key(args[2]);
    req.set_delta(delta);
    v1::AddResponse resp;
    rpc = stub->Add(context.get(), req, &resp);
    if (!rpc.ok()) return StoreError(options, rpc, "add");
    std::printf("%lld\n", static_cast<long long>(resp.value()));
    return 0;
  }
  if (sub == "del" && args.size() == 3) {
    v1::DeleteKeyRequest req;
    req.set_key(args[2]);
    v1::DeleteKeyResponse resp;
    rpc = stub->DeleteKey(context.get(), req, &resp);
    if (!rpc.ok()) return StoreError(options, rpc, "del");
    if (!resp.deleted()) {
      std::fprintf(stderr, "musterctl: store del: no key '%s'\n",
                   wire::PrintableKey(args[2]).c_str());
      return 1;
    }
    return 0;
  }
  if (sub == "keys" && args.size() == 2) {
    v1::ListKeysRequest req;
    req.set_prefix(options.prefix);
    v1::ListKeysResponse resp;
    rpc = stub->ListKeys(context.get(), req, &resp);
    if (!rpc.ok()) return StoreError(options, rpc, "keys");
    if (options.json) {
      JsonWriter w;
      w.BeginArray();
      for (const std::string& k : resp.keys()) w.String(k);
      w.EndArray();
      std::printf("%s\n", w.str().c_str());
    } else {
      for (const std::string& k : resp.keys()) std::printf("%s\n", wire::PrintableKey(k).c_str());
    }
    return 0;
  }
  if (sub == "wait" && args.size() >= 3) {
    v1::WaitRequest req;
    for (size_t i = 2; i < args.size(); ++i) req.add_keys(args[i]);
    req.mutable_timeout()->set_millis(wait_ms);
    v1::WaitResponse resp;
    rpc = stub->Wait(context.get(), req, &resp);
    return rpc.ok() ? 0 : StoreError(options, rpc, "wait");
  }
  return Usage(absl::StrCat("bad store command: ", absl::StrJoin(args, " ")));
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
  flags.AddDouble("timeout", &timeout_seconds,
                  "Seconds to wait for the daemon's answer (store get/wait: for the keys).");
  flags.AddString("prefix", &options.prefix, "store keys: only keys starting with this.");
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
  if (args[0] == "store") return muster::RunStore(options, args);
  std::fprintf(stderr, "musterctl: unknown command '%s' (see musterctl --help)\n", args[0].c_str());
  return 2;
}
