// StoreDispatcher: runs one parsed StoreRequest against a KvStore and builds
// its reply bytes — the single copy of the store's command semantics, used by
// StoreServer for every connection and by the protocol fuzzer
// (request_parser_fuzzer.cc), so the fuzzed code is the served code.
//
// Every reply whose size depends on the data (GET, COMPARE_SET, MULTI_GET,
// LIST_KEYS, QUEUE_POP, a finished GET_WAIT_FOR or a timed-out WAIT_FOR) is
// measured before it is built: larger than max_reply_bytes fails the request
// alone (Context::RefuseForMemory), else Context::ReserveReply admits it
// against the caller's memory budget. Invariant: the bytes a request appends
// to Context::Reply() never exceed what it reserved (or kSmallReplyBytes for
// the fixed-size replies that reserve nothing).
//
// What stays with the caller, through Context: where replies go, closing a
// connection, parking a WAIT (registration, timers, memory), the handshake
// and the durability gate (IsWrite tells which requests it applies to).
//
// Not thread-safe: used on the thread that owns the KvStore (the store
// server's loop thread).
#ifndef MUSTER_DAEMON_STORE_STORE_DISPATCHER_H_
#define MUSTER_DAEMON_STORE_STORE_DISPATCHER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/store_wire.h"
#include "daemon/store/kv_store.h"
#include "daemon/store/request_parser.h"

namespace muster {

enum class StoreWaitKind { kNone, kTorchWait, kWaitFor, kGetWaitFor };

class StoreDispatcher {
 public:
  // The most a reply that reserves nothing may append (status byte + i64).
  static constexpr uint64_t kSmallReplyBytes = 16;

  // What executing a request needs from its connection; one per request (or
  // per finished wait), valid for that call.
  class Context {
   public:
    virtual ~Context() = default;
    virtual wire::Dialect dialect() const = 0;
    // Before a reply of `bytes` (status byte included) is built: true if the
    // memory budget admits it. False: the context has failed the request.
    virtual bool ReserveReply(uint64_t bytes, wire::Op op) = 0;
    // Fails the request for a memory limit (the connection is closed).
    virtual void RefuseForMemory(std::string why) = 0;
    // Starts a reply and returns the buffer to append it to (a native
    // reply's status byte is already there).
    virtual std::string& Reply() = 0;
    // Fails the request (e.g. the store is full): the connection is closed,
    // a native client told why.
    virtual void Fail(const absl::Status& why) = 0;
    // WAIT, WAIT_FOR, GET_WAIT_FOR: park until `keys` exist (or `timeout_ms`
    // passes, when > 0 for WAIT_FOR kinds), then call CompleteWait.
    // `key_bytes`: the keys' total size if the parser counted it, else 0.
    virtual void StartWait(StoreWaitKind kind, std::vector<std::string> keys, uint64_t key_bytes,
                           int64_t timeout_ms) = 0;
    // CANCEL_WAIT: drop the parked wait, if any.
    virtual void CancelWait() = 0;
  };

  StoreDispatcher(KvStore* kv, uint64_t max_reply_bytes)
      : kv_(kv), max_reply_bytes_(max_reply_bytes) {}

  // Runs `req` (an ordinary request: the handshake is the caller's). May
  // move req.keys into Context::StartWait.
  // May move values out of `req` (a SET's value into the store).
  void Execute(StoreRequest& req, Context& ctx);

  // Builds the reply of a wait that ended: satisfied, or `timed_out` (the
  // native kinds then report the keys still missing; a torch WAIT has no
  // timeout of its own and answers STOP_WAITING either way).
  void CompleteWait(StoreWaitKind kind, const std::vector<std::string>& keys, bool timed_out,
                    Context& ctx);

  // Requests that change the store (refused while the durability log fails).
  static bool IsWrite(wire::Op op);

  // The reply size of a list of values (MULTI_GET, GET_WAIT_FOR).
  uint64_t ValuesReplyBytes(const std::vector<std::string>& keys) const;

 private:
  // Checks max_reply_bytes, then the budget; `bytes` is the reply body.
  bool Admit(uint64_t bytes, wire::Op op, Context& ctx);
  void Reject(const absl::Status& s, Context& ctx) { ctx.Fail(s); }

  KvStore* kv_;
  uint64_t max_reply_bytes_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_DISPATCHER_H_
