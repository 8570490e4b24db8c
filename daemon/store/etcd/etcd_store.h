// EtcdStore: muster's Store (c10d semantics, muster/store.h) kept in an etcd
// v3 cluster, so a job's store survives losing any node. Every key lives
// under `prefix` (one etcd key per store key, the value as is).
//
//  - Set / MultiSet: Put / one Txn of Puts (chunks of 128, etcd's default
//    --max-txn-ops). DeleteKey: DeleteRange. Check / MultiGet: one Txn of
//    Ranges (one revision). NumKeys / ListKeys: a Range over the prefix.
//  - Add: concurrent Adds of one key are coalesced, the first caller runs one
//    read-modify-write for the sum of the deltas queued meanwhile and hands
//    every caller its own result (a consistent serial order), so N ranks of
//    a node cost one Txn per round, not N.
//  - Add / CompareSet / Append: read-modify-write Txns that compare the
//    key's mod_revision (version 0 when missing) and retry on a conflict
//    with the value the failed Txn read back (one round trip per retry).
//  - Get / Wait / MultiGet block through etcd Watch, started at etcd's
//    current revision (synced: events as they commit) after the read that
//    found keys missing; if writes committed between that read and the
//    watch's start, the keys are read once more, so no write is missed and
//    nothing polls. A broken watch re-reads and watches again.
//
// Every call has one deadline (the per-call timeout of blocking calls, the
// store's timeout() for the others). An endpoint that is unreachable, or
// does not answer within attempt_timeout (no quorum behind it), fails that
// attempt; the call moves on to the next endpoint until its deadline, then
// fails UNAVAILABLE naming the endpoint and gRPC's cause. Read-modify-write
// Txns whose reply was lost (deadline, connection reset, "leader changed")
// may have been applied and are not retried, so an Add is never counted
// twice; they fail UNAVAILABLE saying so. Only requests that surely never
// reached etcd (connection refused, "no leader") are sent again.
//
// Auth: user/password (Authenticate; the token travels as "token" metadata
// and is renewed when etcd says it expired) and TLS (https:// endpoints,
// optional client certificate).
//
// Thread-safe: any number of threads may call one EtcdStore at once; each
// call uses its own gRPC context (blocking calls hold a watch stream for
// their duration).
#ifndef MUSTER_DAEMON_STORE_ETCD_ETCD_STORE_H_
#define MUSTER_DAEMON_STORE_ETCD_ETCD_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/store/blocking_store.h"

namespace muster {

struct EtcdStoreOptions {
  // "http://host:port", "https://host:port" or "host:port" (http).
  std::vector<std::string> endpoints;
  // Every store key is prefix + key in etcd.
  std::string prefix = "/muster/";
  // Non-empty: authenticate as this etcd user.
  std::string user;
  std::string password;
  // TLS (https:// endpoints): CA bundle, and optionally a client certificate.
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // The longest one request to one endpoint may take before the call moves
  // on to the next endpoint (a member cut off from quorum never answers).
  absl::Duration attempt_timeout = absl::Seconds(3);
  // Its own TCP connections (gRPC otherwise shares one among the channels of
  // a process with the same target): for benchmarks of many clients.
  bool private_connection = false;
};

class EtcdStore : public BlockingStore {
 public:
  // Checks the options and connects lazily (the first call reaches etcd).
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Create(EtcdStoreOptions options);
  ~EtcdStore() override;

  using Store::Get;
  using Store::MultiGet;
  using Store::Wait;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  bool Supports(StoreCapability) const override { return true; }
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<std::vector<std::string>> ListKeys() override;

  absl::Status WaitCancellable(const std::vector<std::string>& keys, absl::Duration timeout,
                               WaitCancel* cancel) override;
  absl::StatusOr<std::vector<std::string>> Missing(const std::vector<std::string>& keys) override;

  // Queues: each item is one etcd key under the queue's own prefix (outside
  // the store's key range: prefix with its last byte replaced by
  // "\0queues" + that byte, then "<length of key>:<key>/<unique id>"),
  // ordered by its create revision, so FIFO is etcd's order of the pushes
  // across every node. Push: one Put. Pop: the oldest item (a Range sorted
  // by create revision, limit 1), then a Txn deleting it if its
  // mod_revision is unchanged, which also counts the queue; a conflict (a
  // popper on another musterd won) retries with the new oldest item the
  // failed Txn read back, so each item is popped exactly once. A pop that
  // may have been applied but lost its reply is not retried (UNAVAILABLE).
  // A blocking pop waits through a Watch on the queue's prefix.
  absl::Status QueuePush(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<int64_t> QueuePop(absl::string_view key, std::string* value,
                                   absl::Duration timeout, WaitCancel* cancel) override;
  absl::StatusOr<int64_t> QueueLen(absl::string_view key) override;
  absl::Status WaitCancellableOrQueued(const std::vector<std::string>& keys, absl::Duration timeout,
                                       WaitCancel* cancel) override;
  absl::StatusOr<std::vector<std::string>> MissingOrQueued(
      const std::vector<std::string>& keys) override;
  // One read of the values, shared with the node's reads of the same keys
  // sent at or after `since`.
  absl::StatusOr<std::vector<std::string>> ValuesSince(const std::vector<std::string>& keys,
                                                       absl::Time since) override;

  // Read-modify-write rounds Add has run so far: concurrent Adds of one key
  // share a round (the node-level aggregation), so this grows slower than
  // the number of Add calls.
  uint64_t add_rounds() const;

  // Pops that lost their Txn to another popper and retried (the Txn's
  // failure branch read the next oldest item): for tests.
  uint64_t queue_pop_conflicts() const;

  // Ends blocking calls (UNAVAILABLE) and stops retries, for shutdown;
  // later calls fail at once.
  void Shutdown();

  const EtcdStoreOptions& options() const { return options_; }

  class Impl;

 private:
  explicit EtcdStore(std::unique_ptr<Impl> impl, EtcdStoreOptions options);
  std::unique_ptr<Impl> impl_;
  EtcdStoreOptions options_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_ETCD_ETCD_STORE_H_
