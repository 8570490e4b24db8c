#include "backends/shm/p2p.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"

namespace muster {

P2PEngine::P2PEngine(GroupSegment* segment, int rank, std::string group_name,
                     std::vector<int> global_ranks)
    : segment_(segment),
      rank_(rank),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)) {
  if (global_ranks_.size() != static_cast<size_t>(segment_->nranks())) {
    global_ranks_.resize(segment_->nranks());
    for (int i = 0; i < segment_->nranks(); ++i) global_ranks_[i] = i;
  }
}

absl::Status P2PEngine::Validate(const P2POp& op) const {
  if (op.peer < 0 || op.peer >= segment_->nranks()) {
    return absl::InvalidArgumentError(absl::StrCat(op.send ? "send to" : "recv from", " rank ",
                                                   op.peer, ": outside group '", group_name_,
                                                   "' of size ", segment_->nranks()));
  }
  if (op.peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.send ? "send to" : "recv from", " rank ", op.peer,
                     ": a rank cannot send to or receive from itself"));
  }
  if (op.data == nullptr && op.bytes > 0) return absl::InvalidArgumentError("null buffer");
  return absl::OkStatus();
}

uint64_t P2PEngine::Write(MailboxHeader& box, char* ring, const char* src, uint64_t n) {
  uint64_t cap = segment_->mailbox_bytes();
  uint64_t w = box.written.load(std::memory_order_relaxed);
  uint64_t r = box.read.load(std::memory_order_acquire);
  uint64_t room = std::min(n, cap - (w - r));
  uint64_t pos = w % cap;
  uint64_t first = std::min(room, cap - pos);
  std::memcpy(ring + pos, src, first);
  std::memcpy(ring, src + first, room - first);
  if (room > 0) box.written.store(w + room, std::memory_order_release);
  return room;
}

uint64_t P2PEngine::Read(MailboxHeader& box, char* ring, char* dst, uint64_t n) {
  uint64_t cap = segment_->mailbox_bytes();
  uint64_t r = box.read.load(std::memory_order_relaxed);
  uint64_t w = box.written.load(std::memory_order_acquire);
  uint64_t avail = std::min(n, w - r);
  uint64_t pos = r % cap;
  uint64_t first = std::min(avail, cap - pos);
  std::memcpy(dst, ring + pos, first);
  std::memcpy(dst + first, ring, avail - first);
  if (avail > 0) box.read.store(r + avail, std::memory_order_release);
  return avail;
}

void P2PEngine::Fail(P2POp& op, absl::Status status, bool abort_group) {
  op.finished = true;
  op.status = status;
  if (abort_group) segment_->Abort(std::string(status.message()));
}

bool P2PEngine::Step(P2POp& op) {
  if (segment_->locally_aborted()) {
    absl::Status local = segment_->local_abort_status();
    Fail(op,
         absl::Status(local.code(), absl::StrCat(op.send ? "send to" : "recv from", " rank ",
                                                 global_ranks_[op.peer], " on group '", group_name_,
                                                 "': ", local.message())),
         false);
    return true;
  }
  if (segment_->aborted()) {
    Fail(op,
         segment_->AbortStatus(absl::StrCat(op.send ? "send to" : "recv from", " rank ",
                                            global_ranks_[op.peer], " on group '", group_name_,
                                            "' aborted")),
         false);
    return true;
  }
  int from = op.send ? rank_ : op.peer;
  int to = op.send ? op.peer : rank_;
  MailboxHeader& box = segment_->mailbox(from, to);
  char* ring = segment_->mailbox_data(from, to);
  uint64_t moved = 0;
  if (op.frame_done < sizeof(op.frame)) {
    if (op.send && op.frame_done == 0) {
      std::memcpy(op.frame, &op.tag, 8);
      std::memcpy(op.frame + 8, &op.bytes, 8);
    }
    uint64_t n = op.send ? Write(box, ring, op.frame + op.frame_done, 16 - op.frame_done)
                         : Read(box, ring, op.frame + op.frame_done, 16 - op.frame_done);
    op.frame_done += n;
    moved += n;
    if (op.frame_done < 16) return moved > 0;
    if (!op.send) {
      uint64_t tag, bytes;
      std::memcpy(&tag, op.frame, 8);
      std::memcpy(&bytes, op.frame + 8, 8);
      if (tag != op.tag) {
        Fail(op,
             absl::FailedPreconditionError(
                 absl::StrCat("recv from rank ", global_ranks_[op.peer], " on group '", group_name_,
                              "' expected tag ", op.tag, " but the next message has tag ", tag,
                              " (messages between two ranks arrive in order)")),
             true);
        return true;
      }
      if (bytes != op.bytes) {
        Fail(op,
             absl::InvalidArgumentError(absl::StrCat(
                 "recv from rank ", global_ranks_[op.peer], " on group '", group_name_,
                 "' with tag ", op.tag, ": buffer has ", op.bytes, " bytes, message has ", bytes)),
             true);
        return true;
      }
    }
  }
  uint64_t n = op.send ? Write(box, ring, op.data + op.done, op.bytes - op.done)
                       : Read(box, ring, op.data + op.done, op.bytes - op.done);
  op.done += n;
  moved += n;
  if (op.done == op.bytes) {
    op.finished = true;
    op.status = absl::OkStatus();
  }
  return moved > 0 || op.finished;
}

bool P2PEngine::Progress(std::vector<P2POp*>& ops) {
  bool any = false;
  // Only the oldest unfinished op per (direction, peer) may move bytes.
  std::map<std::pair<bool, int>, bool> busy;
  for (P2POp* op : ops) {
    if (op->finished) continue;
    auto key = std::make_pair(op->send, op->peer);
    if (busy[key]) continue;
    busy[key] = true;
    if (Step(*op)) any = true;
    if (!op->finished && absl::Now() > op->deadline) {
      Fail(*op,
           absl::DeadlineExceededError(absl::StrCat(
               op->send ? "send to" : "recv from", " rank ", global_ranks_[op->peer], " on group '",
               group_name_, "' timed out (", op->done, " of ", op->bytes, " bytes moved)")),
           true);
      any = true;
    }
  }
  if (any) segment_->Wake();
  return any;
}

void P2PEngine::Run(std::vector<P2POp*> ops) {
  while (true) {
    uint32_t epoch = segment_->header().epoch.load(std::memory_order_acquire);
    bool moved = Progress(ops);
    bool all = std::all_of(ops.begin(), ops.end(), [](P2POp* o) { return o->finished; });
    if (all) return;
    if (!moved) segment_->Sleep(epoch, 1000);
  }
}

}  // namespace muster
