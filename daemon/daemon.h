// Daemon: one running musterd — its gRPC server (unix socket for local ranks
// and the CLI, each connection identified by the kernel; TCP for peer
// daemons and remote musterctl, only with a cluster token or mutual TLS),
// the TCP key-value store, the services behind them, and the files it owns
// (socket, lock, ready file).
//
// Lifecycle: Start() returns a serving daemon; Shutdown() (idempotent, any
// thread) drains it: Health turns DRAINING, in-flight RPCs get up to
// `shutdown_grace` to finish and are then cancelled, files are removed.
// Thread-safe.
#ifndef MUSTER_DAEMON_DAEMON_H_
#define MUSTER_DAEMON_DAEMON_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/access/access_policy.h"
#include "daemon/store/etcd/etcd_liveness.h"
#include "daemon/store/etcd/etcd_store.h"
#include "daemon/store/store_frontend.h"
#include "daemon/store/store_server.h"
#include "proto/admin.pb.h"

namespace grpc {
class Server;
}

namespace muster {

class AccessPolicy;
class AdminService;
class UnixListener;
class GroupsService;
class Registry;
class GpuService;
class MetricsServer;
class GpuRuntime;
class SessionService;
class SocketLock;
class StoreService;

struct DaemonOptions {
  // Unix socket for local ranks and musterctl (required, absolute), its
  // permission bits and group (-1: musterd's).
  std::string socket_path;
  uint32_t socket_mode = 0660;
  int64_t socket_gid = -1;
  // TCP address and port of the gRPC server; port 0 picks a free one. The
  // TCP listener only runs with a cluster token (access.token) or mutual
  // TLS (tls_*): without credentials it is off.
  std::string listen_address = "0.0.0.0";
  int grpc_port = 29510;
  // A gRPC connection (TCP or the unix socket) with no call in progress for
  // this long is closed; clients reconnect on their next call. A TCP
  // connection gets 10 s for its handshake.
  absl::Duration grpc_idle_timeout = absl::Minutes(5);
  // Cluster token, operator group, request field limits.
  AccessOptions access;
  // TLS of the TCP listener (PEM text): certificate and key of this daemon;
  // with a CA, clients must present a certificate it signed (mutual TLS).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_ca_pem;
  // Jobs and groups (see RegistryOptions).
  int max_world_size = 1 << 20;
  int max_group_size = 1 << 20;
  int max_jobs = 1024;
  absl::Duration job_grace = absl::Seconds(60);
  // If set, where to write the ready JSON once serving.
  std::string ready_file;
  // How long in-flight RPCs may run after shutdown begins.
  absl::Duration shutdown_grace = absl::Seconds(2);
  // The TCP key-value store (its listen address is `listen_address`).
  bool store_enabled = true;
  StoreServerOptions store;
  // Where the store keeps its data: "memory" (this musterd's StoreServer,
  // optionally durable with store.state_dir) or "etcd" (every node's musterd
  // serves the same protocols from an etcd cluster: StoreFrontend over
  // EtcdStore; `store` gives the listener, limits and token).
  std::string store_backend = "memory";
  EtcdStoreOptions etcd;
  // With the etcd backend: the TTL of this musterd's etcd lease, which holds
  // its ranks' liveness keys (other nodes report them lost when it expires).
  absl::Duration etcd_lease_ttl = absl::Seconds(5);
  // Per-rank bytes of each node-local group's shared-memory segment.
  uint64_t shm_slot_bytes = 4 << 20;
  // CPUs this node's ranks share, written into every group's segment (it
  // picks how ranks wait: ShmCommunicator's WaitPolicy); 0: count, per
  // group, the CPUs in its local ranks' affinity masks (which a cpuset
  // narrows), musterd's own if none can be read.
  unsigned node_cpus = 0;
  // Flight recorder: records per rank in each group's segment (0: none),
  // and where broken groups' recorders are written ("": set by Start from
  // the state directory or the socket's; "none": not written).
  uint64_t trace_records = 2048;
  std::string dump_dir;
  // The dumps kept at most (bytes, all jobs): the oldest go first.
  uint64_t dump_max_bytes = uint64_t{1} << 30;
  // Test builds: the GPU runtime musterd's NCCL engine uses (default: the
  // real CUDA/NCCL one).
  // The CUDA/NCCL runtime plugin (libmuster_cuda.so); "" = look in the
  // default places (see daemon/gpu/gpu_runtime_loader.h).
  std::string gpu_plugin;
  std::function<std::unique_ptr<GpuRuntime>()> gpu_runtime;
  // "ADDR:PORT" to serve Prometheus metrics on (GET /metrics; port 0: a
  // free one, see metrics_port()); "" = off.
  std::string metrics_listen;
};

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Stops serving and removes the daemon's files. Idempotent.
  void Shutdown();

  // 0 when the TCP listener is off.
  int grpc_port() const { return grpc_port_; }
  int store_port() const {
    return store_ != nullptr ? store_->port() : frontend_ != nullptr ? frontend_->port() : 0;
  }
  const std::string& socket_path() const { return options_.socket_path; }
  // 0 when /metrics is off.
  int metrics_port() const;
  // The /metrics text (Prometheus text format 0.0.4).
  std::string RenderMetrics() const;
  // What the Status RPC returns.
  muster::v1::StatusResponse Snapshot() const;

 private:
  explicit Daemon(const DaemonOptions& options);

  const DaemonOptions options_;
  const absl::Time start_time_;
  int grpc_port_ = 0;
  std::unique_ptr<SocketLock> socket_lock_;
  std::unique_ptr<AccessPolicy> access_;
  std::unique_ptr<UnixListener> unix_listener_;
  std::unique_ptr<StoreServer> store_;
  // --store-backend etcd: the etcd-backed store and its wire front-end.
  std::shared_ptr<EtcdStore> etcd_store_;
  std::unique_ptr<EtcdStore> etcd_status_;       // short timeout, for Status
  std::shared_ptr<EtcdLiveness> etcd_liveness_;  // this node's etcd lease
  std::unique_ptr<StoreFrontend> frontend_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<StoreService> store_service_;
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<GpuService> gpu_service_;  // destroyed before the registry
  std::unique_ptr<SessionService> session_service_;
  std::unique_ptr<GroupsService> groups_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_server_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_DAEMON_H_
