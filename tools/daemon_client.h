// DaemonTarget: how a CLI tool reaches a musterd — a unix socket path or a
// TCP "host:port" — and the gRPC channel to it. Also formats gRPC failures
// as one human-readable line.
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

  // "unix:/path" or "host:port", as gRPC spells it.
  std::string GrpcTarget() const;
  // For messages: "unix socket /path" or "host:port".
  std::string Describe() const;
};

std::shared_ptr<grpc::Channel> ConnectToDaemon(const DaemonTarget& target);

// A grpc::Status as an absl::Status with the same code, prefixed by context.
absl::Status FromGrpc(const grpc::Status& status, absl::string_view context);

// A client context whose deadline is now + timeout.
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout);

}  // namespace muster

#endif  // MUSTER_TOOLS_DAEMON_CLIENT_H_
