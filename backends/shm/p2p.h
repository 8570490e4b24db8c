// Point-to-point messages between the ranks of a node-local group, through
// the segment's mailboxes (one byte ring per ordered pair of ranks).
//
// Semantics (c10d's): a receive matches a message by (peer, tag), or by tag
// alone when it receives from any source (peer kAnySource; the op's
// `source` then says who sent it). Messages from one rank to another with
// the same tag are received in the order they were sent; messages with
// different tags may be received in any order. A receive whose size
// differs from its matching message fails with INVALID_ARGUMENT naming both
// sizes (the message is dropped, the group stays usable). An operation still
// pending at its deadline fails with DEADLINE_EXCEEDED and aborts the group.
//
// Protocol: a message is a frame on the sender's ring to the receiver: u64
// tag, u64 length, then the bytes; a send completes once its bytes are in
// the ring (or read from it). The receiver reads every ring it has data on
// while it has operations pending: a frame whose receive is posted goes
// straight into that receive's buffer (the oldest posted receive that
// matches it); a frame nobody waits for yet is stashed in this process's
// memory, up to kMaxStashBytes (and kMaxStashMessages) in all, and handed to the first matching
// receive posted later. A message that does not fit in the stash stays in
// the ring until its receive is posted, holding back later messages from
// the same sender (as in MPI, very large unmatched messages need their
// receive posted before the sender's later messages can be received).
// Rings are smaller than messages may be, so P2PEngine makes progress on
// many operations at once: a rank that sends a large message to a peer
// while receiving one from it never deadlocks.
//
// Thread-compatible: one thread drives an engine (ShmPointToPoint's).
// ShmPointToPoint, the group's PointToPoint over an engine, is thread-safe:
// its own thread progresses every posted operation together.
#ifndef MUSTER_BACKENDS_SHM_P2P_H_
#define MUSTER_BACKENDS_SHM_P2P_H_

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/communicator.h"
#include "backends/shm/segment.h"

namespace muster {

struct P2POp {
  // A receive's peer that matches a message from any member.
  static constexpr int kAnySource = PointToPoint::kAnySource;

  bool send = true;
  int peer = -1;  // group rank; receives: or kAnySource
  uint64_t tag = 0;
  char* data = nullptr;
  uint64_t bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
  // Progress (owned by the engine).
  uint64_t frame_done = 0;  // sends: bytes of the 16-byte frame header moved
  char frame[16] = {};
  uint64_t done = 0;
  bool matched = false;  // receives: a message is assigned to this op
  bool finished = false;
  absl::Status status;
  int source = -1;  // receives: the sender's group rank, once matched
};

class P2PEngine {
 public:
  // Unmatched messages this process buffers at most (all peers together).
  static constexpr uint64_t kMaxStashBytes = uint64_t{64} << 20;
  // And at most this many (empty messages count too).
  static constexpr size_t kMaxStashMessages = 65536;

  P2PEngine(GroupSegment* segment, int rank, std::string group_name, std::vector<int> global_ranks);

  // Checks an operation before it is queued (peer range, not self).
  absl::Status Validate(const P2POp& op) const;
  // Moves as many bytes as possible for every unfinished op, without
  // blocking. `ops` are in the order they were posted (receives match in
  // that order) and stay valid until finished; ops to the same peer are
  // sent in order. Sets finished/status (and a receive's source); returns
  // true if anything moved.
  bool Progress(std::vector<P2POp*>& ops);
  // Runs `ops` to completion (each ends OK or with its error).
  void Run(std::vector<P2POp*> ops);
  GroupSegment* segment() { return segment_; }
  // Bytes of unmatched messages held in this process.
  uint64_t stashed_bytes() const { return stashed_bytes_; }

 private:
  // A message that arrived before its receive was posted.
  struct Stashed {
    int peer;
    uint64_t tag;
    std::string data;
    bool complete = false;
    P2POp* claimed = nullptr;  // the receive it was handed to
  };
  // This rank's reading position in the ring from one peer.
  struct Incoming {
    char frame[16] = {};
    uint64_t frame_done = 0;
    uint64_t tag = 0, bytes = 0, done = 0;
    bool in_message = false;   // the frame is read; its bytes follow
    P2POp* target = nullptr;   // matched receive: the bytes go to its buffer
    Stashed* stash = nullptr;  // or into the stash
    bool discard = false;      // or nowhere (its receive failed)
  };
  // Moves bytes between a user buffer and a ring; returns bytes moved.
  uint64_t Write(MailboxHeader& box, char* ring, const char* src, uint64_t n);
  uint64_t Read(MailboxHeader& box, char* ring, char* dst, uint64_t n);
  bool StepSend(P2POp& op);
  // Reads what peer `from` has sent; returns true if anything moved.
  bool StepIncoming(int from, std::vector<P2POp*>& ops);
  // Assigns `in`'s message to the oldest matching posted receive, or the
  // stash; false if it must stay in the ring for now.
  bool Place(int from, Incoming& in, std::vector<P2POp*>& ops);
  // A stashed message completes (or was claimed complete) for `op`.
  void Deliver(Stashed& s, P2POp& op);
  bool Matches(const P2POp& op, int from, uint64_t tag) const;
  void Fail(P2POp& op, absl::Status status, bool abort_group);
  // The receive `op` no longer takes bytes: whatever streams into it is
  // dropped, a claimed stash is released.
  void Detach(P2POp& op);
  std::string Describe(const P2POp& op) const;

  GroupSegment* segment_;
  int rank_;
  std::string group_name_;
  std::vector<int> global_ranks_;
  std::vector<Incoming> incoming_;  // by sender's group rank
  std::list<Stashed> stash_;        // in arrival order
  uint64_t stashed_bytes_ = 0;
};

class ShmPointToPoint final : public PointToPoint {
 public:
  // `segment` outlives this object.
  ShmPointToPoint(GroupSegment* segment, int rank, std::string group_name,
                  std::vector<int> global_ranks);
  // Pending operations fail CANCELLED.
  ~ShmPointToPoint() override;

  absl::Status Validate(bool send, int peer, uint64_t tag) const override;
  void Post(bool send, int peer, uint64_t tag, void* data, size_t bytes, absl::Time deadline,
            Done done) override;
  void Abort(const absl::Status& reason) override;

 private:
  struct Pending {
    P2POp op;
    Done done;
  };
  void Run();

  const std::string group_name_;
  GroupSegment* segment_;
  P2PEngine engine_;  // driven by thread_ only
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Pending>> new_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Post
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_P2P_H_
