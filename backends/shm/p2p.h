// Point-to-point messages between the ranks of a node-local group, through
// the segment's mailboxes (one byte ring per ordered pair of ranks).
//
// A message is a frame: u64 tag, u64 length, then the bytes. Messages from
// one rank to another arrive in the order they were sent; a receive must
// name the tag (and size) of the next message from that peer, else it fails
// with FAILED_PRECONDITION / INVALID_ARGUMENT and the group is aborted (the
// pair's stream can no longer be trusted). Rings are smaller than messages
// may be, so P2PEngine makes progress on many operations at once: a rank
// that sends a large message to a peer while receiving one from it never
// deadlocks.
//
// Thread-compatible: one thread drives an engine (the SDK's p2p thread).
#ifndef MUSTER_BACKENDS_SHM_P2P_H_
#define MUSTER_BACKENDS_SHM_P2P_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/shm/segment.h"

namespace muster {

struct P2POp {
  bool send = true;
  int peer = -1;  // group rank
  uint64_t tag = 0;
  char* data = nullptr;
  uint64_t bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
  // Progress (owned by the engine).
  uint64_t frame_done = 0;  // bytes of the 16-byte frame header moved
  char frame[16] = {};
  uint64_t done = 0;
  bool finished = false;
  absl::Status status;
};

class P2PEngine {
 public:
  P2PEngine(GroupSegment* segment, int rank, std::string group_name, std::vector<int> global_ranks);

  // Checks an operation before it is queued (peer range, not self).
  absl::Status Validate(const P2POp& op) const;
  // Moves as many bytes as possible for every unfinished op, without
  // blocking. Ops to/from the same peer in the same direction progress in
  // order. Sets finished/status; returns true if anything moved.
  bool Progress(std::vector<P2POp*>& ops);
  // Runs `ops` to completion (each ends OK or with its error).
  void Run(std::vector<P2POp*> ops);
  GroupSegment* segment() { return segment_; }

 private:
  // Moves bytes between a user buffer and a ring; returns bytes moved.
  uint64_t Write(MailboxHeader& box, char* ring, const char* src, uint64_t n);
  uint64_t Read(MailboxHeader& box, char* ring, char* dst, uint64_t n);
  bool Step(P2POp& op);
  void Fail(P2POp& op, absl::Status status, bool abort_group);

  GroupSegment* segment_;
  int rank_;
  std::string group_name_;
  std::vector<int> global_ranks_;
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_P2P_H_
