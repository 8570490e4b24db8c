// TcpStore: a Store client over TCP, for musterd's store or a PyTorch
// TCPStore server.
//
// Protocols:
//  - kNative (default, musterd only): mutual challenge-response on the
//    token (the token never crosses the wire; with a token, a server that
//    cannot prove it holds the same one is refused: UNAUTHENTICATED), learns
//    the server's size limits (and checks them before sending), and gets
//    every blocking call in one round trip with the timeout enforced by the
//    server; errors come back as messages.
//  - kTorch113: PyTorch 1.13's protocol (WAIT then GET, no handshake) —
//    works against musterd and against an unmodified torch 1.13 master;
//    the optional operations are Unimplemented.
// Connect() retries a refused connection, or one the store closes unanswered
// (at its connection limits), until `connect_timeout` (ranks may start before
// the store). A call that fails mid-reply, or a torch-protocol
// wait that times out, drops the connection; the next call reconnects.
//
// Thread-safe: calls are serialized on one connection (like c10d's
// client); use one TcpStore per thread for parallel blocking calls.
#ifndef MUSTER_CLIENT_INCLUDE_MUSTER_TCP_STORE_H_
#define MUSTER_CLIENT_INCLUDE_MUSTER_TCP_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "muster/store.h"

namespace muster {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 29500;
  enum class Protocol { kNative, kTorch113 } protocol = Protocol::kNative;
  // Proven (never sent) by the native protocol; required when musterd has
  // --store-token-file, and then the server must prove it holds it too.
  std::string token;
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration timeout = kDefaultStoreTimeout;
};

class TcpStore : public Store {
 public:
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const TcpStoreOptions& options);
  ~TcpStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  bool Supports(StoreCapability capability) const override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<std::vector<std::string>> ListKeys() override;
  using Store::Get;
  using Store::MultiGet;
  using Store::Wait;

  // Writes raw bytes and reads `reply_bytes` back, for protocol tests.
  absl::StatusOr<std::string> RawExchange(absl::string_view request, size_t reply_bytes);

 private:
  class Connection;
  explicit TcpStore(const TcpStoreOptions& options);

  absl::Status EnsureConnected() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The native handshake on a fresh connection. *closed_unanswered: the
  // store closed the connection before answering (worth a retry).
  absl::Status Handshake(absl::Time deadline, bool* closed_unanswered)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After an error status byte: reads the code and message, drops the
  // connection and returns them.
  absl::Status FailWithErrorReply(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSizes(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Native: sends `request`, reads the status byte (error replies become
  // statuses and drop the connection).
  absl::Status SendAndReadStatus(const std::string& request, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a request that has a reply: native requests also read the reply's
  // status byte; torch requests just go out.
  absl::Status SendRequest(const std::string& request, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitKeys(const std::vector<std::string>& keys, absl::Duration timeout,
                        std::vector<std::string>* values) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool native() const { return options_.protocol == TcpStoreOptions::Protocol::kNative; }

  const TcpStoreOptions options_;
  absl::Mutex mu_;
  std::unique_ptr<Connection> conn_ ABSL_GUARDED_BY(mu_);
  uint64_t max_key_bytes_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  uint64_t max_value_bytes_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  uint64_t max_keys_per_request_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
};

}  // namespace muster

#endif  // MUSTER_CLIENT_INCLUDE_MUSTER_TCP_STORE_H_
