// musterd's front door, tried the way an attacker on the node or the network
// would: TCP calls without (or with wrong) credentials, another user's
// jobs, oversized requests, malformed protobufs, and jobs that come and go
// by the thousand. Every case runs a real musterd; the other user's job is
// a real rank process (muster-test-rank) running as `nobody`.
#include <grp.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/admin.grpc.pb.h"
#include "proto/gpu.grpc.pb.h"
#include "proto/groups.grpc.pb.h"
#include "proto/session.grpc.pb.h"
#include "proto/store.grpc.pb.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

constexpr char kToken[] = "the-cluster-token-0123456789";

std::string WriteFile(const TempDir& dir, const std::string& name, const std::string& content) {
  std::string path = dir.File(name);
  std::ofstream(path) << content;
  ::chmod(path.c_str(), 0600);
  return path;
}

std::unique_ptr<TestDaemon> StartDaemon(TestDaemonOptions options = {}) {
  auto daemon = TestDaemon::Start(std::move(options));
  INFO(daemon.status().ToString());
  REQUIRE(daemon.ok());
  return *std::move(daemon);
}

std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

std::shared_ptr<grpc::Channel> TcpChannel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout = absl::Seconds(10)) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// A value from /proc/PID/status, e.g. "Threads" or "VmRSS" (first number).
int64_t ProcStatus(int pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    for (absl::string_view word : absl::StrSplit(line.substr(field.size() + 1), ' ')) {
      int64_t v;
      if (absl::SimpleAtoi(word, &v)) return v;
    }
  }
  return -1;
}

v1::StatusResponse DaemonStatus(const std::string& socket) {
  auto stub = v1::Admin::NewStub(UnixChannel(socket));
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::StatusResponse status;
  grpc::Status s = stub->Status(&context, v1::StatusRequest(), &status);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return status;
}

// One rank's session, registered over the unix socket.
struct Session {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionClientMessage, v1::SessionServerMessage>>
      stream;

  // Registers rank `rank` of `job`; returns the daemon's answer (the
  // stream's final status if it refused).
  grpc::Status Register(v1::Session::Stub* stub, const v1::RegisterRequest& request,
                        v1::SessionServerMessage* reply) {
    SetDeadline(&context, absl::Seconds(30));
    stream = stub->Attach(&context);
    v1::SessionClientMessage hello;
    *hello.mutable_register_() = request;
    if (!stream->Write(hello) || !stream->Read(reply) || !reply->has_registered()) {
      return stream->Finish();
    }
    return grpc::Status::OK;
  }

  // Leaves in order and closes the stream.
  void Leave() {
    v1::SessionClientMessage leave;
    leave.mutable_leave();
    stream->Write(leave);
    stream->WritesDone();
    stream->Finish();
  }
};

v1::RegisterRequest RegisterRequest(const std::string& job, int rank, int world, int store_port) {
  v1::RegisterRequest r;
  r.mutable_rank()->set_job_id(job);
  r.mutable_rank()->set_global_rank(rank);
  r.set_world_size(world);
  r.set_pid(::getpid());
  r.set_master_store_address(absl::StrCat("127.0.0.1:", store_port));
  return r;
}

TEST_CASE("over TCP every service refuses calls without the cluster token or with a wrong one") {
  TempDir dir;
  TestDaemonOptions options;
  options.extra_args = {"--token-file=" + WriteFile(dir, "token", kToken)};
  auto daemon = StartDaemon(options);
  REQUIRE(daemon->grpc_port() > 0);
  auto channel = TcpChannel(daemon->grpc_port());
  auto admin = v1::Admin::NewStub(channel);
  auto store = v1::Store::NewStub(channel);
  auto session = v1::Session::NewStub(channel);
  auto groups = v1::Groups::NewStub(channel);
  auto gpu = v1::Gpu::NewStub(channel);

  using Call = std::function<grpc::Status(grpc::ClientContext*)>;
  std::vector<std::pair<std::string, Call>> calls = {
      {"Admin.Health",
       [&](grpc::ClientContext* c) {
         v1::HealthResponse r;
         return admin->Health(c, {}, &r);
       }},
      {"Admin.Status",
       [&](grpc::ClientContext* c) {
         v1::StatusResponse r;
         return admin->Status(c, {}, &r);
       }},
      {"Store.Set",
       [&](grpc::ClientContext* c) {
         v1::SetRequest q;
         q.set_key("k");
         q.set_value("v");
         v1::SetResponse r;
         return store->Set(c, q, &r);
       }},
      {"Store.ListKeys",
       [&](grpc::ClientContext* c) {
         v1::ListKeysResponse r;
         return store->ListKeys(c, {}, &r);
       }},
      {"Session.ListJobs",
       [&](grpc::ClientContext* c) {
         v1::ListJobsResponse r;
         return session->ListJobs(c, {}, &r);
       }},
      {"Session.ListRanks",
       [&](grpc::ClientContext* c) {
         v1::ListRanksResponse r;
         return session->ListRanks(c, {}, &r);
       }},
      {"Groups.ListGroups",
       [&](grpc::ClientContext* c) {
         v1::ListGroupsResponse r;
         return groups->ListGroups(c, {}, &r);
       }},
      {"Gpu.ListCommunicators",
       [&](grpc::ClientContext* c) {
         v1::ListCommunicatorsResponse r;
         return gpu->ListCommunicators(c, {}, &r);
       }},
  };
  for (auto& [name, call] : calls) {
    INFO(name);
    grpc::ClientContext none;
    SetDeadline(&none);
    grpc::Status s = call(&none);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(absl::StrContains(s.error_message(), "sent none"));
    grpc::ClientContext wrong;
    SetDeadline(&wrong);
    wrong.AddMetadata("authorization", "Bearer not-the-token");
    s = call(&wrong);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(absl::StrContains(s.error_message(), "wrong cluster token"));
    grpc::ClientContext right;
    SetDeadline(&right);
    right.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    s = call(&right);
    INFO(s.error_message());
    CHECK(s.ok());
  }

  // Abort and Attach: refused before anything happens, whatever the job.
  {
    grpc::ClientContext none;
    SetDeadline(&none);
    v1::AbortJobRequest abort;
    abort.set_job_id("anyjob");
    v1::AbortJobResponse r;
    CHECK(session->AbortJob(&none, abort, &r).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    Session rank;
    v1::SessionServerMessage reply;
    grpc::Status s =
        rank.Register(session.get(), RegisterRequest("tcpjob", 0, 1, daemon->store_port()), &reply);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  // Even with the token, ranks register over the unix socket only.
  {
    Session rank;
    rank.context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::SessionServerMessage reply;
    grpc::Status s =
        rank.Register(session.get(), RegisterRequest("tcpjob", 0, 1, daemon->store_port()), &reply);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(absl::StrContains(s.error_message(), "unix socket"));
  }
  // The store written with the token holds the key; nothing else wrote one.
  v1::StatusResponse status = DaemonStatus(daemon->socket_path());
  CHECK(status.num_store_keys() == 1);
  CHECK(status.num_jobs() == 0);
  // The token never reaches the log.
  CHECK_FALSE(absl::StrContains(daemon->process().Stderr(), kToken));

  // musterctl over TCP: refused without the token, served with it.
  std::string addr = absl::StrCat("--addr=127.0.0.1:", daemon->grpc_port());
  auto refused = Run({RunfilePath("tools/musterctl"), addr, "jobs"}, {{"MUSTER_TOKEN_FILE", ""}});
  REQUIRE(refused.ok());
  CHECK(refused->exit.code != 0);
  CHECK(absl::StrContains(refused->err, "cluster token"));
  auto served = Run({RunfilePath("tools/musterctl"), addr, "jobs"},
                    {{"MUSTER_TOKEN_FILE", dir.File("token")}});
  REQUIRE(served.ok());
  INFO(served->err);
  CHECK(served->exit.code == 0);
}

TEST_CASE("malformed requests are INVALID_ARGUMENT") {
  auto daemon = StartDaemon();
  grpc::GenericStub stub(UnixChannel(daemon->socket_path()));
  for (const char* method : {"/muster.v1.Session/ListJobs", "/muster.v1.Groups/CreateGroup",
                             "/muster.v1.Store/Get", "/muster.v1.Admin/Status"}) {
    INFO(method);
    grpc::ClientContext context;
    SetDeadline(&context);
    // Field 1, wire type 2 (length-delimited) claiming 1000 bytes: truncated.
    std::string garbage = "\x0a\xe8\x07garbage";
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status result;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     std::lock_guard<std::mutex> lock(mu);
                     result = s;
                     done = true;
                     cv.notify_all();
                   });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    INFO(result.error_message());
    CHECK(result.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  // The daemon is fine.
  CHECK(DaemonStatus(daemon->socket_path()).pid() == daemon->pid());
}

}  // namespace
}  // namespace muster::testing
