// A rank's init against a daemon that takes the session but never answers
// (stuck or stopped) fails at the init timeout, naming the socket, instead
// of blocking for good.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "muster/world.h"
#include "proto/session.grpc.pb.h"
#include "test/subprocess.h"

namespace muster {
namespace {

// Takes every session stream and never writes to it.
class SilentSession : public v1::Session::CallbackService {
  class Reactor
      : public grpc::ServerBidiReactor<v1::SessionClientMessage, v1::SessionServerMessage> {
   public:
    Reactor() { StartRead(&message_); }
    void OnReadDone(bool ok) override {
      if (ok) StartRead(&message_);  // take what comes, answer nothing
    }
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }

   private:
    v1::SessionClientMessage message_;
  };

 public:
  grpc::ServerBidiReactor<v1::SessionClientMessage, v1::SessionServerMessage>* Attach(
      grpc::CallbackServerContext*) override {
    return new Reactor();
  }
};

TEST_CASE("init against a daemon that never answers fails at the init timeout") {
  testing::TempDir dir;
  const std::string socket = dir.File("musterd.sock");
  SilentSession service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);

  InitOptions options;
  options.job_id = "silent";
  options.rank = 0;
  options.world_size = 1;
  options.master_addr = "127.0.0.1";
  options.master_port = 1;
  options.socket = socket;
  options.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto world = World::Init(options);
  const absl::Duration took = absl::Now() - start;
  REQUIRE_FALSE(world.ok());
  INFO(world.status().ToString());
  CHECK(world.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::StrContains(world.status().message(), "did not answer its registration"));
  CHECK(absl::StrContains(world.status().message(), socket));
  CHECK(took >= absl::Seconds(2));
  CHECK(took < absl::Seconds(20));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

}  // namespace
}  // namespace muster
