#include "daemon/peer_trace.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/store_auth.h"
#include "proto/admin.grpc.pb.h"
#include "proto/groups.grpc.pb.h"

namespace muster {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

std::string DaemonProof(absl::string_view token, absl::string_view daemon_id,
                        absl::string_view address, absl::string_view nonce) {
  return store_auth::HmacSha256(
      token, absl::StrCat("muster-daemon-proof-v1\n", daemon_id, "\n", address, "\n", nonce));
}

absl::StatusOr<v1::TraceResponse> TracePeer(const PeerCredentials& credentials,
                                            const std::string& daemon, const std::string& address,
                                            const v1::TraceRequest& request, absl::Time deadline) {
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials =
      grpc::InsecureChannelCredentials();
  if (!credentials.ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = credentials.ca_pem;
    ssl.pem_cert_chain = credentials.cert_pem;
    ssl.pem_private_key = credentials.key_pem;
    channel_credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, channel_credentials, args);
  if (!credentials.token.empty()) {
    absl::StatusOr<std::string> nonce = store_auth::RandomNonce();
    if (!nonce.ok()) return nonce.status();
    v1::ProveDaemonRequest ask;
    ask.set_daemon_id(daemon);
    ask.set_address(address);
    ask.set_nonce(*nonce);
    v1::ProveDaemonResponse answer;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status s = v1::Admin::NewStub(channel)->ProveDaemon(&context, ask, &answer);
    if (!s.ok()) {
      // A peer that is down or slow is reported as such; one that answers
      // but does not prove the token is not the daemon asked for.
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
          s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
          s.error_code() == grpc::StatusCode::CANCELLED) {
        return FromGrpc(s);
      }
      return absl::UnauthenticatedError(absl::StrCat(
          "the server did not prove it is musterd ", daemon,
          " with the cluster token, so it was not sent the token (", FromGrpc(s).ToString(), ")"));
    }
    if (!store_auth::ProofEquals(answer.proof(),
                                 DaemonProof(credentials.token, daemon, address, *nonce))) {
      return absl::UnauthenticatedError(
          absl::StrCat("the server answered with a wrong proof of the cluster token for musterd ",
                       daemon, ", so it was not sent the token"));
    }
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!credentials.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", credentials.token));
  }
  v1::TraceResponse response;
  grpc::Status s = v1::Groups::NewStub(channel)->Trace(&context, request, &response);
  if (!s.ok()) return FromGrpc(s);
  return response;
}

}  // namespace muster
