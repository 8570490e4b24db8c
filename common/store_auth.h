// Store authentication helpers: the HMAC-SHA256 proofs and random nonces of
// the native store protocol's challenge-response (the exchange itself is
// documented in common/store_wire.h). Shared by musterd's store server and
// the native TcpStore client so the two cannot drift.
//
// A proof is HMAC-SHA256(token, label || nonce || nonce): the token is the
// key and never leaves the process. Labels differ per direction, so a proof
// one side produced can never be replayed as the other side's.
//
// Stateless; thread-safe. Nothing here logs its inputs or outputs.
#ifndef MUSTER_COMMON_STORE_AUTH_H_
#define MUSTER_COMMON_STORE_AUTH_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::store_auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // SHA-256 output
inline constexpr char kServerProofLabel[] = "muster-store-server-v1";
inline constexpr char kClientProofLabel[] = "muster-store-client-v1";

// HMAC-SHA256 of `data` under `key` (32 bytes).
std::string HmacSha256(absl::string_view key, absl::string_view data);

// kNonceBytes from the kernel's CSPRNG (getrandom). Fails only if the
// kernel refuses (e.g. seccomp), never with weak bytes.
absl::StatusOr<std::string> RandomNonce();

// What the server sends: HMAC(token, kServerProofLabel || client || server).
std::string ServerProof(absl::string_view token, absl::string_view client_nonce,
                        absl::string_view server_nonce);
// What the client sends: HMAC(token, kClientProofLabel || server || client).
std::string ClientProof(absl::string_view token, absl::string_view server_nonce,
                        absl::string_view client_nonce);

// Constant-time equality (CRYPTO_memcmp) of a received proof with the
// expected one; only a length mismatch returns early.
bool ProofEquals(absl::string_view received, absl::string_view expected);

}  // namespace muster::store_auth

#endif  // MUSTER_COMMON_STORE_AUTH_H_
