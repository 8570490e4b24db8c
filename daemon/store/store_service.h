// StoreService: the muster.v1.Store gRPC service (musterctl store …, peer
// daemons). Every call is posted to the StoreServer's loop thread, so gRPC
// and TCP clients see one consistent store; blocking calls (Get, Wait,
// MultiGet) park on the loop and finish when the keys exist, at their
// timeout (DEADLINE_EXCEEDED naming the missing keys) or at shutdown
// (UNAVAILABLE). Replies are sent after the durability log is flushed; when
// that flush fails, only calls whose result depended on it fail (UNAVAILABLE:
// writes, and reads of a key the failed batch touched, or of every key), as
// for the TCP clients; reads of durable keys keep their answer.
//
// Over a BlockingStore instead (the etcd backend), each call runs on its own
// thread against that store.
//
// Thread-safe; handlers never block a gRPC thread.
#ifndef MUSTER_DAEMON_STORE_STORE_SERVICE_H_
#define MUSTER_DAEMON_STORE_STORE_SERVICE_H_

#include <memory>

#include "common/store_wire.h"
#include "daemon/access/access_policy.h"
#include "daemon/store/blocking_store.h"
#include "daemon/store/store_server.h"
#include "proto/store.grpc.pb.h"

namespace muster {

class StoreService final : public muster::v1::Store::CallbackService {
 public:
  // `server` must outlive the service's last call.
  // `access` (outlives the service) decides who may call; nullptr: anyone.
  StoreService(StoreServer* server, const wire::StoreLimits& limits, const AccessPolicy* access)
      : server_(server), limits_(limits), access_(access) {}
  // The same service over a store kept elsewhere (musterd --store-backend
  // etcd): each call runs on its own thread, blocking in `store`.
  StoreService(std::shared_ptr<BlockingStore> store, const wire::StoreLimits& limits,
               const AccessPolicy* access)
      : server_(nullptr), remote_(std::move(store)), limits_(limits), access_(access) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext*, const v1::SetRequest*,
                                v1::SetResponse*) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext*, const v1::GetRequest*,
                                v1::GetResponse*) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext*, const v1::AddRequest*,
                                v1::AddResponse*) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext*, const v1::CompareSetRequest*,
                                       v1::CompareSetResponse*) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext*, const v1::WaitRequest*,
                                 v1::WaitResponse*) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext*, const v1::CheckRequest*,
                                  v1::CheckResponse*) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext*, const v1::DeleteKeyRequest*,
                                      v1::DeleteKeyResponse*) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext*, const v1::NumKeysRequest*,
                                    v1::NumKeysResponse*) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext*, const v1::AppendRequest*,
                                   v1::AppendResponse*) override;
  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext*, const v1::MultiGetRequest*,
                                     v1::MultiGetResponse*) override;
  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext*, const v1::MultiSetRequest*,
                                     v1::MultiSetResponse*) override;
  grpc::ServerUnaryReactor* ListKeys(grpc::CallbackServerContext*, const v1::ListKeysRequest*,
                                     v1::ListKeysResponse*) override;

 private:
  using Task = std::function<grpc::Status(StoreServer::Loop&)>;
  // Asked on the loop right after a task ran: whether its result rests on
  // a write not logged yet (see StoreServer::Loop::ReadsUnlogged), so a
  // failed flush of that iteration must fail the call.
  using Depends = std::function<bool(StoreServer::Loop&)>;
  static Depends Wrote();
  static Depends ReadKeys(std::vector<std::string> keys);
  static Depends ReadAll();
  // Runs `task` on the loop and finishes with its status after the flush
  // (with the flush's error instead if that failed and `depends` says so).
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* context, Depends depends, Task task);
  // Parks until `keys` exist, then runs `on_ready` (which reads only `keys`)
  // and finishes.
  grpc::ServerUnaryReactor* RunWhenPresent(grpc::CallbackServerContext* context,
                                           std::vector<std::string> keys,
                                           const v1::Timeout& timeout, Task on_ready);
  // The store holds every job's keys: over gRPC only privileged callers
  // (root, musterd's user, the operator group, authenticated TCP peers).
  grpc::Status Gate(grpc::CallbackServerContext* context) const;
  grpc::Status CheckSizes(grpc::CallbackServerContext* context,
                          const std::vector<const std::string*>& keys,
                          const std::vector<const std::string*>& values) const;

  grpc::ServerUnaryReactor* Remote(grpc::CallbackServerContext* context,
                                   std::function<grpc::Status(BlockingStore&)> fn);

  StoreServer* server_;
  std::shared_ptr<BlockingStore> remote_;
  wire::StoreLimits limits_;
  const AccessPolicy* access_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_SERVICE_H_
