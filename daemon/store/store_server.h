// StoreServer: musterd's TCP key-value store, wire compatible with PyTorch's
// TCPStore (1.13 and 2.2+) and with muster's native client.
//
// One event-loop thread (epoll, level-triggered) owns every connection, the
// KvStore and the durability log; idle connections cost one fd and a few
// hundred bytes. Requests are parsed incrementally (RequestParser) and
// replies go out in request order. A connection whose client waits for keys
// is parked: its later input is held until the wait ends, except
// CANCEL_WAIT (2.x). A 1.13 client that sends anything while a WAIT is
// parked has given up on it (its socket timed out), so the wait is dropped
// silently instead of answering later with a stray byte.
//
// Bad input (malformed frames, oversized keys/values/requests, unknown
// commands, missing authentication) closes only that connection, with a
// rate-limited log line naming the peer and the reason; a native client
// first gets the reason as an error reply.
//
// Authentication (with a token): native clients run the challenge-response
// of common/store_wire.h; torch clients are admitted by address
// (allow_unauthenticated) at accept, or refused at their first bytes
// (before a partial request is charged what it declares).
// Until it authenticates, a connection counts toward
// max_unauthenticated_connections, not max_connections, and is closed at
// auth_timeout; when that pool is full, a new connection replaces the oldest
// one if it has been authenticating for longer than min(auth_timeout / 4,
// 1 s) (no muster client takes that long), else it is refused at accept. So
// idle connections neither keep token holders out nor pin memory. Memory is bounded by the store
// size limit (data) and a memory budget shared by all connections (input
// buffers charged by what a request declares, parked waits' key lists,
// unsent replies; plus a per-connection share and a per-reply limit, every
// reply measured before it is built). Past a per-connection output limit
// the connection is not read until its client drains replies.
//
// Requests run through StoreDispatcher (store_dispatcher.h), the one copy of
// what each command does and answers. No loop iteration may stall the other
// clients: reads, long key lists (parsing, wait registration, cancellation,
// freeing) and buffer growth are done in bounded slices per iteration.
//
// Thread-safety: Start/Stop/port/stats/Post are thread-safe; everything
// else runs on the loop thread. Tasks given to Post() run on the loop thread
// and receive the Loop interface.
#ifndef MUSTER_DAEMON_STORE_STORE_SERVER_H_
#define MUSTER_DAEMON_STORE_STORE_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/store_wire.h"
#include "daemon/store/cidr.h"
#include "daemon/store/kv_store.h"
#include "daemon/store/store_metrics.h"

namespace muster {

struct StoreServerOptions {
  // "0.0.0.0" or "::" listen on every IPv4 and IPv6 address (dual stack).
  std::string listen_address = "0.0.0.0";
  int port = 29500;  // 0 picks a free port
  wire::StoreLimits limits;
  // Authenticated connections (and all of them without a token).
  uint64_t max_connections = 16384;
  // With a token: connections still authenticating, counted apart.
  uint64_t max_unauthenticated_connections = 128;
  // With a token: how long a connection may take to authenticate.
  absl::Duration auth_timeout = absl::Seconds(10);
  uint64_t max_total_bytes = uint64_t{4} << 30;
  // Past this many unsent reply bytes a connection is not read further.
  uint64_t max_output_bytes = 64 << 20;
  // Largest single reply (MULTI_GET, GET of an appended value, LIST_KEYS,
  // GET_WAIT_FOR, QUEUE_POP...). Its size is computed before it is built; a
  // larger one fails that request alone (the connection is closed, a native
  // client told why first).
  uint64_t max_reply_bytes = 256 << 20;
  // Memory of all connections together (not the data, see max_total_bytes):
  // input buffers, charged as soon as a request's header declares its
  // lengths; parked waits' key lists; unsent replies. A request that would
  // exceed it fails alone, before its bytes are buffered.
  uint64_t memory_budget_bytes = uint64_t{1} << 30;
  // One connection's share of it: its buffered (declared) request plus its
  // parked wait. Replies are bounded by max_reply_bytes instead.
  uint64_t max_connection_bytes = 128 << 20;
  // A request charged more than 64 KiB of the budget while it arrives must
  // arrive within request_grace plus its size at min_request_rate bytes a
  // second, else its connection is closed: clients that declare large
  // requests and then go silent (or trickle) cannot hold the budget.
  absl::Duration request_grace = absl::Seconds(10);
  uint64_t min_request_rate = 1 << 20;
  // Non-empty: clients must prove they hold this token (native handshake), or
  // come from `allow_unauthenticated`. Never logged, never sent.
  std::string token;
  CidrSet allow_unauthenticated;
  // Non-empty: durable store (write-ahead log) in this directory.
  std::string state_dir;
  bool fsync = false;
  // Start on a corrupt log: keep it aside and load what verifies (StoreLog).
  bool recover = false;
};

class StoreServer {
 public:
  using TimerId = uint64_t;

  // What a posted task may use; valid only during the task.
  class Loop {
   public:
    virtual ~Loop() = default;
    virtual KvStore& kv() = 0;
    // Runs `fn` on the loop at `deadline` (or at shutdown) unless cancelled.
    virtual TimerId AddTimer(absl::Time deadline, std::function<void()> fn) = 0;
    virtual void CancelTimer(TimerId id) = 0;
    // Runs `fn` after this iteration's log flush (acknowledge durable writes).
    virtual void AfterFlush(std::function<void()> fn) = 0;
    // In an AfterFlush callback: how this iteration's flush went. Not OK
    // means its writes were rolled back: fail the call with it if its result
    // depended on them (it wrote, or read what ReadsUnlogged/HasUnlogged
    // said was unlogged when it ran); other results still stand.
    virtual absl::Status flush_status() const = 0;
    // Whether a result that reads `keys` now may rest on a write of this
    // iteration not in the log yet. False for keys untouched since the last
    // flush: they read durable state, which a failed flush keeps.
    virtual bool ReadsUnlogged(const std::vector<std::string>& keys) const = 0;
    // Whether any write of this iteration is unlogged (for results that
    // count or list every key, and waits released by a write).
    virtual bool HasUnlogged() const = 0;
    // OK, or why writes are refused now (the durability log fails): check
    // before mutating, so a refused write never touches the store.
    virtual absl::Status writable() const = 0;
    // True while the server shuts down (timers then fire early).
    virtual bool stopping() const = 0;
  };

  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Closes every connection and stops the loop. Idempotent.
  void Stop();

  int port() const { return port_; }
  struct Stats {
    int64_t keys = 0;
    int64_t connections = 0;
    uint64_t bytes = 0;
    uint64_t refused_connections = 0;  // past max_connections
    int64_t unauthenticated_connections = 0;
    uint64_t refused_unauthenticated = 0;   // past max_unauthenticated_connections
    uint64_t replaced_unauthenticated = 0;  // the oldest one, closed for a new one
    uint64_t auth_timeouts = 0;
    // Why the durability log cannot be written ("" when it can); while set,
    // writes are refused.
    std::string log_error;
    uint64_t memory_bytes = 0;        // charged to memory_budget_bytes now
    uint64_t refused_for_memory = 0;  // requests failed by a memory limit
    // Loop iterations that used more than 10 ms of the loop thread's CPU
    // (each stalled every client; each is also logged), and the most CPU
    // one iteration has used.
    uint64_t slow_iterations = 0;
    absl::Duration max_iteration_cpu;
  };
  Stats stats() const;
  // Requests by operation and their service time (see StoreMetrics).
  const StoreMetrics& metrics() const;

  // Runs `task` on the loop thread; false if the server has stopped.
  bool Post(std::function<void(Loop&)> task);

 private:
  class Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// On the loop thread: parks a call until every key of `keys` exists. Runs
// `ready` once they do (at once if they already do), or `expired` at
// `timeout` (InfiniteDuration: never) with DEADLINE_EXCEEDED naming the
// missing keys ("store wait timed out after 2s; missing keys: a, b"), or
// with UNAVAILABLE when the server stops first. Exactly one of them runs,
// on the loop thread. What every front-end that blocks until keys exist
// uses (StoreService's gRPC calls, LocalStore).
void WhenPresent(StoreServer::Loop& loop, std::vector<std::string> keys, absl::Duration timeout,
                 std::function<void()> ready, std::function<void(absl::Status)> expired);

// Why a key WhenPresent saw has no value to read: it exists only as a queue
// (QUEUE_PUSH), or, of several awaited keys, it was deleted while the others
// were awaited (NOT_FOUND, naming the key).
absl::Status NoValue(const std::string& key);

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_SERVER_H_
