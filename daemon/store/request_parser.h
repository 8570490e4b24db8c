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
  uint32_t nonce = 0;  // PING
};

class RequestParser {
 public:
  enum class Result { kNeedMore, kRequest, kError };

  explicit RequestParser(const wire::StoreLimits& limits) : limits_(limits) {}

  // Parses one request from the start of `input`. kRequest: *request is
  // filled and *consumed says how many bytes it used. kError: *error says
  // what was wrong; the connection must be closed.
  Result Next(absl::string_view input, StoreRequest* request, size_t* consumed, std::string* error);

  // Known once a request parsed; native also after a malformed first AUTH.
  wire::Dialect dialect() const { return dialect_; }

  // After kNeedMore: the fewest buffered bytes the pending request can
  // complete with; it covers every length field parsed so far (a declared
  // 16 MiB value makes it at least 16 MiB before those bytes arrive), so the
  // server can charge or refuse the request's memory up front. 0 otherwise.
  size_t min_needed() const { return min_needed_; }

 private:
  wire::StoreLimits limits_;
  wire::Dialect dialect_ = wire::Dialect::kUnknown;
  // The pending request cannot complete with fewer buffered bytes.
  size_t min_needed_ = 0;
  // Requests parsed so far (the native handshake's place).
  uint64_t parsed_ = 0;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_REQUEST_PARSER_H_
