// AdminService: the muster.v1.Admin gRPC service (Health, Status).
//
// It owns no state of its own: Status asks a snapshot function supplied by
// the daemon. Thread-safe: handlers run on gRPC's callback threads and only
// read atomics or call the (thread-safe) snapshot function; they never block.
// Any local user may call it; TCP callers must authenticate.
#ifndef MUSTER_DAEMON_ADMIN_SERVICE_H_
#define MUSTER_DAEMON_ADMIN_SERVICE_H_

#include <atomic>
#include <functional>

#include "daemon/access/access_policy.h"
#include "proto/admin.grpc.pb.h"

namespace muster {

class AdminService final : public muster::v1::Admin::CallbackService {
 public:
  using SnapshotFn = std::function<muster::v1::StatusResponse()>;
  // `access` (outlives the service) authenticates callers; nullptr: anyone.
  AdminService(SnapshotFn snapshot, const AccessPolicy* access)
      : snapshot_(std::move(snapshot)), access_(access) {}

  // After this, Health reports DRAINING.
  void SetDraining() { draining_.store(true); }

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const muster::v1::HealthRequest* request,
                                   muster::v1::HealthResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const muster::v1::StatusRequest* request,
                                   muster::v1::StatusResponse* response) override;

 private:
  // OK, or why the caller may not call (UNAUTHENTICATED over TCP).
  absl::Status Admit(grpc::CallbackServerContext* context) const;

  SnapshotFn snapshot_;
  const AccessPolicy* access_;
  std::atomic<bool> draining_{false};
};

}  // namespace muster

#endif  // MUSTER_DAEMON_ADMIN_SERVICE_H_
