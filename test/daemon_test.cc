// Integration tests of a real musterd process and the real musterctl binary:
// start, status, double start, graceful shutdown, unreachable daemon,
// systemd notification, --help.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "muster/tcp_store.h"
#include "proto/admin.grpc.pb.h"
#include "proto/session.grpc.pb.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

std::string Musterctl() { return RunfilePath("tools/musterctl"); }

std::unique_ptr<TestDaemon> StartDaemon(TestDaemonOptions options = {}) {
  auto daemon = TestDaemon::Start(std::move(options));
  INFO(daemon.status().ToString());
  REQUIRE(daemon.ok());
  return *std::move(daemon);
}

// A cluster token file for daemons that serve gRPC over TCP.
struct ClusterToken {
  TempDir dir;
  std::string path = dir.File("cluster.token");
  std::string token = "cluster-token-for-tests";
  ClusterToken() {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(token.c_str(), f);
    std::fclose(f);
    ::chmod(path.c_str(), 0600);
  }
  std::string DaemonFlag() const { return "--token-file=" + path; }
};

TEST_CASE("without a token or TLS musterd serves no TCP gRPC, and says so") {
  auto daemon = StartDaemon();
  CHECK(daemon->grpc_port() == 0);
  CHECK(absl::StrContains(daemon->process().Stderr(), "gRPC over TCP is off"));
  auto status = Run({Musterctl(), daemon->SocketFlag(), "status", "--json"});
  REQUIRE(status.ok());
  CHECK(status->exit.code == 0);
}

TEST_CASE("musterd writes its ready file and answers Health and Status over both transports") {
  ClusterToken token;
  TestDaemonOptions options;
  options.extra_args = {token.DaemonFlag()};
  auto daemon = StartDaemon(options);
  CHECK(daemon->grpc_port() > 0);
  CHECK(daemon->store_port() > 0);
  CHECK(daemon->store_port() != daemon->grpc_port());
  CHECK(daemon->version() == "0.1.0");
  CHECK(FileExists(daemon->socket_path()));

  for (const std::string& target :
       {"unix:" + daemon->socket_path(), "127.0.0.1:" + std::to_string(daemon->grpc_port())}) {
    INFO(target);
    auto stub =
        muster::v1::Admin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    grpc::ClientContext health_context;
    health_context.AddMetadata("authorization", "Bearer " + token.token);
    muster::v1::HealthResponse health;
    REQUIRE(stub->Health(&health_context, {}, &health).ok());
    CHECK(health.status() == muster::v1::HealthResponse::SERVING);
    grpc::ClientContext status_context;
    status_context.AddMetadata("authorization", "Bearer " + token.token);
    muster::v1::StatusResponse status;
    REQUIRE(stub->Status(&status_context, {}, &status).ok());
    CHECK(status.pid() == daemon->pid());
    CHECK(status.grpc_port() == daemon->grpc_port());
    CHECK(status.socket_path() == daemon->socket_path());
    CHECK(status.uptime_seconds() >= 0);
    CHECK(status.store_port() == daemon->store_port());
  }
}

TEST_CASE("musterctl status prints a table, and JSON with --json, for --socket and --addr") {
  ClusterToken token;
  TestDaemonOptions options;
  options.extra_args = {token.DaemonFlag()};
  auto daemon = StartDaemon(options);
  auto table = Run({Musterctl(), daemon->SocketFlag(), "status"});
  REQUIRE(table.ok());
  INFO(table->err);
  CHECK(table->exit.exited);
  CHECK(table->exit.code == 0);
  CHECK(absl::StrContains(table->out, "health     SERVING"));
  CHECK(absl::StrContains(table->out, "pid        " + std::to_string(daemon->pid())));
  CHECK(absl::StrContains(table->out, "socket     " + daemon->socket_path()));

  auto json = Run({Musterctl(), "--addr=127.0.0.1:" + std::to_string(daemon->grpc_port()),
                   "--token-file=" + token.path, "status", "--json"});
  REQUIRE(json.ok());
  CHECK(json->exit.code == 0);
  auto parsed = ParseFlatJsonObject(json->out);
  INFO(json->out);
  REQUIRE(parsed.ok());
  CHECK(parsed->at("health") == "SERVING");
  CHECK(parsed->at("pid") == std::to_string(daemon->pid()));
  CHECK(parsed->at("grpc_port") == std::to_string(daemon->grpc_port()));
  CHECK(parsed->at("socket") == daemon->socket_path());
  CHECK(parsed->at("sessions") == "0");
  CHECK(parsed->at("groups") == "0");

  // MUSTER_SOCKET is the default target.
  auto by_env = Run({Musterctl(), "status"}, {{"MUSTER_SOCKET", daemon->socket_path()}});
  REQUIRE(by_env.ok());
  CHECK(by_env->exit.code == 0);
}

TEST_CASE("a second musterd on the same socket refuses to start and leaves the first intact") {
  auto first = StartDaemon();
  TestDaemonOptions options;
  options.socket_path = first->socket_path();
  auto second = TestDaemon::Start(options);
  REQUIRE_FALSE(second.ok());
  CHECK(absl::StrContains(second.status().message(), "exited with status 1"));
  CHECK(absl::StrContains(second.status().message(),
                          "another musterd (pid " + std::to_string(first->pid()) +
                              ") is already serving " + first->socket_path()));
  CHECK(FileExists(first->socket_path()));
  auto status = Run({Musterctl(), first->SocketFlag(), "status"});
  REQUIRE(status.ok());
  CHECK(status->exit.code == 0);
}

TEST_CASE("a daemon killed with SIGKILL does not block its successor on the same socket") {
  auto first = StartDaemon();
  auto killed = first->Stop(SIGKILL);
  REQUIRE(killed.ok());
  CHECK(killed->signal == SIGKILL);
  CHECK(FileExists(first->socket_path()));  // stale socket left behind
  TestDaemonOptions options;
  options.socket_path = first->socket_path();
  auto second = StartDaemon(options);
  auto status = Run({Musterctl(), second->SocketFlag(), "status"});
  REQUIRE(status.ok());
  CHECK(status->exit.code == 0);
}

TEST_CASE("SIGTERM and SIGINT stop musterd with exit 0 within 5 s and remove its files") {
  int signal_number = GENERATE(SIGTERM, SIGINT);
  INFO("signal " << signal_number);
  auto daemon = StartDaemon();
  absl::Time start = absl::Now();
  auto exit = daemon->Stop(signal_number, absl::Seconds(5));
  REQUIRE(exit.ok());
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(exit->exited);
  CHECK(exit->code == 0);
  CHECK_FALSE(FileExists(daemon->socket_path()));
  CHECK_FALSE(FileExists(daemon->socket_path() + ".lock"));
  CHECK_FALSE(FileExists(daemon->ready_file()));
  CHECK(absl::StrContains(daemon->process().Stderr(), "shut down"));
}

TEST_CASE("musterctl reports an unreachable daemon in one line with a non-zero exit") {
  TempDir dir;
  auto result = Run({Musterctl(), "--socket=" + dir.File("nobody.sock"), "status"});
  REQUIRE(result.ok());
  CHECK(result->exit.code == 1);
  CHECK(result->out.empty());
  CHECK(absl::StartsWith(
      result->err, "musterctl: cannot reach musterd at unix socket " + dir.File("nobody.sock")));
  CHECK(std::count(result->err.begin(), result->err.end(), '\n') == 1);

  auto tcp = Run({Musterctl(), "--addr=127.0.0.1:1", "--timeout=2", "status"});
  REQUIRE(tcp.ok());
  CHECK(tcp->exit.code == 1);
  CHECK(absl::StartsWith(tcp->err, "musterctl: cannot reach musterd at 127.0.0.1:1"));
}

TEST_CASE("musterctl rejects bad usage with exit 2") {
  auto unknown = Run({Musterctl(), "frobnicate"});
  REQUIRE(unknown.ok());
  CHECK(unknown->exit.code == 2);
  CHECK(absl::StrContains(unknown->err, "unknown command 'frobnicate'"));
  auto both = Run({Musterctl(), "--socket=/x", "--addr=h:1", "status"});
  REQUIRE(both.ok());
  CHECK(both->exit.code == 2);
}

TEST_CASE("musterd tells systemd READY=1 and STOPPING=1 through NOTIFY_SOCKET") {
  TempDir dir;
  std::string notify_path = dir.File("notify");
  int fd = ::socket(AF_UNIX, SOCK_DGRAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify_path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

  TestDaemonOptions options;
  options.env["NOTIFY_SOCKET"] = notify_path;
  auto daemon = StartDaemon(options);
  char buf[256] = {};
  ssize_t n = ::recv(fd, buf, sizeof(buf) - 1, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, n) == "READY=1\nMAINPID=" + std::to_string(daemon->pid()));
  auto exit = daemon->Stop();
  REQUIRE(exit.ok());
  CHECK(exit->code == 0);
  n = ::recv(fd, buf, sizeof(buf) - 1, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, n) == "STOPPING=1");
  ::close(fd);
}

TEST_CASE("musterd --help documents every flag; bad flags exit 2 naming the flag") {
  auto help = Run({RunfilePath("daemon/musterd"), "--help"});
  REQUIRE(help.ok());
  CHECK(help->exit.code == 0);
  for (const char* flag : {"--socket",
                           "--listen",
                           "--grpc-port",
                           "--grpc-idle-seconds",
                           "--dump-max-bytes",
                           "--ready-file",
                           "--shutdown-grace-seconds",
                           "--log-level",
                           "--version",
                           "--store",
                           "--store-port",
                           "--store-token-file",
                           "--store-allow-unauthenticated",
                           "--store-max-key-bytes",
                           "--store-max-value-bytes",
                           "--store-max-keys-per-request",
                           "--store-max-request-bytes",
                           "--store-max-connections",
                           "--store-max-total-bytes",
                           "--store-max-unauthenticated-connections",
                           "--store-auth-timeout-seconds",
                           "--state-dir",
                           "--store-fsync",
                           "--token-file",
                           "--tls-cert",
                           "--tls-key",
                           "--tls-ca",
                           "--socket-mode",
                           "--socket-group",
                           "--operator-group",
                           "--max-world-size",
                           "--max-group-size",
                           "--max-jobs",
                           "--job-grace-seconds",
                           "--node-cpus"}) {
    INFO(flag);
    CHECK(absl::StrContains(help->out, flag));
  }
  auto bad = Run({RunfilePath("daemon/musterd"), "--grpc-port=http"});
  REQUIRE(bad.ok());
  CHECK(bad->exit.code == 2);
  CHECK(absl::StrContains(bad->err, "--grpc-port"));
}

TEST_CASE("musterd says how it counts its ranks' CPUs; --node-cpus sets them") {
  {
    auto daemon = StartDaemon(TestDaemonOptions{});
    // Counted per group from the ranks; musterd's own is the fallback.
    CHECK(absl::StrContains(daemon->process().Stderr(), "musterd runs on "));
    CHECK(absl::StrContains(daemon->process().Stderr(), "(affinity "));
    CHECK(absl::StrContains(daemon->process().Stderr(),
                            "each group counts the CPUs of its ranks' affinity"));
  }
  {
    TestDaemonOptions options;
    options.extra_args = {"--node-cpus=3"};
    auto daemon = StartDaemon(options);
    CHECK(absl::StrContains(daemon->process().Stderr(), "ranks share 3 CPU(s) (--node-cpus)"));
  }
  auto bad = Run({RunfilePath("daemon/musterd"), "--node-cpus=-1"});
  REQUIRE(bad.ok());
  CHECK(bad->exit.code == 2);
  CHECK(absl::StrContains(bad->err, "--node-cpus must be in [0, 65536], got -1"));
}

TEST_CASE("secrets that others can read are warned about; an empty token file is refused") {
  ClusterToken token;
  ::chmod(token.path.c_str(), 0644);
  TestDaemonOptions options;
  options.extra_args = {token.DaemonFlag()};
  auto daemon = StartDaemon(options);
  CHECK(absl::StrContains(daemon->process().Stderr(),
                          "--token-file " + token.path + " is readable by group or others"));
  CHECK_FALSE(absl::StrContains(daemon->process().Stderr(), token.token));

  std::string empty = token.dir.File("empty.token");
  std::fclose(std::fopen(empty.c_str(), "w"));
  auto refused = Run({RunfilePath("daemon/musterd"), "--token-file=" + empty,
                      "--socket=" + token.dir.File("s.sock")});
  REQUIRE(refused.ok());
  CHECK(refused->exit.code == 2);
  CHECK(absl::StrContains(refused->err, "--token-file " + empty + " is empty"));
}

TEST_CASE("musterctl --help documents its credentials for TCP") {
  auto help = Run({Musterctl(), "--help"});
  REQUIRE(help.ok());
  CHECK(help->exit.code == 0);
  for (const char* text : {"--token-file", "--tls-ca", "--tls-cert", "--tls-key",
                           "MUSTER_TOKEN_FILE", "MUSTER_TLS_CA"}) {
    INFO(text);
    CHECK(absl::StrContains(help->out, text));
  }
  auto missing = Run({Musterctl(), "--addr=127.0.0.1:1", "--token-file=/nonexistent", "status"});
  REQUIRE(missing.ok());
  CHECK(missing->exit.code == 2);
  CHECK(absl::StrContains(missing->err, "cannot read token file /nonexistent"));
}

TEST_CASE("musterd fails clearly when its gRPC port is taken") {
  ClusterToken token;
  TestDaemonOptions first_options;
  first_options.extra_args = {token.DaemonFlag()};
  auto first = StartDaemon(first_options);
  TestDaemonOptions options;
  options.extra_args = {token.DaemonFlag(), "--grpc-port=" + std::to_string(first->grpc_port())};
  auto second = TestDaemon::Start(options);
  REQUIRE_FALSE(second.ok());
  CHECK(absl::StrContains(second.status().message(),
                          "cannot serve gRPC on 127.0.0.1:" + std::to_string(first->grpc_port())));
}

TEST_CASE("musterd runs without its GPU plugin; musterctl gpu says why GPUs are unavailable") {
  TestDaemonOptions options;
  options.extra_args = {"--gpu-plugin=/nonexistent/libmuster_cuda.so"};
  auto daemon = StartDaemon(options);
  auto gpu = Run({Musterctl(), daemon->SocketFlag(), "gpu", "--json"});
  REQUIRE(gpu.ok());
  INFO(gpu->out);
  CHECK(gpu->exit.code == 0);
  CHECK(gpu->out.find("\"unavailable\":\"cannot load musterd's GPU plugin "
                      "/nonexistent/libmuster_cuda.so") != std::string::npos);
  CHECK(gpu->out.find("\"communicators\":[]") != std::string::npos);
  // The rest of the daemon is unaffected.
  auto status = Run({Musterctl(), daemon->SocketFlag(), "status"});
  REQUIRE(status.ok());
  CHECK(status->exit.code == 0);
}

// A rank's raw session stream over the daemon's unix socket.
struct RawSession {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionClientMessage, v1::SessionServerMessage>>
      stream;

  RawSession(v1::Session::Stub* stub, const std::string& job, int rank, int world, int port) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stream = stub->Attach(&context);
    v1::SessionClientMessage hello;
    v1::RegisterRequest* r = hello.mutable_register_();
    r->mutable_rank()->set_job_id(job);
    r->mutable_rank()->set_global_rank(rank);
    r->set_world_size(world);
    r->set_pid(::getpid());
    r->set_master_store_address(absl::StrCat("127.0.0.1:", port));
    REQUIRE(stream->Write(hello));
  }
};

TEST_CASE("registered is a session's first message even when a failure is reported meanwhile") {
  // A replacement for rank 2 registers while rank 2's old process still
  // holds the rank (its takeover waits for gone/2); rank 0 dies meanwhile,
  // and its failure is pushed to every local session of the job. The
  // replacement must read `registered` first and the failure after it (an
  // SDK that read the failure first gave up on registering and hung).
  auto daemon = StartDaemon();
  TcpStoreOptions so;
  so.port = daemon->store_port();
  auto store = TcpStore::Connect(so);
  REQUIRE(store.ok());
  const std::string prefix = "muster/order/0/";
  const std::string old_holder = "elsewhere\t999999\tdaemon-x";
  REQUIRE((*store)->Set(prefix + "rank/2", old_holder).ok());

  auto channel =
      grpc::CreateChannel("unix:" + daemon->socket_path(), grpc::InsecureChannelCredentials());
  auto stub = v1::Session::NewStub(channel);
  auto rank0 = std::make_unique<RawSession>(stub.get(), "order", 0, 3, daemon->store_port());
  v1::SessionServerMessage reply;
  REQUIRE(rank0->stream->Read(&reply));
  REQUIRE(reply.has_registered());

  RawSession rank2(stub.get(), "order", 2, 3, daemon->store_port());
  absl::SleepFor(absl::Milliseconds(300));  // its takeover wait has begun
  rank0->context.TryCancel();               // rank 0's process is gone
  rank0->stream->Finish();
  rank0.reset();
  absl::SleepFor(absl::Milliseconds(500));  // the failure was pushed meanwhile
  REQUIRE((*store)->Set(prefix + "gone/2", old_holder).ok());

  REQUIRE(rank2.stream->Read(&reply));
  INFO(reply.DebugString());
  CHECK(reply.has_registered());
  CHECK(reply.registered().rejoin_epoch() == 1);
  REQUIRE(rank2.stream->Read(&reply));
  INFO(reply.DebugString());
  REQUIRE(reply.has_rank_failed());
  CHECK(reply.rank_failed().rank().rank().global_rank() == 0);
  rank2.context.TryCancel();
  rank2.stream->Finish();
}

}  // namespace
}  // namespace muster::testing
