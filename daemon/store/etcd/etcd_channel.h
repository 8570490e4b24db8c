// What the etcd store and the liveness watcher share to reach etcd: a gRPC
// channel and the service stubs of each endpoint, and etcd's range end for a
// key prefix. Stateless functions; an EtcdEndpoint's stubs are thread-safe
// (gRPC's).
#ifndef MUSTER_DAEMON_STORE_ETCD_ETCD_CHANNEL_H_
#define MUSTER_DAEMON_STORE_ETCD_ETCD_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/store/etcd/etcd_store.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace muster {

// A channel to `endpoint` ("host:port", "http://host:port" or
// "https://host:port"; https uses the options' CA and client certificate),
// reconnecting at most every second so that a dead member is retried soon.
// INVALID_ARGUMENT naming the endpoint when it names no host, or is plain
// http while TLS files were given.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenEtcdChannel(const std::string& endpoint,
                                                               const EtcdStoreOptions& options);

// One configured endpoint: its channel and the stubs of the services muster
// calls on it.
struct EtcdEndpoint {
  std::string name;  // as configured
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
};

// Every endpoint of `options`, opened with OpenEtcdChannel; INVALID_ARGUMENT
// when there is none or one is malformed.
absl::StatusOr<std::vector<std::unique_ptr<EtcdEndpoint>>> OpenEtcdEndpoints(
    const EtcdStoreOptions& options);

// The auth token of one etcd user (EtcdStoreOptions::user), fetched on first
// use and again after Drop (an expired token). Thread-safe.
class EtcdToken {
 public:
  // Adds the token to `ctx`, authenticating on `ep` first when there is
  // none; nothing without a user. UNAUTHENTICATED for a wrong user or
  // password, UNAVAILABLE when etcd did not answer; both name the endpoint.
  absl::Status AddTo(EtcdEndpoint& ep, grpc::ClientContext& ctx, absl::Time deadline,
                     const EtcdStoreOptions& options);
  void Drop();

 private:
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// Etcd's range end for "every key starting with prefix".
std::string EtcdPrefixEnd(const std::string& prefix);

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_ETCD_ETCD_CHANNEL_H_
