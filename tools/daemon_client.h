// DaemonTarget: how a CLI tool reaches a musterd — a unix socket path or a
// TCP "host:port" with its credentials (cluster token, TLS) — and the gRPC
// channel to it. Also formats gRPC failures as one human-readable line.
//
// Thread-safe (stateless functions).
#ifndef MUSTER_TOOLS_DAEMON_CLIENT_H_
#define MUSTER_TOOLS_DAEMON_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace muster {

struct DaemonTarget {
  std::string socket_path;  // used when address is empty
  std::string address;      // "host:port" of the daemon's TCP gRPC server
  // TCP only: the cluster token sent with every call, and TLS (PEM text):
  // the CA that signed the daemon's certificate, and this client's
  // certificate and key for mutual TLS.
  std::string token;
  std::string tls_ca_pem;
  std::string tls_cert_pem;
  std::string tls_key_pem;

  // "unix:/path" or "host:port", as gRPC spells it.
  std::string GrpcTarget() const;
  // For messages: "unix socket /path" or "host:port".
  std::string Describe() const;
};

// Fills the TCP credentials of `target` from flags (paths; empty: unset)
// and the environment: MUSTER_TOKEN_FILE (or MUSTER_TOKEN), MUSTER_TLS_CA,
// MUSTER_TLS_CERT, MUSTER_TLS_KEY. Errors name the file that failed.
absl::Status LoadCredentials(const std::string& token_file, const std::string& tls_ca,
                             const std::string& tls_cert, const std::string& tls_key,
                             DaemonTarget* target);

std::shared_ptr<grpc::Channel> ConnectToDaemon(const DaemonTarget& target);

// A grpc::Status as an absl::Status with the same code, prefixed by context.
absl::Status FromGrpc(const grpc::Status& status, absl::string_view context);

// A client context for `target` whose deadline is now + timeout (carrying
// the cluster token over TCP).
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(const DaemonTarget& target,
                                                        absl::Duration timeout);

}  // namespace muster

#endif  // MUSTER_TOOLS_DAEMON_CLIENT_H_
