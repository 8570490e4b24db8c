// EtcdJobStore: how a JobCoordinator reaches a job's store kept in etcd
// (musterd --store-backend etcd): a store per connection, waits as
// cancellable watches on their own threads, and (given an EtcdLiveness) the
// node's lease for its ranks' alive/<r> keys and the watch of other nodes'.
//
// Thread-safe: the returned functions may be called from any thread.
#ifndef MUSTER_DAEMON_ETCD_JOB_STORE_H_
#define MUSTER_DAEMON_ETCD_JOB_STORE_H_

#include <memory>
#include <string>

#include "daemon/registry/job_coordinator.h"
#include "daemon/store/etcd/etcd_liveness.h"
#include "daemon/store/etcd/etcd_store.h"

namespace muster {

// `liveness` may be null (no lease: other nodes never see this one vanish);
// `node` describes this node in other nodes' failure reasons.
JobStoreAccess EtcdJobStore(const EtcdStoreOptions& options,
                            std::shared_ptr<EtcdLiveness> liveness = nullptr,
                            const std::string& node = "");

}  // namespace muster

#endif  // MUSTER_DAEMON_ETCD_JOB_STORE_H_
