// RequestParser: turns the byte stream of one store connection into
// requests, incrementally. Bytes may arrive split anywhere (PyTorch 1.13
// sends each field with its own send(); a test helper sleeps between a key
// and its value), so Next() reports kNeedMore until a whole request is
// buffered, and never reads past the bytes it is given.
//
// The first bytes decide the dialect (see common/store_wire.h): AUTH means
// native, VALIDATE + magic means PyTorch 2.2+, anything else PyTorch 1.13.
// A native stream must be AUTH, then AUTH_PROOF, then ordinary requests;
// the handshake commands anywhere else are errors. Limits are checked as
// soon as a length field arrives, so an oversized request is rejected
// before its body is buffered.
//
// Not thread-safe: one parser per connection, used by the connection's loop.
#ifndef MUSTER_DAEMON_STORE_REQUEST_PARSER_H_
#define MUSTER_DAEMON_STORE_REQUEST_PARSER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/store_wire.h"

namespace muster {

struct StoreRequest {
  wire::Op op = wire::Op::kValidate;
  std::vector<std::string> keys;
  // SET/APPEND/QUEUE_PUSH: one value; COMPARE_SET: expected, desired;
  // MULTI_SET: one value per key; AUTH: the client nonce (kAuthNonceBytes);
  // AUTH_PROOF: the client proof (empty or kAuthProofBytes).
  std::vector<std::string> values;
  int64_t number = 0;  // ADD delta; WAIT_FOR/GET_WAIT_FOR timeout in ms
  // Sum of the keys' sizes, for key lists parsed incrementally (more than
  // resumable_keys keys, counted as they are parsed); else 0.
  uint64_t key_bytes = 0;
  uint32_t nonce = 0;  // PING
};

class RequestParser {
 public:
  // kYield: a long key list is partly parsed and `key_budget` ran out; call
  // again (with the same input or more) to continue.
  enum class Result { kNeedMore, kRequest, kError, kYield };

  static constexpr uint64_t kResumableKeys = 256;

  // The torch dialect a connection's first bytes show: kTorch2 (VALIDATE)
  // or kTorch113; kUnknown for a native client (AUTH) or too few bytes to
  // tell VALIDATE from a 1.13 SET. For refusing a torch client that must
  // authenticate before its request is buffered.
  static wire::Dialect TorchDialectOf(absl::string_view input);

  // Key lists longer than `resumable_keys` parse incrementally (see Next).
  explicit RequestParser(const wire::StoreLimits& limits, uint64_t resumable_keys = kResumableKeys)
      : limits_(limits), resumable_keys_(resumable_keys) {}

  // Parses one request from the start of `input`. kRequest: *request is
  // filled and *consumed says how many bytes it used. kError: *error says
  // what was wrong; the connection must be closed.
  //
  // Key lists longer than kResumableKeys (WAIT, CHECK, MULTI_GET, WAIT_FOR,
  // GET_WAIT_FOR) are parsed once, key by key as their bytes arrive, not
  // re-parsed from the start on every call; with `key_budget`, at most that
  // many of their keys are parsed per call (it is decremented), so a
  // 131,072-key request can be spread over several loop iterations.
  Result Next(absl::string_view input, StoreRequest* request, size_t* consumed, std::string* error,
              size_t* key_budget = nullptr);

  // Bytes held for a request still being parsed (its keys parsed so far).
  uint64_t held_bytes() const { return resume_held_; }

  // Gives up the request still being parsed and hands over its keys parsed
  // so far (so a caller can free a long list in slices); the parser must not
  // be used afterwards.
  std::vector<std::string> TakeHeldKeys() {
    resuming_ = false;
    resume_held_ = 0;
    return std::move(partial_.keys);
  }

  // Known once a request parsed; native also after a malformed first AUTH.
  wire::Dialect dialect() const { return dialect_; }

  // After kNeedMore: the fewest buffered bytes the pending request can
  // complete with; it covers every length field parsed so far (a declared
  // 16 MiB value makes it at least 16 MiB before those bytes arrive), so the
  // server can charge or refuse the request's memory up front. 0 otherwise.
  size_t min_needed() const { return min_needed_; }

 private:
  wire::StoreLimits limits_;
  uint64_t resumable_keys_;
  wire::Dialect dialect_ = wire::Dialect::kUnknown;
  // The pending request cannot complete with fewer buffered bytes.
  size_t min_needed_ = 0;
  // Requests parsed so far (the native handshake's place).
  uint64_t parsed_ = 0;

  Result ContinueKeyList(absl::string_view input, StoreRequest* request, size_t* consumed,
                         std::string* error, size_t* key_budget);
  // A long key list being parsed across calls: partial_ has the keys so far,
  // the next starts at byte resume_pos_ of the request (after its command
  // byte); resume_total_ is their bytes (for max_request_bytes).
  bool resuming_ = false;
  wire::Dialect resume_dialect_ = wire::Dialect::kUnknown;
  StoreRequest partial_;
  uint64_t resume_count_ = 0;
  size_t resume_pos_ = 0;
  uint64_t resume_total_ = 0;
  uint64_t resume_held_ = 0;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_REQUEST_PARSER_H_
