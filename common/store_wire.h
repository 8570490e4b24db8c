// The TCP key-value store wire protocol (PyTorch TCPStore compatible), shared
// by musterd's store server and the native TcpStore client.
//
// Three dialects, told apart per connection by its first bytes:
//  - kTorch113: PyTorch 1.13 (no handshake; command bytes 0..8, plus 9..12
//    for the mid-2023 layout).
//  - kTorch2: PyTorch 2.2+ (VALIDATE + magic first; command bytes 0..17).
//  - kNative: muster's client. It opens with the handshake below, then
//    speaks kTorch2 codes plus the native extensions below, and every reply
//    it gets starts with a status byte (kReplyOk, or kReplyError + u8 absl
//    status code + message string, after which the server closes the
//    connection).
// Integers are little-endian; strings and byte vectors are u64 length + bytes.
//
// Native handshake: mutual challenge-response; the token never crosses the
// wire (common/store_auth.h computes the proofs, HMAC-SHA256 keyed by it):
//   1. client: AUTH        u8 kAuthByte, u32 kAuthMagic, client_nonce[32]
//   2. server: u8 kReplyOk, server_nonce[32], bytes server_proof
//        server_proof = HMAC(token, "muster-store-server-v1" || client_nonce
//        || server_nonce), or empty when the server has no token.
//      A client with a token closes the connection (UNAUTHENTICATED) unless
//      the proof matches its own computation (constant time): a server that
//      has no token, or another one, learns nothing but a random nonce.
//   3. client: AUTH_PROOF  u8 kAuthProofByte, bytes client_proof
//        client_proof = HMAC(token, "muster-store-client-v1" || server_nonce
//        || client_nonce), or empty when the client has no token.
//   4. server: u8 kReplyOk, u64 max_key_bytes, u64 max_value_bytes,
//        u64 max_keys_per_request, u64 max_request_bytes; or, if it has a
//        token and the proof does not match (constant time), an error reply
//        (UNAUTHENTICATED) and close.
// Nonces are kAuthNonceBytes from getrandom; proofs are 0 or kAuthProofBytes
// long. AUTH must be the first request and AUTH_PROOF the second; neither
// is valid later. The exchange proves knowledge of the token both ways but
// does not protect what follows (no TLS): a relay placed between a client and
// a real store can still act on the authenticated connection it forwards.
// See shared/research/tcpstore-protocol.md for the facts this follows.
//
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_STORE_WIRE_H_
#define MUSTER_COMMON_STORE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace muster::wire {

enum class Dialect { kUnknown, kTorch113, kTorch2, kNative };
const char* DialectName(Dialect d);

// Protocol-independent operations.
enum class Op {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  // Native extensions.
  kAuth,       // handshake step 1: client nonce
  kAuthProof,  // handshake step 3: client proof
  // keys + i64 timeout ms -> status, u8 0 ready / 1 timed out, then u64 how
  // many keys are missing and a key list of the first of them (at most
  // kMaxNamedMissingKeys: an error message needs no more, and a 131,072-key
  // list would cost the server megabytes and milliseconds for nothing).
  kWaitFor,
  kGetWaitFor,  // the same, u8 0 + the values when ready
};
const char* OpName(Op op);

inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;
inline constexpr uint8_t kAuthByte = 0xA5;       // never a PyTorch command
inline constexpr uint8_t kAuthProofByte = 0xA6;  // only as the second request
// Follows kAuthByte (the bytes "mus1"). Clients before the challenge-response
// sent a u64 token length there, so they are told apart and refused.
inline constexpr uint32_t kAuthMagic = 0x3173756D;
inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthProofBytes = 32;
inline constexpr uint8_t kWaitForByte = 0x70;
inline constexpr uint8_t kGetWaitForByte = 0x71;
// Missing keys a timed-out wait names (the rest are counted).
inline constexpr size_t kMaxNamedMissingKeys = 16;

// Reply bytes.
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;
inline constexpr uint8_t kWatchRegistered = 3;
inline constexpr uint8_t kReplyOk = 0;
inline constexpr uint8_t kReplyError = 1;
inline constexpr uint8_t kWaitDone = 0;
inline constexpr uint8_t kWaitTimedOut = 1;

// Size limits a store server enforces (musterd's --store-max-* flags). The
// native client learns them from the AUTH_PROOF reply and checks locally
// first.
struct StoreLimits {
  uint64_t max_key_bytes = 8 << 10;
  uint64_t max_value_bytes = 16 << 20;
  uint64_t max_keys_per_request = 131072;
  // Sum of all keys and values of one request (MULTI_SET, MULTI_GET).
  uint64_t max_request_bytes = 64 << 20;
};

// The command byte of `op` in `dialect`, if it has one.
std::optional<uint8_t> CommandByte(Dialect dialect, Op op);
// The op a command byte means in `dialect` (kTorch113, kTorch2, kNative);
// never the handshake's AUTH or AUTH_PROOF, which are valid only in place.
std::optional<Op> OpFromByte(Dialect dialect, uint8_t byte);

// Encoding helpers: append to `out`.
void PutU8(std::string* out, uint8_t v);
void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
void PutI64(std::string* out, int64_t v);
void PutBytes(std::string* out, absl::string_view bytes);  // u64 length + bytes
void PutKeyList(std::string* out, const std::vector<std::string>& keys);

// `key` for log and error messages: printable ASCII kept, other bytes as
// \xNN, cut after 80 bytes.
std::string PrintableKey(absl::string_view key);

// "missing keys: a, b" for a timed-out wait's message; `named` are the first
// of `total` missing keys, and when they are not all, the count follows:
// "missing keys: a, b, ... (2 of 131071 missing keys named)".
std::string MissingKeysText(const std::vector<std::string>& named, uint64_t total);

// ADD's counter rule (C's strtoll on the stored text): optional leading
// space and sign, then digits; trailing bytes are ignored. nullopt if no
// digit starts the value or it overflows.
std::optional<int64_t> ParseCounter(absl::string_view text);

// COMPARE_SET's rule. `current` is the stored value (nullopt: key missing).
// Returns the value to store (nullopt: leave as is) and sets *reply.
std::optional<std::string> CompareSetResult(const std::optional<std::string>& current,
                                            absl::string_view expected, absl::string_view desired,
                                            std::string* reply);

}  // namespace muster::wire

#endif  // MUSTER_COMMON_STORE_WIRE_H_
