// GlooP2P: point-to-point messages (c10d's send / recv / isend / irecv)
// between the members of a group spanning nodes, over the TCP pairs of the
// group's Gloo mesh (unbound buffers, no copy of the user's buffer).
//
// Semantics (those of c10d's gloo backend): a message is matched by
// (peer, tag); messages from one rank to another with the same tag arrive
// in the order they were sent; a receive must have the size of the message
// it matches, else both sides fail with INVALID_ARGUMENT naming both sizes
// (and no data moves). Tags are below 2^56.
//
// Protocol: each operation first exchanges sizes with its match (8 bytes
// each way: the sender's size on one slot, the receiver's on another, both
// per tag); the data (on a third slot) is posted once the sizes agree, in
// the order the operations were posted per (peer, tag, direction), so a
// mismatch never reaches Gloo (whose I/O thread aborts the process when a
// message is longer than its receive). Operations are posted to Gloo at
// once and progress on Gloo's own I/O thread, so two ranks that send each
// other large messages before receiving never deadlock. Each posted operation is waited for on a
// waiter thread of its own (threads are reused; there are as many as operations outstanding at
// once), so an operation's completion is reported as soon as it happens
// whatever else is pending.
//
// Receive from any source (PostRecvAnySource): the size exchange's receive
// is posted to every other member (Gloo's recv from any rank); the first
// sender's size decides the source, and only then does the receive send its
// size and post its data, like a receive from that peer. To keep the order
// per (peer, tag), receives with a tag posted while a receive from any
// source with that tag has not learnt its sender wait (unposted to Gloo)
// until it has.
//
// Failures: a peer that dies or closes its connection fails the pending
// operations with ABORTED; an operation still pending at its deadline fails
// with DEADLINE_EXCEEDED, and Gloo then fails every other operation pending
// on the mesh (its pairs are unusable after a timeout). The destructor
// cancels pending operations (CANCELLED) and joins the waiter threads;
// Abort (the rank lost its musterd) cancels them too, at once.
//
// Thread-safe: Post() may be called from any thread; `done` callbacks run
// on waiter threads (or on the caller's thread if posting fails).
#ifndef MUSTER_BACKENDS_GLOO_GLOO_P2P_H_
#define MUSTER_BACKENDS_GLOO_GLOO_P2P_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace muster {

class GlooP2P {
 public:
  using Done = std::function<void(absl::Status)>;
  // With the group rank of the sender (receives from any source).
  using DoneFrom = std::function<void(absl::Status, int source)>;
  static constexpr uint64_t kMaxTag = (uint64_t{1} << 56) - 1;
  static constexpr int kAnySource = -1;

  // `context` is the group's full mesh (rank i = group rank i);
  // `global_ranks[i]` names group rank i in messages.
  GlooP2P(std::shared_ptr<gloo::Context> context, std::string group_name,
          std::vector<int> global_ranks);
  ~GlooP2P();
  GlooP2P(const GlooP2P&) = delete;
  GlooP2P& operator=(const GlooP2P&) = delete;

  // INVALID_ARGUMENT for a peer outside the group, oneself, or a tag above
  // kMaxTag.
  absl::Status Validate(int peer, uint64_t tag) const;
  // Posts a send (or receive) of `bytes` bytes at `data` to (from) group
  // rank `peer`; `done` runs once with the result. `data` must stay valid
  // until then.
  void Post(bool send, int peer, uint64_t tag, void* data, size_t bytes, absl::Time deadline,
            Done done);
  // Receives the first message with `tag` from any member; `done` gets
  // the sender's group rank (-1 if it failed before one was known).
  void PostRecvAnySource(uint64_t tag, void* data, size_t bytes, absl::Time deadline,
                         DoneFrom done);
  // Every pending and later operation fails with CANCELLED at once (the
  // caller refuses new ones and says why). Any thread.
  void Abort();

 private:
  struct Pending {
    bool send = true;
    int peer = -1;     // kAnySource until the sender is known
    bool any = false;  // a receive from any source
    uint64_t tag = 0;
    size_t bytes = 0;
    absl::Time deadline;
    // sizes[0]: this side's size (sent), sizes[1]: the match's (received).
    uint64_t sizes[2] = {0, 0};
    std::unique_ptr<gloo::transport::UnboundBuffer> header;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    DoneFrom done;
    // Guarded by mu_: the size exchange was posted to Gloo (false while it
    // waits behind a receive from any source with the same tag).
    bool posted = false;
    // Guarded by mu_: the sizes arrived (or the exchange failed); the data
    // was posted (or will not be: `status` says why).
    bool header_done = false;
    bool data_posted = false;
    absl::Status status;
  };
  // (peer, tag, send): operations whose data is not posted yet, in order.
  using Key = std::tuple<int, uint64_t, bool>;
  void PostOp(std::shared_ptr<Pending> op, void* data);
  // Posts the size exchange of `op` to Gloo; false (and op->status set) if
  // Gloo refused.
  bool PostHeader(const std::shared_ptr<Pending>& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A receive from any source with `tag` learnt its sender (or failed):
  // posts the receives that waited behind it, up to the next one from any
  // source.
  void Resolved(uint64_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Waiter();
  absl::Status Wait(const std::shared_ptr<Pending>& op);
  // Posts the data of the operations at the front of `key`'s queue whose
  // sizes have arrived.
  void PostReady(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Describe(const Pending& op) const;

  std::shared_ptr<gloo::Context> context_;
  std::string group_name_;
  std::vector<int> global_ranks_;

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);
  // Operations a waiter is blocked on (aborted by the destructor).
  std::list<std::shared_ptr<Pending>> waiting_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::deque<std::shared_ptr<Pending>>> unposted_ ABSL_GUARDED_BY(mu_);
  // By tag: receives waiting behind a receive from any source that has not
  // learnt its sender (the front one is that receive, posted).
  std::map<uint64_t, std::deque<std::shared_ptr<Pending>>> behind_any_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_GLOO_GLOO_P2P_H_
