#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "daemon/access/access_policy.h"
#include "daemon/access/unix_listener.h"
#include "proto/admin.grpc.pb.h"
#include "proto/session.pb.h"

namespace muster {
namespace {

TEST_CASE("CheckFieldLimits names the first field over its limit, nested too") {
  FieldLimits limits;
  v1::RegisterRequest ok;
  ok.mutable_rank()->set_job_id("job");
  ok.set_host("node1");
  CHECK(CheckFieldLimits(ok, limits).ok());

  v1::RegisterRequest big_host = ok;
  big_host.set_host(std::string(1 << 20, 'h'));
  absl::Status s = CheckFieldLimits(big_host, limits);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "muster.v1.RegisterRequest.host is 1048576 bytes"));
  CHECK(absl::StrContains(s.message(), "limit 255"));

  v1::RegisterRequest long_job = ok;
  long_job.mutable_rank()->set_job_id(std::string(129, 'j'));
  s = CheckFieldLimits(long_job, limits);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "job_id is 129 bytes (limit 128)"));

  v1::RegisterRequest long_other = ok;
  long_other.set_master_store_address(std::string(5000, 'a'));
  s = CheckFieldLimits(long_other, limits);
  CHECK(absl::StrContains(s.message(), "master_store_address is 5000 bytes (limit 4096)"));
}

TEST_CASE("SecretsEqual compares whole secrets") {
  CHECK(SecretsEqual("token", "token"));
  CHECK_FALSE(SecretsEqual("token", "tokeN"));
  CHECK_FALSE(SecretsEqual("token", "token2"));
  CHECK_FALSE(SecretsEqual("", "token"));
  CHECK(SecretsEqual("", ""));
}

TEST_CASE("socket modes and groups parse") {
  CHECK(*ParseSocketMode("0660") == 0660);
  CHECK(*ParseSocketMode("666") == 0666);
  CHECK_FALSE(ParseSocketMode("0999").ok());
  CHECK_FALSE(ParseSocketMode("rw").ok());
  CHECK(*ResolveGroup("") == -1);
  CHECK(*ResolveGroup("0") == 0);
  CHECK(*ResolveGroup("root") == 0);
  CHECK(ResolveGroup("no-such-group-muster").status().code() == absl::StatusCode::kNotFound);
}

// Answers Status with who the policy says is calling (in `hostname`).
class WhoAmI final : public v1::Admin::CallbackService {
 public:
  explicit WhoAmI(AccessPolicy* policy) : policy_(policy) {}
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context, const v1::StatusRequest*,
                                   v1::StatusResponse* response) override {
    auto* reactor = context->DefaultReactor();
    auto caller = policy_->Admit(*context, nullptr);
    if (!caller.ok()) {
      reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(caller.status().code()),
                                   std::string(caller.status().message())));
      return reactor;
    }
    response->set_hostname(caller->description);
    response->set_pid(caller->uid);
    response->set_num_jobs(caller->privileged ? 1 : 0);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  AccessPolicy* policy_;
};

grpc::Status Ask(const std::string& target, const std::string& token, v1::StatusResponse* out) {
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  return stub->Status(&context, v1::StatusRequest(), out);
}

TEST_CASE("unix callers are identified by the kernel; TCP callers need the token") {
  AccessOptions options;
  options.token = "s3cret-token";
  AccessPolicy policy(options);
  WhoAmI service(&policy);
  char dir_template[] = "/tmp/muster-access-XXXXXX";  // TEST_TMPDIR is too long for a socket
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  std::string dir = dir_template;
  std::string path = dir + "/s.sock";
  UnixListenerOptions lo;
  lo.path = path;
  lo.mode = 0600;
  auto listener = UnixListener::Bind(lo, &policy);
  INFO(listener.status().ToString());
  REQUIRE(listener.ok());
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  (*listener)->Serve(server.get());

  v1::StatusResponse who;
  grpc::Status s = Ask("unix:" + path, "", &who);
  REQUIRE(s.ok());
  CHECK(who.pid() == static_cast<int64_t>(::getuid()));
  CHECK(absl::StartsWith(who.hostname(), absl::StrCat("uid ", ::getuid(), " (pid ", ::getpid())));
  CHECK(who.num_jobs() == 1);  // musterd's own user is privileged

  std::string tcp = absl::StrCat("127.0.0.1:", port);
  s = Ask(tcp, "", &who);
  CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(absl::StrContains(s.error_message(), "sent none"));
  s = Ask(tcp, "wrong", &who);
  CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(absl::StrContains(s.error_message(), "wrong cluster token"));
  CHECK_FALSE(absl::StrContains(s.error_message(), "s3cret"));
  s = Ask(tcp, "s3cret-token", &who);
  REQUIRE(s.ok());
  CHECK(absl::StartsWith(who.hostname(), "ipv4:127.0.0.1:"));
  CHECK(who.num_jobs() == 1);

  (*listener)->Stop();
  server->Shutdown();
  listener->reset();
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace muster
