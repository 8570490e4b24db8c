// musterctl: inspect and control a running musterd. `musterctl --help`.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/paths.h"
#include "common/store_wire.h"
#include "proto/admin.grpc.pb.h"
#include "proto/gpu.grpc.pb.h"
#include "proto/groups.grpc.pb.h"
#include "proto/session.grpc.pb.h"
#include "proto/state_names.h"
#include "proto/store.grpc.pb.h"
#include "proto/trace_json.h"
#include "tools/daemon_client.h"

namespace muster {
namespace {

struct CtlOptions {
  DaemonTarget target;
  bool json = false;
  absl::Duration timeout;
  std::string prefix;
  std::string job;
  std::string reason;
  int64_t rank = -1;   // trace: only this global rank
  int64_t last = -1;   // trace: the last N records per rank (-1: unset)
  bool local = false;  // trace, why: this daemon's members only (no gather)
};

// Members' daemons a gathered Trace could not ask, on stderr.
void ReportUnreachable(const v1::TraceResponse& resp) {
  for (const std::string& u : resp.unreachable()) {
    std::fprintf(stderr, "musterctl: records missing from %s\n", u.c_str());
  }
}

// Prints rows as left-aligned columns under a header.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  };
  print(header);
  for (const auto& row : rows) print(row);
}

std::string MemberRanks(const v1::GroupInfo& g) {
  std::vector<int> ranks;
  for (const auto& m : g.members()) ranks.push_back(m.global_rank());
  return ranks.empty() ? "-" : absl::StrJoin(ranks, ",");
}

void GroupJson(JsonWriter& w, const v1::GroupInfo& g) {
  w.BeginObject()
      .Key("job")
      .String(g.job_id())
      .Key("generation")
      .Int(g.generation())
      .Key("epoch")
      .Int(g.epoch())
      .Key("name")
      .String(g.name())
      .Key("tag")
      .String(g.tag())
      .Key("backend")
      .String(g.backend())
      .Key("state")
      .String(GroupStateName(g.state()))
      .Key("broken_reason")
      .String(g.broken_reason())
      .Key("dump_path")
      .String(g.dump_path())
      .Key("local_synchronization")
      .Bool(g.local_synchronization())
      .Key("timeout_seconds")
      .Double(g.timeout_millis() / 1000.0)
      .Key("members")
      .BeginArray();
  for (const auto& m : g.members()) {
    w.BeginObject()
        .Key("global_rank")
        .Int(m.global_rank())
        .Key("group_rank")
        .Int(m.group_rank())
        .Key("node")
        .String(m.node())
        .Key("pid")
        .Int(m.pid())
        .Key("state")
        .String(m.state())
        .Key("last_submitted_seq")
        .Int(m.last_submitted_seq())
        .Key("last_completed_seq")
        .Int(m.last_completed_seq())
        .EndObject();
  }
  w.EndArray().EndObject();
}

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
  auto context = ContextWithTimeout(options.target, options.timeout);
  grpc::Status rpc = admin->Health(context.get(), muster::v1::HealthRequest(), &health);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "Health"));
  muster::v1::StatusResponse status;
  context = ContextWithTimeout(options.target, options.timeout);
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
        .Key("store_durable")
        .Bool(status.store_durable())
        .Key("store_log_error")
        .String(status.store_log_error())
        .Key("store_memory_bytes")
        .Int(status.store_memory_bytes())
        .Key("store_refused_for_memory")
        .Int(status.store_refused_for_memory())
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
        {"store log", !status.store_durable() ? std::string("none (memory only)")
                      : status.store_log_error().empty()
                          ? std::string("ok")
                          : absl::StrCat("FAILING, writes refused: ", status.store_log_error())},
        {"store mem", absl::StrCat(status.store_memory_bytes(), " bytes in use (",
                                   status.store_refused_for_memory(), " requests refused)")},
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
  auto context = ContextWithTimeout(options.target, options.timeout + absl::Seconds(5));
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

int RunRanks(const CtlOptions& options) {
  auto stub = v1::Session::NewStub(ConnectToDaemon(options.target));
  auto context = ContextWithTimeout(options.target, options.timeout);
  v1::ListRanksRequest req;
  req.set_job_id(options.job);
  v1::ListRanksResponse resp;
  grpc::Status rpc = stub->ListRanks(context.get(), req, &resp);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "ListRanks"));
  if (options.json) {
    JsonWriter w;
    w.BeginArray();
    for (const auto& r : resp.ranks()) {
      w.BeginObject()
          .Key("job")
          .String(r.rank().job_id())
          .Key("generation")
          .Int(r.generation())
          .Key("rank")
          .Int(r.rank().global_rank())
          .Key("world_size")
          .Int(r.world_size())
          .Key("local_rank")
          .Int(r.local_rank())
          .Key("host")
          .String(r.host())
          .Key("pid")
          .Int(r.pid())
          .Key("state")
          .String(RankStateName(r.state()))
          .Key("failure")
          .String(r.failure())
          .Key("epoch")
          .Int(r.epoch())
          .Key("restarts")
          .Int(r.restarts())
          .EndObject();
    }
    w.EndArray();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : resp.ranks()) {
    rows.push_back({r.rank().job_id(), absl::StrCat(r.generation()),
                    absl::StrCat(r.rank().global_rank()), absl::StrCat(r.world_size()),
                    absl::StrCat(r.local_rank()), r.host(), absl::StrCat(r.pid()),
                    absl::StrCat(r.epoch()), absl::StrCat(r.restarts()), RankStateName(r.state()),
                    r.failure()});
  }
  PrintTable({"JOB", "GEN", "RANK", "WORLD", "LOCAL", "HOST", "PID", "EPOCH", "RESTARTS", "STATE",
              "FAILURE"},
             rows);
  return 0;
}

int RunJobs(const CtlOptions& options) {
  auto stub = v1::Session::NewStub(ConnectToDaemon(options.target));
  auto context = ContextWithTimeout(options.target, options.timeout);
  v1::ListJobsResponse resp;
  grpc::Status rpc = stub->ListJobs(context.get(), v1::ListJobsRequest(), &resp);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "ListJobs"));
  if (options.json) {
    JsonWriter w;
    w.BeginArray();
    for (const auto& j : resp.jobs()) {
      w.BeginObject()
          .Key("job")
          .String(j.job_id())
          .Key("generation")
          .Int(j.generation())
          .Key("world_size")
          .Int(j.world_size())
          .Key("local_ranks")
          .Int(j.num_local_ranks())
          .Key("state")
          .String(j.state())
          .Key("uid")
          .Int(j.uid())
          .Key("epoch")
          .Int(j.epoch())
          .Key("reconfigurations")
          .BeginArray();
      for (const auto& r : j.reconfigurations()) {
        w.BeginObject().Key("epoch").Int(r.epoch()).Key("failed").BeginArray();
        for (const auto& f : r.failed()) w.String(f);
        w.EndArray().Key("replaced").BeginArray();
        for (int rank : r.replaced()) w.Int(rank);
        w.EndArray().Key("took_ms").Int(r.took_millis()).EndObject();
      }
      w.EndArray().Key("dumps").BeginArray();
      for (const auto& d : j.dumps()) w.String(d);
      w.EndArray().EndObject();
    }
    w.EndArray();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& j : resp.jobs()) {
    rows.push_back({j.job_id(), absl::StrCat(j.generation()), absl::StrCat(j.world_size()),
                    absl::StrCat(j.num_local_ranks()), j.state(), absl::StrCat(j.uid()),
                    absl::StrCat(j.epoch())});
  }
  PrintTable({"JOB", "GEN", "WORLD", "LOCAL_RANKS", "STATE", "UID", "EPOCH"}, rows);
  // How each epoch after the first came about (elastic jobs).
  for (const auto& j : resp.jobs()) {
    for (const auto& r : j.reconfigurations()) {
      std::printf(
          "job %s epoch %lld: %s; replaced rank(s) %s; formed %lld ms after the first "
          "failure\n",
          j.job_id().c_str(), static_cast<long long>(r.epoch()),
          r.failed().empty() ? "no failure seen here" : absl::StrJoin(r.failed(), "; ").c_str(),
          r.replaced().empty() ? "-" : absl::StrJoin(r.replaced(), ",").c_str(),
          static_cast<long long>(r.took_millis()));
    }
  }
  // Flight-recorder dumps of broken groups.
  for (const auto& j : resp.jobs()) {
    for (const auto& d : j.dumps()) std::printf("job %s dump: %s\n", j.job_id().c_str(), d.c_str());
  }
  return 0;
}

int RunGroups(const CtlOptions& options) {
  auto stub = v1::Groups::NewStub(ConnectToDaemon(options.target));
  auto context = ContextWithTimeout(options.target, options.timeout);
  v1::ListGroupsRequest req;
  req.set_job_id(options.job);
  v1::ListGroupsResponse resp;
  grpc::Status rpc = stub->ListGroups(context.get(), req, &resp);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "ListGroups"));
  if (options.json) {
    JsonWriter w;
    w.BeginArray();
    for (const auto& g : resp.groups()) GroupJson(w, g);
    w.EndArray();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& g : resp.groups()) {
    rows.push_back({g.job_id(), g.name(), g.backend(), GroupStateName(g.state()),
                    absl::StrCat(g.members_size()), MemberRanks(g), g.broken_reason()});
  }
  PrintTable({"JOB", "GROUP", "BACKEND", "STATE", "SIZE", "RANKS", "REASON"}, rows);
  return 0;
}

int RunGroup(const CtlOptions& options, const std::string& name) {
  auto stub = v1::Groups::NewStub(ConnectToDaemon(options.target));
  auto context = ContextWithTimeout(options.target, options.timeout);
  v1::GetGroupRequest req;
  req.set_job_id(options.job);
  req.set_name(name);
  v1::GetGroupResponse resp;
  grpc::Status rpc = stub->GetGroup(context.get(), req, &resp);
  if (rpc.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return Unreachable(options, FromGrpc(rpc, "GetGroup"));
  }
  if (!rpc.ok()) {
    std::fprintf(stderr, "musterctl: %s\n", rpc.error_message().c_str());
    return 1;
  }
  const v1::GroupInfo& g = resp.group();
  if (options.json) {
    JsonWriter w;
    GroupJson(w, g);
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf("group %s (job %s, generation %lld, epoch %lld)\n", g.name().c_str(),
              g.job_id().c_str(), static_cast<long long>(g.generation()),
              static_cast<long long>(g.epoch()));
  std::printf("backend  %s\nstate    %s%s%s\ntimeout  %gs\n", g.backend().c_str(),
              GroupStateName(g.state()), g.broken_reason().empty() ? "" : ": ",
              g.broken_reason().c_str(), g.timeout_millis() / 1000.0);
  if (!g.tag().empty()) std::printf("tag      %s\n", g.tag().c_str());
  if (!g.dump_path().empty()) std::printf("dump     %s\n", g.dump_path().c_str());
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : g.members()) {
    rows.push_back({absl::StrCat(m.global_rank()), absl::StrCat(m.group_rank()), m.node(),
                    absl::StrCat(m.pid()), m.state(), absl::StrCat(m.restarts()),
                    m.last_submitted_seq() ? absl::StrCat(m.last_submitted_seq()) : "-",
                    m.last_completed_seq() ? absl::StrCat(m.last_completed_seq()) : "-"});
  }
  PrintTable({"RANK", "GROUP_RANK", "NODE", "PID", "STATE", "RESTARTS", "SUBMITTED", "COMPLETED"},
             rows);
  return 0;
}

// A duration for a table cell: "850ns", "12.3us", "4.1ms", "41s".
std::string ShortDuration(int64_t nanos) {
  if (nanos < 0) nanos = 0;
  if (nanos < 1000) return absl::StrCat(nanos, "ns");
  if (nanos < 1000000) return absl::StrFormat("%.1fus", nanos / 1e3);
  if (nanos < 1000000000) return absl::StrFormat("%.1fms", nanos / 1e6);
  return absl::StrFormat("%.1fs", nanos / 1e9);
}

// One rank's record in the trace table: how it ended (its duration) or
// what it does now (since when); the call itself where it differs from the
// row's.
std::string TraceCell(const v1::TraceRecord& t, const v1::TraceRecord& row, int64_t now) {
  std::string call;
  if (t.op() != row.op() || t.dtype() != row.dtype() || t.root() != row.root()) {
    call = absl::StrCat(t.op(), " ", t.dtype(), "x", t.count(),
                        t.root() >= 0 ? absl::StrCat(" root ", t.root()) : "", " ");
  } else if (t.count() != row.count()) {
    call = absl::StrCat("x", t.count(), " ");
  }
  if (t.state() == "completed") {
    return absl::StrCat(call, "ok ",
                        ShortDuration(t.completed_unix_nanos() - t.started_unix_nanos()));
  }
  if (t.state() == "failed") return absl::StrCat(call, "FAILED ", t.error());
  if (t.state() == "started") {
    return absl::StrCat(call, "IN IT ", ShortDuration(now - t.started_unix_nanos()));
  }
  return absl::StrCat(call, "queued ", ShortDuration(now - t.submitted_unix_nanos()));
}

// musterctl trace [JOB] [GROUP]: the flight recorder of this daemon's
// members, a table per group (a row per sequence number, a column per
// rank) or JSON Lines (one flat object per record).
int RunTrace(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() > 3) return Usage("trace [JOB] [GROUP] [--rank R] [--last N] [--json]");
  auto stub = v1::Groups::NewStub(ConnectToDaemon(options.target));
  auto context = ContextWithTimeout(options.target, options.timeout);
  v1::TraceRequest req;
  req.set_job_id(args.size() > 1 ? args[1] : options.job);
  if (args.size() > 2) req.set_group(args[2]);
  if (options.rank >= 0) req.set_rank(static_cast<int>(options.rank));
  // A table shows the last 32 by default; JSON everything kept.
  int64_t last = options.last >= 0 ? options.last : (options.json ? 0 : 32);
  req.set_last(last);
  req.set_gather(!options.local);
  v1::TraceResponse resp;
  grpc::Status rpc = stub->Trace(context.get(), req, &resp);
  if (rpc.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return Unreachable(options, FromGrpc(rpc, "Trace"));
  }
  if (!rpc.ok()) {
    std::fprintf(stderr, "musterctl: %s\n", rpc.error_message().c_str());
    return 1;
  }
  ReportUnreachable(resp);
  if (options.json) {
    for (const v1::GroupTrace& g : resp.groups()) {
      for (const v1::RankTrace& r : g.ranks()) {
        for (const v1::TraceRecord& t : r.records()) {
          JsonWriter w;
          TraceRecordJson(w, g, r, t);
          std::printf("%s\n", w.str().c_str());
        }
      }
    }
    return 0;
  }
  const int64_t now = resp.now_unix_nanos();
  for (const v1::GroupTrace& g : resp.groups()) {
    std::printf("job %s  group %s  (backend %s, %s%s%s; %d of %d members here)\n",
                g.job_id().c_str(), g.name().c_str(), g.backend().c_str(),
                GroupStateName(g.state()), g.broken_reason().empty() ? "" : ": ",
                g.broken_reason().c_str(), g.ranks_size(), g.size());
    // Rows: collectives by sequence number (every rank's #n in one row),
    // then point to point (no sequence) in each rank's order.
    std::map<int64_t, std::vector<const v1::TraceRecord*>> by_seq;
    std::vector<std::vector<std::string>> p2p_rows;
    for (int i = 0; i < g.ranks_size(); ++i) {
      for (const v1::TraceRecord& t : g.ranks(i).records()) {
        if (t.seq() > 0) {
          auto& row = by_seq[t.seq()];
          row.resize(g.ranks_size(), nullptr);
          row[i] = &t;
        } else {
          std::vector<std::string> row(3 + g.ranks_size(), "");
          row[0] = "-";
          row[1] = t.op();
          row[2] = absl::StrCat(t.dtype(), "x", t.count(), " peer ", t.root(), " tag ", t.tag());
          row[3 + i] = TraceCell(t, t, now);
          p2p_rows.push_back(std::move(row));
        }
      }
    }
    std::vector<std::string> header = {"SEQ", "OP", "CALL"};
    for (const v1::RankTrace& r : g.ranks())
      header.push_back(absl::StrCat("RANK ", r.global_rank()));
    std::vector<std::vector<std::string>> rows;
    for (const auto& [seq, cells] : by_seq) {
      const v1::TraceRecord* first = nullptr;
      for (const v1::TraceRecord* t : cells) {
        if (first == nullptr) first = t;
      }
      std::vector<std::string> row = {
          absl::StrCat(seq), first->op(),
          absl::StrCat(first->dtype(), "x", first->count(),
                       first->root() >= 0 ? absl::StrCat(" root ", first->root()) : "",
                       first->device() == "cuda" ? " cuda" : "")};
      for (const v1::TraceRecord* t : cells)
        row.push_back(t == nullptr ? "-" : TraceCell(*t, *first, now));
      rows.push_back(std::move(row));
    }
    for (auto& row : p2p_rows) rows.push_back(std::move(row));
    if (rows.empty()) {
      std::printf("  (no records)\n\n");
      continue;
    }
    PrintTable(header, rows);
    std::printf("\n");
  }
  return 0;
}

// "0-2,5" for ranks {0, 1, 2, 5}.
std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string Plural(size_t n, const char* one, const char* many) { return n == 1 ? one : many; }

// What `musterctl why` concludes about one group from its members' records.
struct Diagnosis {
  std::string verdict;
  std::vector<std::string> details;  // one line per rank, and mismatches
  std::vector<int> lagging;          // ranks that have not entered `seq`
  std::string op;                    // the collective the others are in
  int64_t seq = 0;
  int64_t since_nanos = 0;  // when the first rank entered it
  std::vector<int> gone;
  int mismatches = 0;
};

Diagnosis Diagnose(const v1::GroupTrace& g, const v1::GroupInfo* info, int64_t now) {
  Diagnosis d;
  // Members that are gone (failed), or left (their orderly exit), known
  // to this daemon.
  int left = 0;
  if (info != nullptr) {
    for (const auto& m : info->members()) {
      if (m.state() == "failed") d.gone.push_back(m.global_rank());
      if (m.state() == "left") ++left;
      if (m.state() == "failed" || m.state() == "left") {
        d.details.push_back(
            absl::StrCat("rank ", m.global_rank(), " (pid ", m.pid(), ") ", m.state()));
      }
    }
  }
  const bool all_left = info != nullptr && left > 0 && left == info->members_size();
  // Per rank: the newest collective it entered (submitted or later) and the
  // last it completed.
  struct Progress {
    int rank;
    const v1::TraceRecord* newest = nullptr;
    int64_t completed = 0;
  };
  std::vector<Progress> ranks;
  std::map<int64_t, std::vector<std::pair<int, const v1::TraceRecord*>>> by_seq;
  for (const v1::RankTrace& r : g.ranks()) {
    Progress p{r.global_rank()};
    for (const v1::TraceRecord& t : r.records()) {
      if (t.seq() == 0) continue;  // point to point: no group-wide order
      by_seq[t.seq()].push_back({r.global_rank(), &t});
      if (p.newest == nullptr || t.seq() > p.newest->seq()) p.newest = &t;
      if (t.state() == "completed") p.completed = std::max(p.completed, t.seq());
    }
    ranks.push_back(p);
  }
  // Mismatched signatures: one sequence number, different calls. (Each
  // rank's count of the object variants and all_to_all is its own.)
  auto own_count = [](const std::string& op) {
    return absl::EndsWith(op, "_object") || op == "all_to_all" || op == "all_reduce_coalesced";
  };
  for (const auto& [seq, cells] : by_seq) {
    const v1::TraceRecord* first = cells[0].second;
    for (const auto& [rank, t] : cells) {
      if (t->op() != first->op() || t->dtype() != first->dtype() ||
          (t->count() != first->count() && !own_count(t->op())) || t->root() != first->root()) {
        ++d.mismatches;
        d.details.push_back(absl::StrCat(
            "#", seq, ": rank ", cells[0].first, " called ", first->op(), " ", first->dtype(), "x",
            first->count(), ", rank ", rank, " ", t->op(), " ", t->dtype(), "x", t->count()));
        break;
      }
    }
  }
  int64_t top = 0;
  for (const Progress& p : ranks) {
    if (p.newest != nullptr) top = std::max<int64_t>(top, p.newest->seq());
  }
  std::vector<int> entered;
  const v1::TraceRecord* top_record = nullptr;
  for (const Progress& p : ranks) {
    if (p.newest != nullptr && p.newest->seq() == top) {
      entered.push_back(p.rank);
      int64_t at = p.newest->started_unix_nanos() > 0 ? p.newest->started_unix_nanos()
                                                      : p.newest->submitted_unix_nanos();
      if (top_record == nullptr || at < d.since_nanos) d.since_nanos = at;
      if (top_record == nullptr) top_record = p.newest;
    } else {
      d.lagging.push_back(p.rank);
    }
    std::string line = absl::StrCat("rank ", p.rank, ": last completed #", p.completed);
    if (p.newest != nullptr && p.newest->state() != "completed") {
      int64_t at = p.newest->started_unix_nanos() > 0 ? p.newest->started_unix_nanos()
                                                      : p.newest->submitted_unix_nanos();
      absl::StrAppend(
          &line, "; ", p.newest->state() == "failed" ? "failed in " : "in ", p.newest->op(), " #",
          p.newest->seq(), " (", p.newest->dtype(), "x", p.newest->count(), ")",
          p.newest->state() == "failed" ? absl::StrCat(": ", p.newest->error())
                                        : absl::StrCat(" for ", ShortDuration(now - at)));
    } else {
      absl::StrAppend(&line, "; not in a collective");
    }
    d.details.push_back(line);
  }
  if (top_record != nullptr) {
    d.op = top_record->op();
    d.seq = top;
  }
  // The verdict, most telling first.
  if (!d.lagging.empty() && top_record != nullptr) {
    d.verdict =
        absl::StrCat(Plural(d.lagging.size(), "rank ", "ranks "), RankRanges(d.lagging),
                     Plural(d.lagging.size(), " has", " have"), " not entered ", d.op, " #", d.seq,
                     " that ", Plural(entered.size(), "rank ", "ranks "), RankRanges(entered),
                     " entered ", ShortDuration(now - d.since_nanos), " ago");
  } else if (!d.gone.empty()) {
    d.verdict = absl::StrCat(Plural(d.gone.size(), "rank ", "ranks "), RankRanges(d.gone),
                             Plural(d.gone.size(), " is", " are"), " gone");
  } else if (d.mismatches > 0) {
    d.verdict = absl::StrCat("mismatched collectives (", d.mismatches, ", see below)");
  } else if (all_left) {
    d.verdict =
        absl::StrCat("finished: every member left",
                     top_record != nullptr ? absl::StrCat(" after #", top, " (", d.op, ")") : "");
  } else if (top_record == nullptr) {
    d.verdict = "no collectives recorded";
  } else {
    bool all_done = true;
    for (const Progress& p : ranks) all_done &= p.completed == top;
    d.verdict =
        all_done
            ? absl::StrCat("idle: every local member completed #", top, " (", d.op, ")")
            : absl::StrCat("every local member is in ", d.op, " #", top, " (for ",
                           ShortDuration(now - d.since_nanos),
                           g.ranks_size() < g.size() ? "; waiting for members on other nodes?" : "",
                           ")");
  }
  if (!g.broken_reason().empty()) absl::StrAppend(&d.verdict, "; broken: ", g.broken_reason());
  return d;
}

// musterctl why [JOB]: per group, who is stuck in what (from the flight
// recorder and the registry: this daemon's members and, unless --local,
// the other nodes' through their daemons).
int RunWhy(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() > 2) return Usage("why [JOB] [--json]");
  auto channel = ConnectToDaemon(options.target);
  auto stub = v1::Groups::NewStub(channel);
  v1::TraceRequest req;
  req.set_job_id(args.size() > 1 ? args[1] : options.job);
  req.set_last(64);
  req.set_gather(!options.local);
  v1::TraceResponse trace;
  auto context = ContextWithTimeout(options.target, options.timeout);
  grpc::Status rpc = stub->Trace(context.get(), req, &trace);
  if (rpc.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return Unreachable(options, FromGrpc(rpc, "Trace"));
  }
  if (!rpc.ok()) {
    std::fprintf(stderr, "musterctl: %s\n", rpc.error_message().c_str());
    return 1;
  }
  ReportUnreachable(trace);
  v1::ListGroupsRequest list;
  list.set_job_id(req.job_id());
  v1::ListGroupsResponse groups;
  auto list_context = ContextWithTimeout(options.target, options.timeout);
  (void)stub->ListGroups(list_context.get(), list, &groups);
  const int64_t now = trace.now_unix_nanos();
  JsonWriter w;
  if (options.json) w.BeginArray();
  for (const v1::GroupTrace& g : trace.groups()) {
    const v1::GroupInfo* info = nullptr;
    for (const v1::GroupInfo& i : groups.groups()) {
      if (i.job_id() == g.job_id() && i.name() == g.name()) info = &i;
    }
    Diagnosis d = Diagnose(g, info, now);
    if (options.json) {
      w.BeginObject()
          .Key("job")
          .String(g.job_id())
          .Key("group")
          .String(g.name())
          .Key("verdict")
          .String(d.verdict)
          .Key("op")
          .String(d.op)
          .Key("seq")
          .Int(d.seq)
          .Key("since_unix_nanos")
          .Int(d.since_nanos)
          .Key("lagging")
          .BeginArray();
      for (int r : d.lagging) w.Int(r);
      w.EndArray().Key("gone").BeginArray();
      for (int r : d.gone) w.Int(r);
      w.EndArray().Key("mismatches").Int(d.mismatches).Key("details").BeginArray();
      for (const std::string& line : d.details) w.String(line);
      w.EndArray().EndObject();
      continue;
    }
    std::printf("job %s group %s: %s\n", g.job_id().c_str(), g.name().c_str(), d.verdict.c_str());
    for (const std::string& line : d.details) std::printf("  %s\n", line.c_str());
  }
  if (options.json) {
    w.EndArray();
    std::printf("%s\n", w.str().c_str());
  }
  return 0;
}

int RunAbort(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() < 2 || args.size() > 3) return Usage("abort JOB [GROUP] [--reason TEXT]");
  auto channel = ConnectToDaemon(options.target);
  auto context = ContextWithTimeout(options.target, options.timeout);
  grpc::Status rpc;
  if (args.size() == 2) {
    v1::AbortJobRequest req;
    req.set_job_id(args[1]);
    req.set_reason(options.reason);
    v1::AbortJobResponse resp;
    rpc = v1::Session::NewStub(channel)->AbortJob(context.get(), req, &resp);
  } else {
    v1::AbortGroupRequest req;
    req.set_job_id(args[1]);
    req.set_name(args[2]);
    req.set_reason(options.reason);
    v1::AbortGroupResponse resp;
    rpc = v1::Groups::NewStub(channel)->AbortGroup(context.get(), req, &resp);
  }
  if (rpc.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return Unreachable(options, FromGrpc(rpc, "abort"));
  }
  if (!rpc.ok()) {
    std::fprintf(stderr, "musterctl: abort: %s\n", rpc.error_message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
int RunGpu(const CtlOptions& options) {
  auto stub = v1::Gpu::NewStub(ConnectToDaemon(options.target));
  auto context = ContextWithTimeout(options.target, options.timeout);
  v1::ListCommunicatorsRequest req;
  req.set_job_id(options.job);
  v1::ListCommunicatorsResponse resp;
  grpc::Status rpc = stub->ListCommunicators(context.get(), req, &resp);
  if (!rpc.ok()) return Unreachable(options, FromGrpc(rpc, "ListCommunicators"));
  if (options.json) {
    JsonWriter w;
    w.BeginObject().Key("unavailable").String(resp.unavailable()).Key("communicators");
    w.BeginArray();
    for (const auto& c : resp.communicators()) {
      w.BeginObject()
          .Key("job")
          .String(c.job_id())
          .Key("generation")
          .Int(c.generation())
          .Key("group")
          .String(c.group())
          .Key("global_rank")
          .Int(c.global_rank())
          .Key("group_rank")
          .Int(c.group_rank())
          .Key("group_size")
          .Int(c.group_size())
          .Key("pci_bus_id")
          .String(c.pci_bus_id())
          .Key("state")
          .String(c.state())
          .Key("origin")
          .String(c.origin())
          .Key("launched")
          .Int(static_cast<int64_t>(c.launched()))
          .Key("completed")
          .Int(static_cast<int64_t>(c.completed()))
          .Key("open_buffers")
          .Int(c.open_buffers())
          .Key("channel_requests")
          .Int(static_cast<int64_t>(c.channel_requests()))
          .Key("error")
          .String(c.error())
          .EndObject();
    }
    w.EndArray();
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  if (!resp.unavailable().empty()) {
    std::printf("GPU collectives unavailable on this daemon: %s\n", resp.unavailable().c_str());
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : resp.communicators()) {
    rows.push_back({c.job_id(), absl::StrCat(c.generation()), c.group(),
                    absl::StrCat(c.global_rank()),
                    absl::StrCat(c.group_rank(), "/", c.group_size()), c.pci_bus_id(), c.state(),
                    c.origin(), absl::StrCat(c.launched()), absl::StrCat(c.completed()),
                    absl::StrCat(c.open_buffers()), c.error()});
  }
  PrintTable({"JOB", "GEN", "GROUP", "RANK", "GROUP_RANK", "GPU", "STATE", "ORIGIN", "LAUNCHED",
              "COMPLETED", "BUFFERS", "ERROR"},
             rows);
  return 0;
}

}  // namespace muster

int main(int argc, char** argv) {
  muster::CtlOptions options;
  std::string socket_path;
  std::string address;
  std::string token_file, tls_ca, tls_cert, tls_key;
  double timeout_seconds = 5;
  muster::FlagSet flags(
      "musterctl",
      "musterctl: inspect and control a running musterd.\n"
      "Usage: musterctl [flags] COMMAND\n"
      "\n"
      "Commands:\n"
      "  status                 the daemon's identity, endpoints and counts; exit 0\n"
      "                         when healthy, 1 with a one-line reason when\n"
      "                         unreachable or draining\n"
      "  store get KEY          print a value (waits up to --timeout for the key)\n"
      "  store set KEY VALUE    set a value\n"
      "  store add KEY DELTA    add to a counter and print it\n"
      "  store del KEY          delete (exit 1 if the key did not exist)\n"
      "  store keys             list keys (--prefix P)\n"
      "  store wait KEY...      wait up to --timeout until every key exists\n"
      "  jobs                   jobs on this daemon\n"
      "  ranks                  ranks: host, pid, state, failure (--job J)\n"
      "  groups                 groups: backend, state, members (--job J)\n"
      "  group NAME             one group: members, sequence numbers (--job J)\n"
      "  abort JOB [GROUP]      fail a job's (or group's) operations (--reason TEXT)\n"
      "  gpu                    NCCL communicators owned by the daemon (--job J)\n"
      "  trace [JOB] [GROUP]    the flight recorder: each rank's last collectives (other\n"
      "                         nodes' through their daemons, unless --local),\n"
      "                         a row per sequence number, a column per rank\n"
      "                         (--rank R, --last N; --json: one object per record)\n"
      "  why [JOB]              per group: who lags, what the others are blocked in\n"
      "                         and since when, gone ranks, mismatched calls; a verdict");
  flags.AddString("socket", &socket_path,
                  "Unix socket of the daemon. Default: $MUSTER_SOCKET, else musterd's default.");
  flags.AddString("addr", &address,
                  "TCP host:port of the daemon's gRPC server (instead of --socket).");
  flags.AddString("token-file", &token_file,
                  "With --addr: file holding the cluster token (musterd --token-file).\n"
                  "Default: $MUSTER_TOKEN_FILE, else the token in $MUSTER_TOKEN.");
  flags.AddString("tls-ca", &tls_ca,
                  "With --addr: PEM CA that signed the daemon's certificate (turns TLS on).\n"
                  "Default: $MUSTER_TLS_CA.");
  flags.AddString("tls-cert", &tls_cert,
                  "With --addr and --tls-ca: PEM client certificate for mutual TLS\n"
                  "(e.g. the node's daemon certificate). Default: $MUSTER_TLS_CERT.");
  flags.AddString("tls-key", &tls_key, "PEM key of --tls-cert. Default: $MUSTER_TLS_KEY.");
  flags.AddBool("json", &options.json, "Print JSON instead of a table.");
  flags.AddDouble("timeout", &timeout_seconds,
                  "Seconds to wait for the daemon's answer (store get/wait: for the keys).");
  flags.AddString("prefix", &options.prefix, "store keys: only keys starting with this.");
  flags.AddString("job", &options.job, "ranks, groups, group, gpu: only this job.");
  flags.AddString("reason", &options.reason, "abort: the reason the ranks will see.");
  flags.AddInt("rank", &options.rank, "trace: only this global rank.");
  flags.AddBool("local", &options.local,
                "trace, why: only this daemon's members (by default musterd also asks the\n"
                "daemons of the groups' members on other nodes and merges their records).");
  flags.AddInt("last", &options.last,
               "trace: the last N records per rank (default: 32 in a table, all with --json).");
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
  if (address.empty()) {
    if (absl::Status s = muster::CheckDefaultSocketOwner(options.target.socket_path); !s.ok()) {
      std::fprintf(stderr, "musterctl: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  options.timeout = absl::Seconds(timeout_seconds);
  if (absl::Status loaded =
          muster::LoadCredentials(token_file, tls_ca, tls_cert, tls_key, &options.target);
      !loaded.ok()) {
    std::fprintf(stderr, "musterctl: %s\n", std::string(loaded.message()).c_str());
    return 2;
  }
  if (args.empty()) {
    std::fprintf(stderr, "musterctl: missing command (see musterctl --help)\n");
    return 2;
  }
  if (args[0] == "status" && args.size() == 1) return muster::RunStatus(options);
  if (args[0] == "store") return muster::RunStore(options, args);
  if (args[0] == "jobs" && args.size() == 1) return muster::RunJobs(options);
  if (args[0] == "ranks" && args.size() == 1) return muster::RunRanks(options);
  if (args[0] == "groups" && args.size() == 1) return muster::RunGroups(options);
  if (args[0] == "group" && args.size() == 2) return muster::RunGroup(options, args[1]);
  if (args[0] == "abort") return muster::RunAbort(options, args);
  if (args[0] == "gpu" && args.size() == 1) return muster::RunGpu(options);
  if (args[0] == "trace") return muster::RunTrace(options, args);
  if (args[0] == "why") return muster::RunWhy(options, args);
  std::fprintf(stderr, "musterctl: unknown command '%s' (see musterctl --help)\n", args[0].c_str());
  return 2;
}
