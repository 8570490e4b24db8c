#include "daemon/admin_service.h"

namespace muster {

grpc::ServerUnaryReactor* AdminService::Health(grpc::CallbackServerContext* context,
                                               const muster::v1::HealthRequest* /*request*/,
                                               muster::v1::HealthResponse* response) {
  response->set_status(draining_.load() ? muster::v1::HealthResponse::DRAINING
                                        : muster::v1::HealthResponse::SERVING);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::Status(grpc::CallbackServerContext* context,
                                               const muster::v1::StatusRequest* /*request*/,
                                               muster::v1::StatusResponse* response) {
  *response = snapshot_();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace muster
