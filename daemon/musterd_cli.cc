#include "daemon/musterd_cli.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/paths.h"
#include "common/version.h"
#include "daemon/access/unix_listener.h"
#include "daemon/daemon.h"

namespace {

bool SetLogLevel(const std::string& name) {
  if (name == "debug") {
    muster::SetMinLogLevel(muster::LogLevel::kDebug);
  } else if (name == "info") {
    muster::SetMinLogLevel(muster::LogLevel::kInfo);
  } else if (name == "warning") {
    muster::SetMinLogLevel(muster::LogLevel::kWarning);
  } else if (name == "error") {
    muster::SetMinLogLevel(muster::LogLevel::kError);
  } else {
    return false;
  }
  return true;
}

// Reads a whole file. A secret (a token, a TLS key) that group or others can
// read gets a warning.
absl::StatusOr<std::string> ReadWholeFile(const std::string& flag, const std::string& path,
                                          bool secret) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --", flag, " ", path, ": ", std::strerror(errno)));
  }
  std::string data;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  struct stat st;
  bool loose = ::fstat(fileno(f), &st) == 0 && (st.st_mode & 077) != 0;
  std::fclose(f);
  if (data.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, " is empty"));
  }
  if (secret && loose) {
    MLOG(WARNING) << "--" << flag << " " << path << " is readable by group or others; chmod 600 it";
  }
  return data;
}

// Reads a token: the file's content without surrounding whitespace.
absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> data = ReadWholeFile(flag, path, /*secret=*/true);
  if (!data.ok()) return data.status();
  std::string token(absl::StripAsciiWhitespace(*data));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no token"));
  if (token.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": token longer than 4096 bytes"));
  }
  return token;
}

// Thousands of store connections need more than the usual 1024 fds.
void RaiseFileLimit() {
  rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

namespace muster {

int RunMusterd(int argc, char** argv, const std::function<void(DaemonOptions&)>& customize) {
  muster::SetLogProgramName("musterd");
  // Debian's Abseil is built with Mutex deadlock detection on: a lock-order
  // graph updated on every lock and every Mutex destroyed. Diagnostics for
  // debug builds; off in musterd (TSan checks lock order in our tests).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  muster::DaemonOptions options;
  int64_t grpc_port = options.grpc_port;
  double grace_seconds = absl::ToDoubleSeconds(options.shutdown_grace);
  std::string log_level = "info";
  int64_t store_port = options.store.port;
  std::string token_file;
  std::string allow_unauthenticated;
  int64_t max_key_bytes = options.store.limits.max_key_bytes;
  int64_t max_value_bytes = options.store.limits.max_value_bytes;
  int64_t max_keys_per_request = options.store.limits.max_keys_per_request;
  int64_t max_request_bytes = options.store.limits.max_request_bytes;
  int64_t max_connections = options.store.max_connections;
  int64_t max_unauthenticated = options.store.max_unauthenticated_connections;
  double auth_timeout_seconds = absl::ToDoubleSeconds(options.store.auth_timeout);
  int64_t max_total_bytes = options.store.max_total_bytes;
  int64_t max_reply_bytes = options.store.max_reply_bytes;
  int64_t memory_budget_bytes = options.store.memory_budget_bytes;
  int64_t max_connection_bytes = options.store.max_connection_bytes;
  int64_t shm_slot_bytes = options.shm_slot_bytes;
  int64_t node_cpus = 0;
  int64_t trace_records = static_cast<int64_t>(options.trace_records);
  std::string cluster_token_file;
  std::string tls_cert, tls_key, tls_ca;
  std::string socket_mode = "0660";
  std::string socket_group;
  std::string operator_group;
  int64_t max_world_size = options.max_world_size;
  int64_t max_group_size = options.max_group_size;
  int64_t max_jobs = options.max_jobs;
  double job_grace_seconds = absl::ToDoubleSeconds(options.job_grace);
  double grpc_idle_seconds = absl::ToDoubleSeconds(options.grpc_idle_timeout);
  int64_t dump_max_bytes = static_cast<int64_t>(options.dump_max_bytes);

  muster::FlagSet flags(
      "musterd",
      "musterd: the per-node muster daemon (rendezvous store, process groups, collectives).\n"
      "Usage: musterd [flags]\n"
      "Serves gRPC on a unix socket (local ranks, musterctl) and on TCP (peer daemons).\n"
      "Stops gracefully on SIGTERM or SIGINT (exit 0).");
  flags.AddString("socket", &options.socket_path,
                  "Unix socket for local ranks and musterctl. Empty means the default:\n"
                  "/run/muster/musterd.sock as root, else $XDG_RUNTIME_DIR/muster/musterd.sock,\n"
                  "else /tmp/muster-<uid>/musterd.sock.");
  flags.AddString("socket-mode", &socket_mode,
                  "Permission bits of the socket (octal): who may connect at all. Every caller\n"
                  "is identified by the kernel (SO_PEERCRED) and sees and aborts only the jobs\n"
                  "of its own user; 0666 lets every local user run jobs.");
  flags.AddString("socket-group", &socket_group,
                  "Group (name or gid) owning the socket, e.g. the group of users who run jobs\n"
                  "(with --socket-mode 0660). Empty: musterd's group.");
  flags.AddString("operator-group", &operator_group,
                  "Members of this group (name or gid) see and may abort every job, like root\n"
                  "and musterd's own user. Empty: none.");
  flags.AddString("listen", &options.listen_address,
                  "Address the TCP gRPC server and the store bind to (0.0.0.0, 127.0.0.1, ::).");
  flags.AddInt("grpc-port", &grpc_port,
               "TCP port of the gRPC server; 0 picks a free port. The TCP server runs only\n"
               "with --token-file and/or --tls-cert/--tls-key (otherwise it is off).");
  flags.AddDouble("grpc-idle-seconds", &grpc_idle_seconds,
                  "A gRPC connection (TCP or the unix socket) with no call in progress for this\n"
                  "long is closed (clients reconnect on their next call), so idle connections\n"
                  "hold no memory for long; a TCP connection gets 10 s for its handshake.");
  flags.AddString("token-file", &cluster_token_file,
                  "File holding the cluster token: every gRPC call over TCP (peer daemons,\n"
                  "musterctl --addr) must carry it. Compared in constant time, never logged.\n"
                  "Keep it from job users (it grants every job); --store-token-file may name\n"
                  "the same file if one secret should serve both.");
  flags.AddString("tls-cert", &tls_cert, "PEM certificate of this daemon's TCP gRPC server.");
  flags.AddString("tls-key", &tls_key, "PEM private key for --tls-cert.");
  flags.AddString("tls-ca", &tls_ca,
                  "PEM CA bundle: TCP clients must present a certificate it signed (mutual\n"
                  "TLS between daemons, and for musterctl --addr).");
  flags.AddInt("max-world-size", &max_world_size,
               "Largest world size a job may register (checked before any allocation).");
  flags.AddInt("max-group-size", &max_group_size, "Most ranks in one process group.");
  flags.AddInt("max-jobs", &max_jobs,
               "Most jobs held at once; finished jobs count until they are removed.");
  flags.AddDouble("job-grace-seconds", &job_grace_seconds,
                  "How long a job stays listed after its last rank on this node left or\n"
                  "failed; then it is removed with its threads and store connections.");
  flags.AddString(
      "ready-file", &options.ready_file,
      "Once serving, write {\"pid\",\"grpc_port\",\"store_port\",\"socket\",\"version\"}\n"
      "as one JSON object to this path (atomically); removed on shutdown.");
  flags.AddDouble("shutdown-grace-seconds", &grace_seconds,
                  "On SIGTERM/SIGINT, how long in-flight RPCs may finish before they are\n"
                  "cancelled (0 to 60).");
  flags.AddString("log-level", &log_level, "Least severe log level: debug, info, warning, error.");
  flags.AddBool("store", &options.store_enabled,
                "Run the TCP key-value store (PyTorch TCPStore compatible); --store=false\n"
                "for a daemon that only serves its local ranks.");
  flags.AddInt("store-port", &store_port,
               "TCP port of the key-value store (PyTorch's MASTER_PORT); 0 picks a free port.\n"
               "It listens on --listen (0.0.0.0 or :: mean every IPv4 and IPv6 address).");
  std::string etcd_endpoints, etcd_password_file, etcd_ca, etcd_cert, etcd_key;
  flags.AddString("store-backend", &options.store_backend,
                  "Where the store keeps its data: memory (this musterd; durable with\n"
                  "--state-dir) or etcd (an etcd v3 cluster, --etcd-endpoints: every node's\n"
                  "musterd serves the same store, which survives losing any node).");
  flags.AddString("etcd-endpoints", &etcd_endpoints,
                  "With --store-backend etcd: comma-separated etcd client URLs\n"
                  "(http://host:2379 or https://host:2379); calls fail over between them.");
  flags.AddString("etcd-prefix", &options.etcd.prefix,
                  "With --store-backend etcd: the etcd key prefix of every store key (give each\n"
                  "cluster of musterds sharing one etcd its own).");
  flags.AddString("etcd-user", &options.etcd.user,
                  "With --store-backend etcd: authenticate to etcd as this user (etcd auth).");
  flags.AddString("etcd-password-file", &etcd_password_file,
                  "File holding --etcd-user's password (chmod 600).");
  flags.AddString("etcd-ca", &etcd_ca,
                  "CA bundle (PEM) that signed the etcd servers' certificates "
                  "(https:// endpoints).");
  flags.AddString("etcd-cert", &etcd_cert,
                  "Client certificate (PEM) for etcd's --client-cert-auth (with --etcd-key).");
  flags.AddString("etcd-key", &etcd_key, "Private key (PEM) of --etcd-cert.");
  int64_t etcd_lease_ttl_seconds = 5;
  flags.AddInt("etcd-lease-ttl-seconds", &etcd_lease_ttl_seconds,
               "With --store-backend etcd: TTL of this musterd's etcd lease (1 to 3600), which\n"
               "holds its ranks' liveness keys: if this node vanishes, the other nodes report\n"
               "its ranks failed about this long after its last renewal.");
  flags.AddString("store-token-file", &token_file,
                  "File holding a secret token; clients must prove they hold it (muster's\n"
                  "clients do, by challenge-response: the token is never sent) before any other\n"
                  "command, and musterd proves it to them. Unauthenticated connections are\n"
                  "refused.");
  flags.AddString("store-allow-unauthenticated", &allow_unauthenticated,
                  "With --store-token-file: comma-separated CIDRs whose clients may skip the\n"
                  "token (e.g. unmodified PyTorch ranks on 10.0.0.0/8).");
  flags.AddInt("store-max-key-bytes", &max_key_bytes, "Largest key accepted.");
  flags.AddInt("store-max-value-bytes", &max_value_bytes, "Largest value accepted.");
  flags.AddInt("store-max-keys-per-request", &max_keys_per_request,
               "Most keys in one WAIT, CHECK, MULTI_GET or MULTI_SET.");
  flags.AddInt("store-max-request-bytes", &max_request_bytes,
               "Largest request (sum of its keys and values).");
  flags.AddInt("store-max-connections", &max_connections,
               "Most simultaneous (authenticated) store connections; more are refused.");
  flags.AddInt("store-max-unauthenticated-connections", &max_unauthenticated,
               "With --store-token-file: most connections still authenticating, counted apart\n"
               "from --store-max-connections; past it the oldest is replaced if it has been\n"
               "trying for over a quarter of the timeout (at most 1 s), else a new one is\n"
               "refused.");
  flags.AddDouble("store-auth-timeout-seconds", &auth_timeout_seconds,
                  "With --store-token-file: a connection that has not authenticated within this\n"
                  "is closed (PyTorch clients admitted by --store-allow-unauthenticated are not\n"
                  "subject to it).");
  flags.AddInt("store-max-total-bytes", &max_total_bytes,
               "Most memory the store's data may take: keys, values and queue items at what\n"
               "holding them costs (their allocations and table slots); writes beyond are\n"
               "refused.");
  flags.AddInt("store-max-reply-bytes", &max_reply_bytes,
               "Largest single store reply (MULTI_GET, GET, LIST_KEYS, GET_WAIT_FOR...),\n"
               "measured before it is built; a larger one fails that request alone.");
  flags.AddInt("store-memory-budget-bytes", &memory_budget_bytes,
               "Memory of all store connections together (not the data): buffered requests\n"
               "(charged as soon as their header declares their lengths), parked waits' key\n"
               "lists and unsent replies. A request that would exceed it fails alone.");
  flags.AddInt("store-max-connection-bytes", &max_connection_bytes,
               "One store connection's share of the memory budget: its buffered (declared)\n"
               "request plus its parked wait.");
  flags.AddString("state-dir", &options.store.state_dir,
                  "Keep the store durable: an append-only log in this directory, replayed at\n"
                  "start (a torn last record is dropped). A write is acknowledged only once\n"
                  "logged; while the log cannot be written writes fail and reads go on.\n"
                  "Empty: memory only.");
  flags.AddBool("store-recover", &options.store.recover,
                "With --state-dir: start even if the log is corrupt (a damaged record that is\n"
                "not a torn tail): keep the original as store.log.corrupt-<UTC time>, load\n"
                "every record that verifies, write a clean log. Without it musterd refuses to\n"
                "start on a corrupt log, naming the file and the offset.");
  flags.AddInt("shm-slot-bytes", &shm_slot_bytes,
               "Shared memory per rank of each node-local group: the most one collective\n"
               "round moves per rank (larger buffers take several rounds).");
  flags.AddInt("node-cpus", &node_cpus,
               "CPUs this node's ranks share. With more ranks in a group than CPUs, ranks\n"
               "yield instead of spinning while they wait for each other. 0 (default):\n"
               "per group, the CPUs in its ranks' affinity masks (which a cpuset narrows; a CPU\n"
               "quota is not counted).");
  flags.AddInt("trace-records", &trace_records,
               "Flight recorder: how many of its last collectives each rank keeps per group in\n"
               "the group's shared memory (musterctl trace; 0: none; at most 1048576).");
  flags.AddString("dump-dir", &options.dump_dir,
                  "Where the flight recorder of a group's local members is written when the\n"
                  "group breaks (JSON; the path is logged and shown by musterctl jobs/group).\n"
                  "Empty: <state-dir>/dumps, else dumps/ next to the socket; 'none': off.");
  flags.AddInt("dump-max-bytes", &dump_max_bytes,
               "Dumps kept at most, in bytes (all jobs together): after each dump the\n"
               "oldest are removed until the rest fit.");
  flags.AddBool("store-fsync", &options.store.fsync,
                "With --state-dir: fsync the log before acknowledging writes (survives power\n"
                "loss, slower). Without it writes survive a crash of musterd, not of the host.");
  flags.AddString("metrics-listen", &options.metrics_listen,
                  "Serve Prometheus metrics (GET /metrics, text format) on ADDR:PORT, e.g.\n"
                  "127.0.0.1:9464; port 0 picks a free one (\"metrics_port\" in --ready-file).\n"
                  "Off by default. Plain HTTP without authentication: bind it to an address\n"
                  "only your monitoring reaches.");
  flags.AddString("gpu-plugin", &options.gpu_plugin,
                  "The CUDA/NCCL plugin (libmuster_cuda.so) that runs GPU collectives. Empty:\n"
                  "next to musterd, the Bazel output tree, then /usr/lib/muster. Without it (or\n"
                  "without CUDA) musterd runs and GPU requests fail saying why.");
  std::vector<std::string> positional = flags.ParseOrExit(argc, argv);

  if (!positional.empty()) {
    std::fprintf(stderr, "musterd: unexpected argument '%s' (see musterd --help)\n",
                 positional[0].c_str());
    return 2;
  }
  if (!SetLogLevel(log_level)) {
    std::fprintf(stderr, "musterd: --log-level must be debug, info, warning or error, got '%s'\n",
                 log_level.c_str());
    return 2;
  }
  if (!(grace_seconds >= 0 && grace_seconds <= 60)) {
    std::fprintf(stderr, "musterd: --shutdown-grace-seconds must be in [0, 60]\n");
    return 2;
  }
  if (grpc_port < 0 || grpc_port > 65535) {
    std::fprintf(stderr, "musterd: --grpc-port must be in [0, 65535], got %lld\n",
                 static_cast<long long>(grpc_port));
    return 2;
  }
  for (auto [name, value] : {std::pair<const char*, int64_t>{"store-max-key-bytes", max_key_bytes},
                             {"store-max-value-bytes", max_value_bytes},
                             {"store-max-keys-per-request", max_keys_per_request},
                             {"store-max-request-bytes", max_request_bytes},
                             {"store-max-connections", max_connections},
                             {"store-max-unauthenticated-connections", max_unauthenticated},
                             {"store-max-total-bytes", max_total_bytes},
                             {"store-max-reply-bytes", max_reply_bytes},
                             {"store-memory-budget-bytes", memory_budget_bytes},
                             {"store-max-connection-bytes", max_connection_bytes}}) {
    if (value <= 0) {
      std::fprintf(stderr, "musterd: --%s must be positive, got %lld\n", name,
                   static_cast<long long>(value));
      return 2;
    }
  }
  if (!(auth_timeout_seconds > 0 && auth_timeout_seconds <= 3600)) {
    std::fprintf(stderr, "musterd: --store-auth-timeout-seconds must be in (0, 3600], got %g\n",
                 auth_timeout_seconds);
    return 2;
  }
  if (store_port < 0 || store_port > 65535) {
    std::fprintf(stderr, "musterd: --store-port must be in [0, 65535], got %lld\n",
                 static_cast<long long>(store_port));
    return 2;
  }
  options.store.port = static_cast<int>(store_port);
  options.store.limits.max_key_bytes = max_key_bytes;
  options.store.limits.max_value_bytes = max_value_bytes;
  options.store.limits.max_keys_per_request = max_keys_per_request;
  options.store.limits.max_request_bytes = max_request_bytes;
  options.store.max_connections = max_connections;
  options.store.max_unauthenticated_connections = max_unauthenticated;
  options.store.auth_timeout = absl::Seconds(auth_timeout_seconds);
  options.store.max_total_bytes = max_total_bytes;
  options.store.max_reply_bytes = max_reply_bytes;
  options.store.memory_budget_bytes = memory_budget_bytes;
  options.store.max_connection_bytes = max_connection_bytes;
  options.shm_slot_bytes = static_cast<uint64_t>(std::max<int64_t>(shm_slot_bytes, 4096));
  if (node_cpus < 0 || node_cpus > 65536) {
    std::fprintf(stderr, "musterd: --node-cpus must be in [0, 65536], got %lld\n",
                 static_cast<long long>(node_cpus));
    return 2;
  }
  options.node_cpus = static_cast<unsigned>(node_cpus);
  if (trace_records < 0 || trace_records > (int64_t{1} << 20)) {
    std::fprintf(stderr, "musterd: --trace-records must be in [0, 1048576], got %lld\n",
                 static_cast<long long>(trace_records));
    return 2;
  }
  options.trace_records = static_cast<uint64_t>(trace_records);
  for (auto [name, value] : {std::pair<const char*, int64_t>{"max-world-size", max_world_size},
                             {"max-group-size", max_group_size},
                             {"max-jobs", max_jobs}}) {
    if (value <= 0 || value > (int64_t{1} << 30)) {
      std::fprintf(stderr, "musterd: --%s must be in [1, 2^30], got %lld\n", name,
                   static_cast<long long>(value));
      return 2;
    }
  }
  if (!(job_grace_seconds >= 0 && job_grace_seconds <= 86400)) {
    std::fprintf(stderr, "musterd: --job-grace-seconds must be in [0, 86400]\n");
    return 2;
  }
  if (!(grpc_idle_seconds >= 1 && grpc_idle_seconds <= 86400)) {
    std::fprintf(stderr, "musterd: --grpc-idle-seconds must be in [1, 86400], got %g\n",
                 grpc_idle_seconds);
    return 2;
  }
  options.grpc_idle_timeout = absl::Seconds(grpc_idle_seconds);
  if (dump_max_bytes < 0) {
    std::fprintf(stderr, "musterd: --dump-max-bytes must be >= 0\n");
    return 2;
  }
  options.dump_max_bytes = static_cast<uint64_t>(dump_max_bytes);
  options.max_world_size = static_cast<int>(max_world_size);
  options.max_group_size = static_cast<int>(max_group_size);
  options.max_jobs = static_cast<int>(max_jobs);
  options.job_grace = absl::Seconds(job_grace_seconds);
  auto mode = muster::ParseSocketMode(socket_mode);
  auto socket_gid = muster::ResolveGroup(socket_group);
  auto operator_gid = muster::ResolveGroup(operator_group);
  for (auto [flag, status] : {std::pair<const char*, absl::Status>{"socket-mode", mode.status()},
                              {"socket-group", socket_gid.status()},
                              {"operator-group", operator_gid.status()}}) {
    if (!status.ok()) {
      std::fprintf(stderr, "musterd: --%s: %s\n", flag, std::string(status.message()).c_str());
      return 2;
    }
  }
  options.socket_mode = *mode;
  options.socket_gid = *socket_gid;
  options.access.operator_gid = *operator_gid;
  if (!cluster_token_file.empty()) {
    auto token = ReadTokenFile("token-file", cluster_token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "musterd: %s\n", std::string(token.status().message()).c_str());
      return 2;
    }
    options.access.token = *token;
  }
  for (auto [flag, path, out] : {std::tuple<const char*, std::string*, std::string*>{
                                     "tls-cert", &tls_cert, &options.tls_cert_pem},
                                 {"tls-key", &tls_key, &options.tls_key_pem},
                                 {"tls-ca", &tls_ca, &options.tls_ca_pem}}) {
    if (path->empty()) continue;
    auto pem = ReadWholeFile(flag, *path, /*secret=*/std::string(flag) == "tls-key");
    if (!pem.ok()) {
      std::fprintf(stderr, "musterd: %s\n", std::string(pem.status().message()).c_str());
      return 2;
    }
    *out = *pem;
  }
  options.etcd.endpoints = absl::StrSplit(etcd_endpoints, ',', absl::SkipEmpty());
  if (etcd_lease_ttl_seconds < 1 || etcd_lease_ttl_seconds > 3600) {
    std::fprintf(stderr, "musterd: --etcd-lease-ttl-seconds must be in [1, 3600], got %lld\n",
                 static_cast<long long>(etcd_lease_ttl_seconds));
    return 2;
  }
  options.etcd_lease_ttl = absl::Seconds(etcd_lease_ttl_seconds);
  if (options.store_backend == "etcd" && options.etcd.endpoints.empty()) {
    std::fprintf(stderr, "musterd: --store-backend etcd needs --etcd-endpoints\n");
    return 2;
  }
  if (options.store_backend != "etcd" && options.store_backend != "memory") {
    std::fprintf(stderr, "musterd: --store-backend must be memory or etcd, got '%s'\n",
                 options.store_backend.c_str());
    return 2;
  }
  if (!options.etcd.user.empty() != !etcd_password_file.empty()) {
    std::fprintf(stderr, "musterd: --etcd-user and --etcd-password-file go together\n");
    return 2;
  }
  if (!etcd_password_file.empty()) {
    auto password = ReadTokenFile("etcd-password-file", etcd_password_file);
    if (!password.ok()) {
      std::fprintf(stderr, "musterd: %s\n", std::string(password.status().message()).c_str());
      return 2;
    }
    options.etcd.password = *password;
  }
  for (auto [flag, path, out] : {std::tuple<const char*, std::string*, std::string*>{
                                     "etcd-ca", &etcd_ca, &options.etcd.ca_pem},
                                 {"etcd-cert", &etcd_cert, &options.etcd.cert_pem},
                                 {"etcd-key", &etcd_key, &options.etcd.key_pem}}) {
    if (path->empty()) continue;
    auto pem = ReadWholeFile(flag, *path, /*secret=*/std::string(flag) == "etcd-key");
    if (!pem.ok()) {
      std::fprintf(stderr, "musterd: %s\n", std::string(pem.status().message()).c_str());
      return 2;
    }
    *out = *pem;
  }
  if (!token_file.empty()) {
    auto token = ReadTokenFile("store-token-file", token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "musterd: %s\n", std::string(token.status().message()).c_str());
      return 2;
    }
    options.store.token = *token;
  }
  auto cidrs = muster::CidrSet::Parse(allow_unauthenticated);
  if (!cidrs.ok()) {
    std::fprintf(stderr, "musterd: --store-allow-unauthenticated: %s\n",
                 std::string(cidrs.status().message()).c_str());
    return 2;
  }
  if (!cidrs->empty() && token_file.empty()) {
    std::fprintf(stderr,
                 "musterd: --store-allow-unauthenticated needs --store-token-file (without a "
                 "token every client is allowed)\n");
    return 2;
  }
  options.store.allow_unauthenticated = *cidrs;
  RaiseFileLimit();
  options.grpc_port = static_cast<int>(grpc_port);
  options.shutdown_grace = absl::Seconds(grace_seconds);
  if (options.socket_path.empty()) options.socket_path = muster::DefaultSocketPath();

  // Block the stop signals in every thread (gRPC's threads inherit this
  // mask); the main thread collects them with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // A file size limit (systemd's LimitFSIZE) then fails the store log's write
  // with EFBIG, which the store reports and survives, instead of killing us.
  signal(SIGXFSZ, SIG_IGN);

  if (customize) customize(options);
  auto daemon = muster::Daemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "musterd: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  MLOG(INFO) << "received " << strsignal(signal_number) << ", stopping";
  (*daemon)->Shutdown();
  return 0;
}

}  // namespace muster
