// The TCP key-value store wire protocol (PyTorch TCPStore compatible), shared
// by musterd's store server and the native TcpStore client.
//
// Three dialects, told apart per connection by its first bytes:
//  - kTorch113: PyTorch 1.13 (no handshake; command bytes 0..8, plus 9..12
//    for the mid-2023 layout).
//  - kTorch2: PyTorch 2.2+ (VALIDATE + magic first; command bytes 0..17).
//  - kNative: muster's client. It opens with AUTH (kAuthByte), then speaks
//    kTorch2 codes plus the native extensions below, and every reply it gets
//    starts with a status byte (kReplyOk, or kReplyError + message string,
//    after which the server closes the connection).
// Integers are little-endian; strings and byte vectors are u64 length + bytes.
// See shared/research/tcpstore-protocol.md for the facts this follows.
//
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_STORE_WIRE_H_
#define MUSTER_COMMON_STORE_WIRE_H_

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
  kAuth,
  kWaitFor,     // keys + i64 timeout ms -> status, u8 0 ready / 1 timed out (+ missing keys)
  kGetWaitFor,  // keys + i64 timeout ms -> status, u8 0 + values / 1 + missing keys
};
const char* OpName(Op op);

inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;
inline constexpr uint8_t kAuthByte = 0xA5;  // never a PyTorch command
inline constexpr uint8_t kWaitForByte = 0x70;
inline constexpr uint8_t kGetWaitForByte = 0x71;

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
// native client learns them from the AUTH reply and checks locally first.
struct StoreLimits {
  uint64_t max_key_bytes = 8 << 10;
  uint64_t max_value_bytes = 16 << 20;
  uint64_t max_keys_per_request = 131072;
  // Sum of all keys and values of one request (MULTI_SET, MULTI_GET).
  uint64_t max_request_bytes = 64 << 20;
  uint64_t max_token_bytes = 4096;
};

// The command byte of `op` in `dialect`, if it has one.
std::optional<uint8_t> CommandByte(Dialect dialect, Op op);
// The op a command byte means in `dialect` (kTorch113, kTorch2, kNative).
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
