#include "daemon/admin_service.h"

#include "absl/strings/str_cat.h"
#include "common/store_auth.h"
#include "daemon/peer_trace.h"

namespace muster {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(
      s.ok() ? grpc::Status::OK
             : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message())));
  return reactor;
}

}  // namespace

absl::Status AdminService::Admit(grpc::CallbackServerContext* context) const {
  if (access_ == nullptr) return absl::OkStatus();
  return access_->Admit(*context, nullptr).status();
}

grpc::ServerUnaryReactor* AdminService::Health(grpc::CallbackServerContext* context,
                                               const muster::v1::HealthRequest* /*request*/,
                                               muster::v1::HealthResponse* response) {
  absl::Status admitted = Admit(context);
  if (admitted.ok()) {
    response->set_status(draining_.load() ? muster::v1::HealthResponse::DRAINING
                                          : muster::v1::HealthResponse::SERVING);
  }
  return Finish(context, admitted);
}

grpc::ServerUnaryReactor* AdminService::Status(grpc::CallbackServerContext* context,
                                               const muster::v1::StatusRequest* /*request*/,
                                               muster::v1::StatusResponse* response) {
  absl::Status admitted = Admit(context);
  if (admitted.ok()) *response = snapshot_();
  return Finish(context, admitted);
}

void AdminService::SetIdentity(std::string daemon_id, std::string address,
                               std::string cluster_token) {
  absl::MutexLock lock(&identity_mu_);
  daemon_id_ = std::move(daemon_id);
  address_ = std::move(address);
  cluster_token_ = std::move(cluster_token);
}

grpc::ServerUnaryReactor* AdminService::ProveDaemon(grpc::CallbackServerContext* context,
                                                    const muster::v1::ProveDaemonRequest* request,
                                                    muster::v1::ProveDaemonResponse* response) {
  // No Admit: the caller proves nothing here, this daemon does. The request
  // is checked before anything is computed.
  absl::MutexLock lock(&identity_mu_);
  // The refusals name nothing of this daemon: the caller is not known.
  absl::Status s;
  if (address_.empty()) {
    s = absl::UnavailableError("ProveDaemon: this musterd does not serve TCP gRPC yet");
  } else if (cluster_token_.empty()) {
    s = absl::FailedPreconditionError("ProveDaemon: this musterd has no cluster token to prove");
  } else if (request->nonce().size() != store_auth::kNonceBytes) {
    s = absl::InvalidArgumentError(absl::StrCat("ProveDaemon: the nonce must be ",
                                                store_auth::kNonceBytes, " bytes, not ",
                                                request->nonce().size()));
  } else if (request->daemon_id() != daemon_id_ || request->address() != address_) {
    // A daemon answers only for itself: otherwise a listener in the place
    // of a stopped daemon could relay the question to a live one.
    s = absl::PermissionDeniedError(
        "ProveDaemon: this musterd is not the daemon id and address asked for");
  } else {
    response->set_proof(DaemonProof(cluster_token_, daemon_id_, address_, request->nonce()));
  }
  return Finish(context, s);
}

}  // namespace muster
