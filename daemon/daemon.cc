#include "daemon/daemon.h"

#include <grpcpp/grpcpp.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "backends/shm/segment.h"
#include "common/cpus.h"
#include "common/logging.h"
#include "common/mapping_guard.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/access/malformed_request.h"
#include "daemon/access/unix_listener.h"
#include "daemon/admin_service.h"
#include "daemon/etcd_job_store.h"
#include "daemon/gpu/gpu_runtime_loader.h"
#include "daemon/gpu/gpu_service.h"
#include "daemon/metrics/metrics_server.h"
#include "daemon/metrics/metrics_text.h"
#include "daemon/peer_trace.h"
#include "daemon/ready_file.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/services.h"
#include "daemon/socket_lock.h"
#include "daemon/store/local_store.h"
#include "daemon/store/store_service.h"
#include "daemon/systemd_notify.h"
#include "proto/groups.grpc.pb.h"

namespace muster {
namespace {

// Whether `host` names this machine (in this network namespace): a
// loopback address or one of its interfaces' addresses.
bool IsThisMachine(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) interfaces = nullptr;
  bool local = false;
  for (addrinfo* a = resolved; a != nullptr && !local; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      in_addr addr = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr;
      if ((ntohl(addr.s_addr) >> 24) == 127) local = true;
      for (ifaddrs* i = interfaces; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
        local = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == addr.s_addr;
      }
    } else if (a->ai_family == AF_INET6) {
      in6_addr addr = reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&addr)) local = true;
      for (ifaddrs* i = interfaces; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET6) continue;
        local = std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &addr,
                            sizeof(addr)) == 0;
      }
    }
  }
  if (interfaces != nullptr) ::freeifaddrs(interfaces);
  ::freeaddrinfo(resolved);
  return local;
}

// The registry reaches this daemon's own store in process (no TCP round
// trip, waits woken by the store), any other over TCP.
JobStoreAccess ReachJobStore(StoreServer* own, const std::string& master,
                             const std::string& token) {
  std::string host;
  int port = 0;
  if (own != nullptr && SplitHostPort(master, &host, &port).ok() && port == own->port() &&
      IsThisMachine(host)) {
    JobStoreAccess access;
    access.connect = [own]() -> absl::StatusOr<std::unique_ptr<Store>> {
      return std::unique_ptr<Store>(std::make_unique<LocalStore>(own));
    };
    access.watch = [own](std::vector<std::string> keys, std::function<void(absl::Status)> ready) {
      return LocalStore::Watch(own, std::move(keys), std::move(ready));
    };
    return access;
  }
  return TcpJobStore(master, token);
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// "host:port" with IPv6 literals bracketed.
std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

Daemon::Daemon(const DaemonOptions& options) : options_(options), start_time_(absl::Now()) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  if (options.grpc_port < 0 || options.grpc_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-port must be in [0, 65535], got ", options.grpc_port));
  }
  std::unique_ptr<Daemon> daemon(new Daemon(options));
  ASSIGN_OR_RETURN(daemon->socket_lock_, SocketLock::Acquire(options.socket_path));

  bool tls = !options.tls_cert_pem.empty() || !options.tls_key_pem.empty();
  if (tls && (options.tls_cert_pem.empty() || options.tls_key_pem.empty())) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  if (!options.tls_ca_pem.empty() && !tls) {
    return absl::InvalidArgumentError("--tls-ca needs --tls-cert and --tls-key");
  }
  if (tls && options.tls_ca_pem.empty() && options.access.token.empty()) {
    return absl::InvalidArgumentError(
        "TLS without --tls-ca or --token-file would let any TCP client in: give a CA for "
        "client certificates, a cluster token, or both");
  }
  AccessOptions access = options.access;
  access.tls_client_certificates = !options.tls_ca_pem.empty();
  daemon->access_ = std::make_unique<AccessPolicy>(access);
  UnixListenerOptions socket_options;
  socket_options.path = options.socket_path;
  socket_options.mode = options.socket_mode;
  socket_options.gid = options.socket_gid;
  ASSIGN_OR_RETURN(daemon->unix_listener_,
                   UnixListener::Bind(socket_options, daemon->access_.get()));

  if (options.store_enabled && options.store_backend == "etcd") {
    if (!options.store.state_dir.empty()) {
      return absl::InvalidArgumentError(
          "--state-dir does not apply to --store-backend etcd (etcd keeps the data durable)");
    }
    ASSIGN_OR_RETURN(daemon->etcd_store_, EtcdStore::Create(options.etcd));
    // Reaching etcd now only informs: calls fail UNAVAILABLE until it answers.
    daemon->etcd_store_->set_timeout(absl::Seconds(5));
    if (auto keys = daemon->etcd_store_->NumKeys(); !keys.ok()) {
      MLOG(WARNING) << "etcd not reachable yet: " << keys.status().message();
    }
    daemon->etcd_store_->set_timeout(kDefaultStoreTimeout);
    ASSIGN_OR_RETURN(daemon->etcd_liveness_,
                     EtcdLiveness::Start(options.etcd, options.etcd_lease_ttl));
    ASSIGN_OR_RETURN(daemon->etcd_status_, EtcdStore::Create(options.etcd));
    daemon->etcd_status_->set_timeout(absl::Seconds(2));
    StoreFrontendOptions frontend;
    frontend.listen_address = options.listen_address;
    frontend.port = options.store.port;
    frontend.limits = options.store.limits;
    frontend.max_connections = options.store.max_connections;
    frontend.token = options.store.token;
    frontend.allow_unauthenticated = options.store.allow_unauthenticated;
    frontend.max_unauthenticated_connections = options.store.max_unauthenticated_connections;
    frontend.auth_timeout = options.store.auth_timeout;
    ASSIGN_OR_RETURN(daemon->frontend_, StoreFrontend::Start(frontend, daemon->etcd_store_));
    daemon->store_service_ = std::make_unique<StoreService>(
        daemon->etcd_store_, options.store.limits, daemon->access_.get());
    MLOG(INFO) << "store serving on " << JoinHostPort(options.listen_address, daemon->store_port())
               << (frontend.token.empty() ? "" : " (token required)") << " (etcd at "
               << absl::StrJoin(options.etcd.endpoints, ",") << ", prefix " << options.etcd.prefix
               << ")";
  } else if (options.store_backend != "memory") {
    return absl::InvalidArgumentError(
        absl::StrCat("--store-backend must be memory or etcd, got '", options.store_backend, "'"));
  } else if (options.store_enabled) {
    StoreServerOptions store_options = options.store;
    store_options.listen_address = options.listen_address;
    ASSIGN_OR_RETURN(daemon->store_, StoreServer::Start(store_options));
    daemon->store_service_ = std::make_unique<StoreService>(
        daemon->store_.get(), store_options.limits, daemon->access_.get());
    MLOG(INFO) << "store serving on " << JoinHostPort(options.listen_address, daemon->store_port())
               << (store_options.token.empty() ? "" : " (token required)")
               << (store_options.state_dir.empty()
                       ? " (memory only)"
                       : absl::StrCat(" (durable in ", store_options.state_dir, ")"));
  }

  // The groups' users can resize their segments' files under musterd.
  if (!mapping_guard::Install()) {
    MLOG(WARNING) << "cannot install the SIGBUS handler: a user who truncates a group's "
                     "shared memory stops musterd";
  }
  if (int stale = GroupSegment::RemoveStale(); stale > 0) {
    MLOG(INFO) << "removed " << stale << " shared-memory segment(s) left by dead daemons";
  }
  RegistryOptions registry_options;
  registry_options.hostname = Hostname();
  registry_options.store_token = options.store.token;
  registry_options.shm_slot_bytes = options.shm_slot_bytes;
  registry_options.node_cpus = options.node_cpus;
  if (options.node_cpus != 0) {
    MLOG(INFO) << "ranks share " << options.node_cpus << " CPU(s) (--node-cpus)";
  } else {
    CpuLimit cpus = ReadCpuLimit();
    registry_options.fallback_cpus = cpus.usable;
    MLOG(INFO) << "musterd runs on " << cpus.describe
               << "; each group counts the CPUs of its ranks' affinity";
  }
  registry_options.trace_records = options.trace_records;
  registry_options.dump_dir = options.dump_dir;
  registry_options.dump_max_bytes = options.dump_max_bytes;
  if (registry_options.dump_dir.empty()) {
    size_t slash = options.socket_path.rfind('/');
    std::string socket_dir =
        slash == std::string::npos ? "." : options.socket_path.substr(0, slash);
    registry_options.dump_dir = absl::StrCat(
        options.store.state_dir.empty() ? socket_dir : options.store.state_dir, "/dumps");
  }
  if (registry_options.dump_dir == "none") registry_options.dump_dir.clear();
  registry_options.max_world_size = options.max_world_size;
  registry_options.max_group_size = options.max_group_size;
  registry_options.max_jobs = options.max_jobs;
  registry_options.job_grace = options.job_grace;
  StoreServer* own_store = daemon->store_.get();
  std::string store_token = options.store.token;
  if (daemon->etcd_store_ != nullptr) {
    // Every node's musterd serves the same etcd-backed store on the same
    // port: a job whose master names that port uses etcd directly.
    // Its ranks' alive/<r> keys are held by this musterd's etcd lease; other
    // nodes name it as "host" or "host/listen address".
    EtcdStoreOptions etcd = options.etcd;
    int port = daemon->store_port();
    std::shared_ptr<EtcdLiveness> liveness = daemon->etcd_liveness_;
    std::string node = Hostname();
    if (!options.listen_address.empty() && options.listen_address != "0.0.0.0" &&
        options.listen_address != "::") {
      node = absl::StrCat(node, "/", options.listen_address);
    }
    registry_options.job_store = [etcd, port, store_token, liveness,
                                  node](const std::string& master) {
      std::string host;
      int master_port = 0;
      if (SplitHostPort(master, &host, &master_port).ok() && master_port == port) {
        return EtcdJobStore(etcd, liveness, node);
      }
      return TcpJobStore(master, store_token);
    };
  } else {
    registry_options.job_store = [own_store, store_token](const std::string& master) {
      return ReachJobStore(own_store, master, store_token);
    };
  }
  // Trace(gather): another node's daemon, over its TCP gRPC server, with
  // this daemon's cluster credentials (the token, sent only once the peer
  // proved it knows it: daemon/peer_trace.h; with --tls-ca, TLS with this
  // daemon's certificate as the client's).
  {
    registry_options.peer_address_key = options.access.token;
    registry_options.peers_verified_by_tls = !options.tls_ca_pem.empty();
    PeerCredentials credentials{options.access.token, options.tls_ca_pem, options.tls_cert_pem,
                                options.tls_key_pem};
    registry_options.peer_trace = [credentials](
                                      const std::string& daemon, const std::string& address,
                                      const v1::TraceRequest& request, absl::Time deadline) {
      return TracePeer(credentials, daemon, address, request, deadline);
    };
  }
  const AccessPolicy* policy = daemon->access_.get();
  daemon->registry_ = std::make_unique<Registry>(registry_options);
  daemon->session_service_ = std::make_unique<SessionService>(daemon->registry_.get(), policy);
  daemon->groups_service_ = std::make_unique<GroupsService>(daemon->registry_.get(), policy);
  daemon->gpu_service_ = std::make_unique<GpuService>(
      daemon->registry_.get(), policy, options.store.token,
      options.gpu_runtime ? options.gpu_runtime() : LoadGpuRuntime(options.gpu_plugin));

  Daemon* self = daemon.get();
  daemon->admin_service_ =
      std::make_unique<AdminService>([self] { return self->Snapshot(); }, policy);

  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second daemon could share the port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Idle connections (any user can open thousands) are closed, not kept.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(options.grpc_idle_timeout),
                                         std::numeric_limits<int>::max())));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::string tcp_address = JoinHostPort(options.listen_address, options.grpc_port);
  bool serve_tcp = tls || !options.access.token.empty();
  if (serve_tcp) {
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
    if (tls) {
      grpc::SslServerCredentialsOptions ssl(
          access.tls_client_certificates
              ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
              : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
      ssl.pem_root_certs = options.tls_ca_pem;
      ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
      credentials = grpc::SslServerCredentials(ssl);
    }
    builder.AddListeningPort(tcp_address, credentials, &daemon->grpc_port_);
  } else {
    MLOG(WARNING) << "gRPC over TCP is off: no --token-file and no --tls-cert/--tls-key, so "
                     "only local users reach musterd (unix socket); peer daemons and remote "
                     "musterctl need credentials";
  }
  builder.RegisterService(daemon->admin_service_.get());
  if (daemon->store_service_ != nullptr) builder.RegisterService(daemon->store_service_.get());
  builder.RegisterService(daemon->session_service_.get());
  builder.RegisterService(daemon->groups_service_.get());
  builder.RegisterService(daemon->gpu_service_.get());
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr || (serve_tcp && daemon->grpc_port_ == 0)) {
    if (daemon->server_ != nullptr) daemon->server_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", tcp_address,
                     " (is the port in use, the address not local, or the TLS key or "
                     "certificate invalid?)"));
  }
  if (serve_tcp) {
    // Where peers' Trace(gather) finds this daemon: the listen address, or
    // the hostname when it is a wildcard.
    std::string host = options.listen_address;
    if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") host = Hostname();
    const std::string address = JoinHostPort(host, daemon->grpc_port_);
    daemon->registry_->SetControlAddress(address);
    daemon->admin_service_->SetIdentity(daemon->registry_->daemon_id(), address,
                                        options.access.token);
  }
  daemon->unix_listener_->Serve(daemon->server_.get());
  MLOG(INFO) << "musterd " << kVersion << " serving gRPC on unix:" << options.socket_path
             << " (mode " << absl::StrFormat("%04o", options.socket_mode) << ")"
             << (serve_tcp ? absl::StrCat(
                                 " and ", JoinHostPort(options.listen_address, daemon->grpc_port_),
                                 tls ? (access.tls_client_certificates ? " (mutual TLS" : " (TLS")
                                     : " (plain TCP",
                                 options.access.token.empty() ? ")" : ", token)")
                           : "");

  if (!options.metrics_listen.empty()) {
    std::string host;
    int port = 0;
    size_t colon = options.metrics_listen.rfind(':');
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(options.metrics_listen.substr(colon + 1), &port) || port < 0 ||
        port > 65535) {
      daemon->Shutdown();
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen='", options.metrics_listen,
                                                     "' is not ADDR:PORT (port 0: any free)"));
    }
    host = options.metrics_listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    Daemon* d = daemon.get();
    auto metrics = MetricsServer::Start(host, port, [d] { return d->RenderMetrics(); });
    if (!metrics.ok()) {
      daemon->Shutdown();
      return metrics.status();
    }
    daemon->metrics_server_ = std::move(*metrics);
    MLOG(INFO) << "serving Prometheus metrics on http://"
               << JoinHostPort(host, daemon->metrics_server_->port()) << "/metrics";
  }

  if (!options.ready_file.empty()) {
    ReadyInfo info;
    info.metrics_port = daemon->metrics_port();
    info.pid = ::getpid();
    info.grpc_port = daemon->grpc_port_;
    info.store_port = daemon->store_port();
    info.socket = options.socket_path;
    info.version = kVersion;
    absl::Status written = WriteReadyFile(options.ready_file, info);
    if (!written.ok()) {
      daemon->Shutdown();
      return written;
    }
  }
  absl::Status notified = NotifySystemd(absl::StrCat("READY=1\nMAINPID=", ::getpid()));
  if (!notified.ok()) MLOG(WARNING) << "systemd notification failed: " << notified.message();
  return daemon;
}

muster::v1::StatusResponse Daemon::Snapshot() const {
  muster::v1::StatusResponse s;
  s.set_version(kVersion);
  s.set_pid(::getpid());
  s.set_hostname(Hostname());
  s.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  s.set_socket_path(options_.socket_path);
  if (grpc_port_ != 0) s.set_grpc_address(JoinHostPort(options_.listen_address, grpc_port_));
  s.set_grpc_port(grpc_port_);
  if (store_ != nullptr) {
    StoreServer::Stats stats = store_->stats();
    s.set_store_address(JoinHostPort(options_.listen_address, store_->port()));
    s.set_store_port(store_->port());
    s.set_num_store_keys(stats.keys);
    s.set_num_store_connections(static_cast<int32_t>(stats.connections));
    s.set_store_log_error(stats.log_error);
    s.set_store_durable(!options_.store.state_dir.empty());
    s.set_store_memory_bytes(static_cast<int64_t>(stats.memory_bytes));
    s.set_store_refused_for_memory(static_cast<int64_t>(stats.refused_for_memory));
  }
  if (frontend_ != nullptr) {
    s.set_store_address(JoinHostPort(options_.listen_address, frontend_->port()));
    s.set_store_port(frontend_->port());
    s.set_num_store_connections(static_cast<int32_t>(frontend_->connections()));
    s.set_store_durable(true);  // etcd's durability
    if (auto keys = etcd_status_->NumKeys(); keys.ok()) {
      s.set_num_store_keys(*keys);
    } else {
      s.set_store_log_error(std::string(keys.status().message()));
    }
  }
  if (registry_ != nullptr) {
    Registry::Counts counts = registry_->counts();
    s.set_num_sessions(counts.sessions);
    s.set_num_jobs(counts.jobs);
    s.set_num_groups(counts.groups);
  }
  return s;
}

int Daemon::metrics_port() const {
  return metrics_server_ != nullptr ? metrics_server_->port() : 0;
}

namespace {

// A group's backend config as a label: muster's own configs as they are
// (few), anything naming a third party's backend as "third_party" (a user
// chooses those names: they must not make label values unbounded).
std::string BackendLabel(const std::string& config) {
  for (absl::string_view part : absl::StrSplit(config, ',')) {
    absl::string_view name = part.substr(part.find(':') + 1);
    if (name != "gloo" && name != "shm" && name != "nccl") return "third_party";
  }
  return config;
}

}  // namespace

std::string Daemon::RenderMetrics() const {
  MetricsText m;
  m.Family("muster_build_info", "gauge", "musterd's version (the value is 1).");
  m.Sample("muster_build_info", {{"version", kVersion}}, 1);
  m.Family("muster_uptime_seconds", "gauge", "Seconds since musterd started.");
  m.Sample("muster_uptime_seconds", absl::ToDoubleSeconds(absl::Now() - start_time_));
  if (metrics_server_ != nullptr) {
    m.Family("muster_metrics_scrapes_total", "counter", "Scrapes of /metrics served.");
    m.Sample("muster_metrics_scrapes_total", static_cast<double>(metrics_server_->scrapes()));
  }
  if (store_ != nullptr) {
    StoreServer::Stats stats = store_->stats();
    m.Family("muster_store_keys", "gauge", "Keys in musterd's store.");
    m.Sample("muster_store_keys", static_cast<double>(stats.keys));
    m.Family("muster_store_value_bytes", "gauge", "Bytes of keys and values in the store.");
    m.Sample("muster_store_value_bytes", static_cast<double>(stats.bytes));
    m.Family("muster_store_connections", "gauge", "Open store connections.");
    m.Sample("muster_store_connections", {{"auth", "any"}}, static_cast<double>(stats.connections));
    m.Sample("muster_store_connections", {{"auth", "pending"}},
             static_cast<double>(stats.unauthenticated_connections));
    m.Family("muster_store_memory_bytes", "gauge",
             "Bytes charged to the store's memory budget (buffers, waits, replies).");
    m.Sample("muster_store_memory_bytes", static_cast<double>(stats.memory_bytes));
    m.Family("muster_store_refused_total", "counter", "Store connections or requests refused.");
    m.Sample("muster_store_refused_total", {{"reason", "max_connections"}},
             static_cast<double>(stats.refused_connections));
    m.Sample("muster_store_refused_total", {{"reason", "max_unauthenticated"}},
             static_cast<double>(stats.refused_unauthenticated));
    m.Sample("muster_store_refused_total", {{"reason", "auth_timeout"}},
             static_cast<double>(stats.auth_timeouts));
    m.Sample("muster_store_refused_total", {{"reason", "memory"}},
             static_cast<double>(stats.refused_for_memory));
    const StoreMetrics& ops = store_->metrics();
    m.Family("muster_store_operations_total", "counter",
             "Requests from store clients (torch's and muster's protocol), by operation.");
    for (int i = 0; i < StoreMetrics::kOps; ++i) {
      m.Sample("muster_store_operations_total", {{"op", StoreMetrics::OpLabel(i)}},
               static_cast<double>(ops.requests[i].value()));
    }
    m.Family("muster_store_operation_duration_seconds", "histogram",
             "Time a store request took on the store's loop, parsed to reply queued (not a "
             "wait's waiting).");
    m.HistogramSamples("muster_store_operation_duration_seconds", {},
                       ops.request_seconds.snapshot());
    m.Family("muster_store_log_writable", "gauge",
             "1 while the store's durability log can be written (or there is none), else 0.");
    m.Sample("muster_store_log_writable", stats.log_error.empty() ? 1 : 0);
  }
  if (registry_ != nullptr) {
    Registry::Counts counts = registry_->counts();
    Registry::Metrics r = registry_->metrics();
    m.Family("muster_sessions", "gauge", "Rank sessions attached to this musterd.");
    m.Sample("muster_sessions", counts.sessions);
    m.Family("muster_jobs", "gauge", "Jobs this musterd holds, by state.");
    for (const auto& [state, n] : r.jobs_by_state) m.Sample("muster_jobs", {{"state", state}}, n);
    m.Family("muster_ranks", "gauge", "This musterd's ranks, by state.");
    for (const auto& [state, n] : r.ranks_by_state) m.Sample("muster_ranks", {{"state", state}}, n);
    m.Family("muster_groups", "gauge", "Process groups this musterd holds, by state.");
    for (const auto& [state, n] : r.groups_by_state) {
      m.Sample("muster_groups", {{"state", state}}, n);
    }
    std::map<std::string, int64_t> by_backend;
    for (const auto& [config, n] : r.collectives_by_backend) by_backend[BackendLabel(config)] += n;
    m.Family("muster_segment_collectives", "gauge",
             "Collectives this musterd's ranks completed in the shared memory of the groups that "
             "exist now, by the group's backend config.");
    for (const auto& [backend, n] : by_backend) {
      m.Sample("muster_segment_collectives", {{"backend", backend}}, static_cast<double>(n));
    }
    m.Family("muster_rank_failures_total", "counter",
             "Ranks of this musterd's jobs that failed (reported by any daemon).");
    m.Sample("muster_rank_failures_total", static_cast<double>(r.rank_failures));
    m.Family("muster_group_breaks_total", "counter", "Groups broken, by cause.");
    for (const auto& [cause, n] : r.group_breaks) {
      m.Sample("muster_group_breaks_total", {{"cause", cause}}, static_cast<double>(n));
    }
    m.Family("muster_reconfigurations_total", "counter",
             "Epochs formed by elastic jobs after a rank was replaced.");
    m.Sample("muster_reconfigurations_total", static_cast<double>(r.reconfigurations));
    // Per-op collectives, from the flight recorders (one per rank and call;
    // see daemon/registry/collective_metrics.h).
    CollectiveMetrics::Snapshot c = registry_->collective_metrics();
    m.Family("muster_collectives_total", "counter",
             "Collectives (and point-to-point calls) this musterd's ranks finished, completed or "
             "failed, one per rank and call, by op and backend (from the flight recorder).");
    for (const auto& [key, n] : c.calls) {
      m.Sample("muster_collectives_total", {{"op", key.first}, {"backend", key.second}},
               static_cast<double>(n));
    }
    m.Family("muster_collective_bytes_total", "counter",
             "Input bytes (count x dtype size, per rank) of the completed collectives, by op and "
             "backend.");
    for (const auto& [key, n] : c.bytes) {
      m.Sample("muster_collective_bytes_total", {{"op", key.first}, {"backend", key.second}},
               static_cast<double>(n));
    }
    m.Family("muster_collective_duration_seconds", "histogram",
             "Time from start (entering the communicator) to completion of the completed "
             "collectives, by op and backend.");
    for (const auto& [key, h] : c.seconds) {
      m.HistogramSamples("muster_collective_duration_seconds",
                         {{"op", key.first}, {"backend", key.second}}, h);
    }
    m.Family("muster_collective_failures_total", "counter",
             "Collectives that failed, by op, backend and cause (timeout, aborted, mismatch, "
             "peer_gone, invalid_argument, other).");
    for (const auto& [key, n] : c.failures) {
      m.Sample(
          "muster_collective_failures_total",
          {{"op", std::get<0>(key)}, {"backend", std::get<1>(key)}, {"cause", std::get<2>(key)}},
          static_cast<double>(n));
    }
    m.Family("muster_collective_records_missed_total", "counter",
             "Flight-recorder records overwritten before musterd counted them (a rank issued more "
             "than --trace-records calls on a group between two sweeps, 100 ms apart): the "
             "per-op counters miss these.");
    for (const char* backend : {"gloo", "nccl", "shm", "third_party"}) c.missed.emplace(backend, 0);
    for (const auto& [backend, n] : c.missed) {
      m.Sample("muster_collective_records_missed_total", {{"backend", backend}},
               static_cast<double>(n));
    }
  }
  if (gpu_service_ != nullptr) {
    v1::ListCommunicatorsResponse gpu = gpu_service_->AllCommunicators();
    std::map<std::string, int> by_state = {
        {"initializing", 0}, {"ready", 0}, {"aborted", 0}, {"failed", 0}};
    uint64_t launched = 0, completed = 0;
    for (const auto& c : gpu.communicators()) {
      if (by_state.count(c.state())) ++by_state[c.state()];
      launched += c.launched();
      completed += c.completed();
    }
    m.Family("muster_gpu_communicators", "gauge", "musterd's NCCL communicators, by state.");
    for (const auto& [state, n] : by_state) {
      m.Sample("muster_gpu_communicators", {{"state", state}}, n);
    }
    m.Family("muster_gpu_collectives", "gauge",
             "GPU collectives of the communicators that exist now, launched and completed.");
    m.Sample("muster_gpu_collectives", {{"stage", "launched"}}, static_cast<double>(launched));
    m.Sample("muster_gpu_collectives", {{"stage", "completed"}}, static_cast<double>(completed));
    m.Family("muster_gpu_available", "gauge", "1 if GPU collectives can run here, else 0.");
    m.Sample("muster_gpu_available", gpu.unavailable().empty() ? 1 : 0);
  }
  return m.text();
}

void Daemon::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (socket_lock_ == nullptr) return;  // never started: nothing to undo
  absl::Status notified = NotifySystemd("STOPPING=1");
  if (!notified.ok()) MLOG(WARNING) << "systemd notification failed: " << notified.message();
  if (admin_service_ != nullptr) admin_service_->SetDraining();
  // The ranks first: their session streams end now (not after the grace
  // period), so every rank's calls fail UNAVAILABLE at once, and nothing
  // below is mistaken for a rank failure.
  if (registry_ != nullptr) {
    registry_->EndSessions(absl::StrCat("musterd (pid ", ::getpid(), ") is shutting down"));
  }
  // Pending group operations fail (UNAVAILABLE: shutting down) and the registry
  // stops talking to job stores before those (maybe this one) go away.
  // GPU communicators are aborted first: queued GPU requests are answered.
  if (gpu_service_ != nullptr) gpu_service_->Shutdown();
  if (registry_ != nullptr) registry_->Shutdown();
  // The store next: its stop finishes parked gRPC store waits (UNAVAILABLE)
  // so the gRPC server has nothing left that could outlive the grace period.
  if (store_ != nullptr) store_->Stop();
  if (etcd_store_ != nullptr) etcd_store_->Shutdown();
  // Not revoked: keys still held (ranks that never left) vanish after the
  // TTL, and other nodes report those ranks lost.
  if (etcd_liveness_ != nullptr) etcd_liveness_->Stop();
  if (frontend_ != nullptr) frontend_->Stop();
  if (unix_listener_ != nullptr) unix_listener_->Stop();
  metrics_server_.reset();
  if (server_ != nullptr) {
    MLOG(INFO) << "shutting down: waiting up to " << absl::FormatDuration(options_.shutdown_grace)
               << " for in-flight RPCs";
    server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.shutdown_grace));
    server_->Wait();
  }
  if (!options_.ready_file.empty()) ::unlink(options_.ready_file.c_str());
  if (socket_lock_ != nullptr) socket_lock_->RemoveFiles();
  MLOG(INFO) << "shut down";
}

Daemon::~Daemon() { Shutdown(); }

}  // namespace muster
