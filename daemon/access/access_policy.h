// AccessPolicy: musterd's front door for gRPC calls. It holds the cluster
// token and the TLS set-up of the TCP listener, the identities of the unix
// socket's connections (recorded by UnixListener when it accepts them), the
// operator group, and the size limits of request fields. Admit() turns a
// call into a Caller, or into the error to answer with: UNAUTHENTICATED
// (TCP without valid credentials), INVALID_ARGUMENT (a field over its
// limit). Services then decide with Caller::MayAccess (PERMISSION_DENIED).
//
// The token is compared in constant time and never logged.
//
// Thread-safe.
#ifndef MUSTER_DAEMON_ACCESS_ACCESS_POLICY_H_
#define MUSTER_DAEMON_ACCESS_ACCESS_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/access/caller.h"

namespace google::protobuf {
class Message;
}
namespace grpc {
class ServerContextBase;
}

namespace muster {

// Longest accepted string fields of a request, by field name; every other
// string field gets `max_string_bytes`. Bytes fields (store values) are the
// store's business.
struct FieldLimits {
  size_t max_string_bytes = 4096;
  size_t max_host_bytes = 255;    // fields named "host", "hostname"
  size_t max_job_id_bytes = 128;  // "job_id"
  size_t max_name_bytes = 256;    // "name", "group"
  size_t max_repeated = 1 << 20;  // elements of any repeated field
};

// INVALID_ARGUMENT naming the first field of `message` (recursively) over
// its limit, e.g. "muster.v1.RegisterRequest.host is 1048576 bytes (limit 255)".
absl::Status CheckFieldLimits(const google::protobuf::Message& message, const FieldLimits& limits);

struct AccessOptions {
  // Non-empty: every call over TCP must carry it ("authorization: Bearer …").
  std::string token;
  // The TCP listener verified the client's TLS certificate (mutual TLS).
  bool tls_client_certificates = false;
  // Members of this group (and root, and musterd's user) see every job.
  int64_t operator_gid = -1;
  FieldLimits limits;
};

class AccessPolicy {
 public:
  explicit AccessPolicy(AccessOptions options);
  AccessPolicy(const AccessPolicy&) = delete;
  AccessPolicy& operator=(const AccessPolicy&) = delete;

  const AccessOptions& options() const { return options_; }

  // The caller of a unix socket connection with these kernel credentials.
  Caller UnixCaller(int64_t uid, int64_t gid, int64_t pid) const;
  // Remembers who is behind the unix socket connection gRPC names `peer`.
  void RecordUnixPeer(const std::string& peer, Caller caller);

  // Identifies the caller of `context` and checks `request`'s fields
  // (nullptr: nothing to check).
  absl::StatusOr<Caller> Admit(const grpc::ServerContextBase& context,
                               const google::protobuf::Message* request) const;

 private:
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context) const;
  // Logs a refused call naming `who` (rate-limited).
  void LogRefusal(const std::string& who, const absl::Status& why) const;

  const AccessOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Caller> unix_peers_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable int64_t suppressed_refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

// Constant-time comparison of two secrets (time depends on the lengths only).
bool SecretsEqual(const std::string& a, const std::string& b);

}  // namespace muster

#endif  // MUSTER_DAEMON_ACCESS_ACCESS_POLICY_H_
