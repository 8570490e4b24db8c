#include "daemon/admin_service.h"

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

}  // namespace muster
