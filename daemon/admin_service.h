// AdminService: the muster.v1.Admin gRPC service (Health, Status,
// ProveDaemon).
//
// It owns no state of its own: Status asks a snapshot function supplied by
// the daemon. Thread-safe: handlers run on gRPC's callback threads and only
// read atomics or call the (thread-safe) snapshot function; they never block.
// Any local user may call Health and Status; TCP callers must authenticate.
// ProveDaemon needs no credentials (peers ask it before they send theirs):
// it answers only for this daemon's id and TCP address, with an HMAC under
// the cluster token (daemon/peer_trace.h), and only once SetIdentity gave
// them.
#ifndef MUSTER_DAEMON_ADMIN_SERVICE_H_
#define MUSTER_DAEMON_ADMIN_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "daemon/access/access_policy.h"
#include "proto/admin.grpc.pb.h"

namespace muster {

class AdminService final : public muster::v1::Admin::CallbackService {
 public:
  using SnapshotFn = std::function<muster::v1::StatusResponse()>;
  // `access` (outlives the service) authenticates callers; nullptr: anyone.
  AdminService(SnapshotFn snapshot, const AccessPolicy* access)
      : snapshot_(std::move(snapshot)), access_(access) {}

  // What ProveDaemon answers for: this daemon's id (GroupMember.daemon), the
  // TCP address it publishes, and the cluster token (empty: it refuses, there
  // is no token to prove).
  void SetIdentity(std::string daemon_id, std::string address, std::string cluster_token);

  // After this, Health reports DRAINING.
  void SetDraining() { draining_.store(true); }

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const muster::v1::HealthRequest* request,
                                   muster::v1::HealthResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const muster::v1::StatusRequest* request,
                                   muster::v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* ProveDaemon(grpc::CallbackServerContext* context,
                                        const muster::v1::ProveDaemonRequest* request,
                                        muster::v1::ProveDaemonResponse* response) override;

 private:
  // OK, or why the caller may not call (UNAUTHENTICATED over TCP).
  absl::Status Admit(grpc::CallbackServerContext* context) const;

  SnapshotFn snapshot_;
  const AccessPolicy* access_;
  absl::Mutex identity_mu_;
  std::string daemon_id_ ABSL_GUARDED_BY(identity_mu_);
  std::string address_ ABSL_GUARDED_BY(identity_mu_);
  std::string cluster_token_ ABSL_GUARDED_BY(identity_mu_);
  std::atomic<bool> draining_{false};
};

}  // namespace muster

#endif  // MUSTER_DAEMON_ADMIN_SERVICE_H_
