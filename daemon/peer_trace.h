// Trace(gather)'s call to another node's musterd, and the proof a daemon
// gives that it knows the cluster token before anyone sends the token to it.
//
// Peers' addresses come from the job's store, which the job's user can
// write, and the cluster token travels as a bearer token. So before
// TracePeer sends the token it asks the peer to prove it knows the token:
// Admin.ProveDaemon with a fresh nonce, the daemon id the member record
// names and the address called; only the daemon that holds the token and
// has that id and address can answer. A listener in the place of a stopped
// daemon cannot, nor can it relay the question to a live daemon (which
// answers only for its own id and address).
//
// Stateless; thread-safe.
#ifndef MUSTER_DAEMON_PEER_TRACE_H_
#define MUSTER_DAEMON_PEER_TRACE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/groups.pb.h"

namespace muster {

// HMAC-SHA256(token, "muster-daemon-proof-v1\n" daemon_id "\n" address
// "\n" nonce), 32 raw bytes: what Admin.ProveDaemon answers.
std::string DaemonProof(absl::string_view token, absl::string_view daemon_id,
                        absl::string_view address, absl::string_view nonce);

// How this daemon calls its peers' TCP gRPC servers: the cluster token
// (may be empty), and with a CA, TLS with this daemon's certificate as the
// client's.
struct PeerCredentials {
  std::string token;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

// Asks the musterd with id `daemon` at `address` ("host:port") for its own
// members' records, giving up at `deadline`. With a token, the peer proves
// first that it knows it (UNAUTHENTICATED naming the address if it cannot,
// and the token is not sent); without one, nothing secret is sent.
absl::StatusOr<v1::TraceResponse> TracePeer(const PeerCredentials& credentials,
                                            const std::string& daemon, const std::string& address,
                                            const v1::TraceRequest& request, absl::Time deadline);

}  // namespace muster

#endif  // MUSTER_DAEMON_PEER_TRACE_H_
