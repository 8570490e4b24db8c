// The Session and Groups gRPC services: thin adapters from RPCs to the
// Registry. Session.Attach is a bidirectional stream per rank whose end
// tells the daemon the rank is gone; the Groups calls that wait (formation,
// barriers) finish from registry callbacks, never blocking a gRPC thread.
//
// Every call is admitted by the AccessPolicy first (who is calling, field
// limits); the registry then decides what that caller may see and do.
//
// Thread-safe.
#ifndef MUSTER_DAEMON_REGISTRY_SERVICES_H_
#define MUSTER_DAEMON_REGISTRY_SERVICES_H_

#include "daemon/access/access_policy.h"
#include "daemon/registry/registry.h"
#include "proto/groups.grpc.pb.h"
#include "proto/session.grpc.pb.h"

namespace muster {

// The caller of `context`, admitted by `access` (nullptr: musterd itself).
absl::StatusOr<Caller> AdmitCaller(const AccessPolicy* access,
                                   const grpc::CallbackServerContext& context,
                                   const google::protobuf::Message* request);

class SessionService final : public v1::Session::CallbackService {
 public:
  // `access` (outlives the service) admits callers; nullptr: every caller
  // is treated as musterd itself (tests).
  SessionService(Registry* registry, const AccessPolicy* access)
      : registry_(registry), access_(access) {}

  grpc::ServerBidiReactor<v1::SessionClientMessage, v1::SessionServerMessage>* Attach(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListRanks(grpc::CallbackServerContext* context,
                                      const v1::ListRanksRequest* request,
                                      v1::ListRanksResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* AbortJob(grpc::CallbackServerContext* context,
                                     const v1::AbortJobRequest* request,
                                     v1::AbortJobResponse* response) override;

 private:
  Registry* registry_;
  const AccessPolicy* access_;
};

class GroupsService final : public v1::Groups::CallbackService {
 public:
  GroupsService(Registry* registry, const AccessPolicy* access)
      : registry_(registry), access_(access) {}

  grpc::ServerUnaryReactor* CreateGroup(grpc::CallbackServerContext* context,
                                        const v1::CreateGroupRequest* request,
                                        v1::CreateGroupResponse* response) override;
  grpc::ServerUnaryReactor* DestroyGroup(grpc::CallbackServerContext* context,
                                         const v1::DestroyGroupRequest* request,
                                         v1::DestroyGroupResponse* response) override;
  grpc::ServerUnaryReactor* ListGroups(grpc::CallbackServerContext* context,
                                       const v1::ListGroupsRequest* request,
                                       v1::ListGroupsResponse* response) override;
  grpc::ServerUnaryReactor* GetGroup(grpc::CallbackServerContext* context,
                                     const v1::GetGroupRequest* request,
                                     v1::GetGroupResponse* response) override;
  grpc::ServerUnaryReactor* AbortGroup(grpc::CallbackServerContext* context,
                                       const v1::AbortGroupRequest* request,
                                       v1::AbortGroupResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* Reconfigure(grpc::CallbackServerContext* context,
                                        const v1::ReconfigureRequest* request,
                                        v1::ReconfigureResponse* response) override;
  grpc::ServerUnaryReactor* PendingJoins(grpc::CallbackServerContext* context,
                                         const v1::PendingJoinsRequest* request,
                                         v1::PendingJoinsResponse* response) override;
  grpc::ServerUnaryReactor* Trace(grpc::CallbackServerContext* context,
                                  const v1::TraceRequest* request,
                                  v1::TraceResponse* response) override;

 private:
  Registry* registry_;
  const AccessPolicy* access_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_SERVICES_H_
