// TracePeer sends the cluster token only to a server that proved it knows
// it, as the daemon the member record names, at the address called; and
// AdminService.ProveDaemon answers only for its own identity. A real gRPC
// server on loopback with the real AdminService and a Groups service that
// records what reached it.
#include "daemon/peer_trace.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/store_auth.h"
#include "daemon/admin_service.h"
#include "proto/admin.grpc.pb.h"
#include "proto/groups.grpc.pb.h"

namespace muster {
namespace {

constexpr char kToken[] = "the cluster token";

// Groups.Trace that records the authorization each call carried.
class RecordingGroups final : public v1::Groups::CallbackService {
 public:
  grpc::ServerUnaryReactor* Trace(grpc::CallbackServerContext* context,
                                  const v1::TraceRequest* request,
                                  v1::TraceResponse* response) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = context->client_metadata().find("authorization");
      authorizations_.push_back(it == context->client_metadata().end()
                                    ? "(none)"
                                    : std::string(it->second.data(), it->second.size()));
    }
    response->add_unreachable(absl::StrCat("answered for job ", request->job_id()));
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::vector<std::string> authorizations() {
    std::lock_guard<std::mutex> lock(mu_);
    return authorizations_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> authorizations_;
};

// A server on 127.0.0.1 with Groups and, unless `with_admin` is false, the
// real AdminService, which proves `token` for `id` at `proves_address`
// ("": its own address).
struct Peer {
  explicit Peer(const std::string& id, const std::string& token, bool with_admin = true,
                const std::string& proves_address = "")
      : admin([] { return v1::StatusResponse(); }, nullptr) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    if (with_admin) builder.RegisterService(&admin);
    builder.RegisterService(&groups);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    address = absl::StrCat("127.0.0.1:", port);
    admin.SetIdentity(id, proves_address.empty() ? address : proves_address, token);
  }
  ~Peer() { server->Shutdown(); }

  AdminService admin;
  RecordingGroups groups;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

absl::StatusOr<v1::TraceResponse> Ask(const Peer& peer, const std::string& daemon,
                                      const std::string& token = kToken) {
  v1::TraceRequest request;
  request.set_job_id("job");
  return TracePeer(PeerCredentials{token, "", "", ""}, daemon, peer.address, request,
                   absl::Now() + absl::Seconds(10));
}

TEST_CASE("the genuine peer proves the token and then gets the call with it") {
  Peer peer("daemon-b", kToken);
  auto answer = Ask(peer, "daemon-b");
  REQUIRE(answer.ok());
  REQUIRE(answer->unreachable_size() == 1);
  CHECK(answer->unreachable(0) == "answered for job job");
  CHECK(peer.groups.authorizations() == std::vector<std::string>{"Bearer the cluster token"});
}

// Asking `peer` for `daemon` fails UNAUTHENTICATED, saying `why`, and no
// call reached its Groups service (so neither did the token).
void CheckNotSent(Peer& peer, const std::string& daemon, const std::string& why) {
  auto answer = Ask(peer, daemon);
  REQUIRE_FALSE(answer.ok());
  CHECK(answer.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(absl::StrContains(answer.status().message(), why));
  CHECK(peer.groups.authorizations().empty());
}

TEST_CASE("a server that cannot prove the token is never sent it") {
  SECTION("it holds another token") {
    Peer peer("daemon-b", "some other token");
    CheckNotSent(peer, "daemon-b", "wrong proof of the cluster token");
  }
  SECTION("it is a live daemon asked for another daemon's id (a relay)") {
    Peer peer("daemon-c", kToken);
    CheckNotSent(peer, "daemon-b",
                 "did not prove it is musterd daemon-b with the cluster token, so it was not "
                 "sent the token (PERMISSION_DENIED: ProveDaemon: this musterd is not the daemon "
                 "id and address asked for)");
  }
  SECTION("it is the right daemon, asked at an address it does not publish (a relay)") {
    Peer peer("daemon-b", kToken, true, "10.0.0.2:7002");
    CheckNotSent(peer, "daemon-b", "not the daemon id and address asked");
  }
  SECTION("it serves no Admin.ProveDaemon (a listener of the user's own, or an old musterd)") {
    Peer peer("daemon-b", kToken, /*with_admin=*/false);
    CheckNotSent(peer, "daemon-b", "UNIMPLEMENTED");
  }
  SECTION("it is down: reported as such, not as an impostor") {
    std::string address;
    {
      Peer gone("daemon-b", kToken);
      address = gone.address;
    }
    v1::TraceRequest request;
    auto answer = TracePeer(PeerCredentials{kToken, "", "", ""}, "daemon-b", address, request,
                            absl::Now() + absl::Seconds(10));
    REQUIRE_FALSE(answer.ok());
    CHECK(answer.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("it has no token at all") {
    Peer peer("daemon-b", "");
    CheckNotSent(peer, "daemon-b", "has no cluster token");
  }
}

TEST_CASE("without a token nothing is proved and nothing secret is sent") {
  Peer peer("daemon-b", "");
  auto answer = Ask(peer, "daemon-b", "");
  REQUIRE(answer.ok());
  CHECK(peer.groups.authorizations() == std::vector<std::string>{"(none)"});
}

TEST_CASE("ProveDaemon checks the nonce and binds id, address and nonce") {
  Peer peer("daemon-b", kToken);
  auto stub =
      v1::Admin::NewStub(grpc::CreateChannel(peer.address, grpc::InsecureChannelCredentials()));
  auto prove = [&](const std::string& nonce, v1::ProveDaemonResponse* out) {
    v1::ProveDaemonRequest request;
    request.set_daemon_id("daemon-b");
    request.set_address(peer.address);
    request.set_nonce(nonce);
    grpc::ClientContext context;
    return stub->ProveDaemon(&context, request, out);
  };
  v1::ProveDaemonResponse response;
  grpc::Status short_nonce = prove("too short", &response);
  CHECK(short_nonce.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StrContains(short_nonce.error_message(), "must be 32 bytes, not 9"));

  const std::string nonce(store_auth::kNonceBytes, 'n');
  REQUIRE(prove(nonce, &response).ok());
  CHECK(response.proof() == DaemonProof(kToken, "daemon-b", peer.address, nonce));
  CHECK(response.proof().size() == store_auth::kProofBytes);
  CHECK(response.proof() != DaemonProof(kToken, "daemon-c", peer.address, nonce));
  CHECK(response.proof() != DaemonProof(kToken, "daemon-b", "10.0.0.2:7002", nonce));
  CHECK(response.proof() !=
        DaemonProof(kToken, "daemon-b", peer.address, std::string(store_auth::kNonceBytes, 'm')));
}

}  // namespace
}  // namespace muster
