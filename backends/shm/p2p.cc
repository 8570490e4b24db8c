#include "backends/shm/p2p.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muster {

P2PEngine::P2PEngine(GroupSegment* segment, int rank, std::string group_name,
                     std::vector<int> global_ranks)
    : segment_(segment),
      rank_(rank),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)),
      incoming_(segment->nranks()) {
  if (global_ranks_.size() != static_cast<size_t>(segment_->nranks())) {
    global_ranks_.resize(segment_->nranks());
    for (int i = 0; i < segment_->nranks(); ++i) global_ranks_[i] = i;
  }
}

std::string P2PEngine::Describe(const P2POp& op) const {
  if (!op.send && op.peer == P2POp::kAnySource) return "recv from any rank";
  return absl::StrCat(op.send ? "send to" : "recv from", " rank ", global_ranks_[op.peer]);
}

absl::Status P2PEngine::Validate(const P2POp& op) const {
  if (!op.send && op.peer == P2POp::kAnySource) {
    if (op.data == nullptr && op.bytes > 0) return absl::InvalidArgumentError("null buffer");
    return absl::OkStatus();
  }
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
  // The counters are the group's ranks' to write: clamped, so that a
  // scribbled one garbles this job's messages but no copy leaves the ring.
  uint64_t room = std::min(n, cap - std::min(w - r, cap));
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
  uint64_t avail = std::min({n, w - r, cap});  // clamped as in Write
  uint64_t pos = r % cap;
  uint64_t first = std::min(avail, cap - pos);
  if (dst != nullptr) {
    std::memcpy(dst, ring + pos, first);
    std::memcpy(dst + first, ring, avail - first);
  }
  if (avail > 0) box.read.store(r + avail, std::memory_order_release);
  return avail;
}

void P2PEngine::Detach(P2POp& op) {
  if (op.send) return;
  for (Incoming& in : incoming_) {
    if (in.target == &op) {
      in.target = nullptr;
      in.discard = true;
    }
  }
  for (Stashed& s : stash_) {
    if (s.claimed == &op) s.claimed = nullptr;
  }
}

void P2PEngine::Fail(P2POp& op, absl::Status status, bool abort_group) {
  Detach(op);
  op.finished = true;
  op.status = status;
  if (abort_group) segment_->Abort(std::string(status.message()));
}

bool P2PEngine::Matches(const P2POp& op, int from, uint64_t tag) const {
  return !op.send && !op.finished && !op.matched && op.tag == tag &&
         (op.peer == from || op.peer == P2POp::kAnySource);
}

void P2PEngine::Deliver(Stashed& s, P2POp& op) {
  op.source = s.peer;
  if (op.bytes != s.data.size()) {
    Fail(op,
         absl::InvalidArgumentError(absl::StrCat(
             "recv from rank ", global_ranks_[s.peer], " on group '", group_name_, "' with tag ",
             s.tag, ": buffer has ", op.bytes, " bytes, message has ", s.data.size())),
         false);
  } else {
    if (op.bytes > 0) std::memcpy(op.data, s.data.data(), op.bytes);
    op.done = op.bytes;
    op.finished = true;
    op.status = absl::OkStatus();
  }
  stashed_bytes_ -= s.data.size();
  for (auto it = stash_.begin(); it != stash_.end(); ++it) {
    if (&*it == &s) {
      stash_.erase(it);
      break;
    }
  }
}

bool P2PEngine::Place(int from, Incoming& in, std::vector<P2POp*>& ops) {
  for (P2POp* op : ops) {
    if (!Matches(*op, from, in.tag)) continue;
    op->matched = true;
    op->source = from;
    if (op->bytes != in.bytes) {
      Fail(*op,
           absl::InvalidArgumentError(absl::StrCat(
               "recv from rank ", global_ranks_[from], " on group '", group_name_, "' with tag ",
               in.tag, ": buffer has ", op->bytes, " bytes, message has ", in.bytes)),
           false);
      in.discard = true;  // dropped: the stream stays in step
    } else {
      in.target = op;
    }
    return true;
  }
  if (stashed_bytes_ + in.bytes > kMaxStashBytes || stash_.size() >= kMaxStashMessages) {
    return false;
  }
  stash_.push_back(Stashed{from, in.tag, std::string(in.bytes, '\0')});
  stashed_bytes_ += in.bytes;
  in.stash = &stash_.back();
  return true;
}

bool P2PEngine::StepIncoming(int from, std::vector<P2POp*>& ops) {
  Incoming& in = incoming_[from];
  MailboxHeader& box = segment_->mailbox(from, rank_);
  char* ring = segment_->mailbox_data(from, rank_);
  bool moved = false;
  // At most a ring's worth per call, so deadlines are checked in between
  // even when the peer's counter claims more than was ever written.
  uint64_t budget = segment_->mailbox_bytes();
  while (budget > 0) {
    if (!in.in_message) {
      uint64_t n = Read(box, ring, in.frame + in.frame_done, sizeof(in.frame) - in.frame_done);
      budget -= std::min(budget, n);
      in.frame_done += n;
      moved |= n > 0;
      if (in.frame_done < sizeof(in.frame)) return moved;
      std::memcpy(&in.tag, in.frame, 8);
      std::memcpy(&in.bytes, in.frame + 8, 8);
      in.done = 0;
      in.in_message = true;
      in.target = nullptr;
      in.stash = nullptr;
      in.discard = false;
    }
    if (in.target == nullptr && in.stash == nullptr && !in.discard) {
      if (!Place(from, in, ops)) return moved;  // waits in the ring for its receive
      moved = true;
    }
    char* dst = in.target != nullptr  ? in.target->data
                : in.stash != nullptr ? in.stash->data.data()
                                      : nullptr;  // discarded
    uint64_t n = Read(box, ring, dst == nullptr ? nullptr : dst + in.done,
                      std::min(in.bytes - in.done, budget));
    budget -= std::min(budget, n);
    in.done += n;
    moved |= n > 0;
    if (in.target != nullptr) in.target->done = in.done;
    if (in.done < in.bytes) return moved;
    if (in.target != nullptr) {
      in.target->finished = true;
      in.target->status = absl::OkStatus();
    } else if (in.stash != nullptr) {
      in.stash->complete = true;
      if (in.stash->claimed != nullptr) Deliver(*in.stash, *in.stash->claimed);
    }
    in = Incoming();
    moved = true;
  }
  return moved;
}

bool P2PEngine::StepSend(P2POp& op) {
  MailboxHeader& box = segment_->mailbox(rank_, op.peer);
  char* ring = segment_->mailbox_data(rank_, op.peer);
  uint64_t moved = 0;
  if (op.frame_done < sizeof(op.frame)) {
    if (op.frame_done == 0) {
      std::memcpy(op.frame, &op.tag, 8);
      std::memcpy(op.frame + 8, &op.bytes, 8);
    }
    uint64_t n = Write(box, ring, op.frame + op.frame_done, sizeof(op.frame) - op.frame_done);
    op.frame_done += n;
    moved += n;
    if (op.frame_done < sizeof(op.frame)) return moved > 0;
  }
  uint64_t n = Write(box, ring, op.data + op.done, op.bytes - op.done);
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
  if (segment_->locally_aborted() || segment_->aborted()) {
    absl::Status local = segment_->local_abort_status();
    for (P2POp* op : ops) {
      if (op->finished) continue;
      std::string where = absl::StrCat(Describe(*op), " on group '", group_name_, "'");
      Fail(*op,
           segment_->locally_aborted()
               ? absl::Status(local.code(), absl::StrCat(where, ": ", local.message()))
               : segment_->AbortStatus(absl::StrCat(where, " aborted")),
           false);
      any = true;
    }
    return any;
  }
  // Receives posted since the last call take stashed messages first (the
  // oldest that matches: per sender and tag, in arrival order).
  for (P2POp* op : ops) {
    if (op->send || op->finished || op->matched) continue;
    for (Stashed& s : stash_) {
      if (s.claimed != nullptr || !Matches(*op, s.peer, s.tag)) continue;
      op->matched = true;
      op->source = s.peer;
      s.claimed = op;
      if (s.complete) Deliver(s, *op);
      any = true;
      break;
    }
  }
  for (int from = 0; from < segment_->nranks(); ++from) {
    if (from != rank_ && StepIncoming(from, ops)) any = true;
  }
  // Only the oldest unfinished send per peer may move bytes.
  std::vector<bool> busy(segment_->nranks(), false);
  for (P2POp* op : ops) {
    if (!op->send || op->finished || busy[op->peer]) continue;
    busy[op->peer] = true;
    if (StepSend(*op)) any = true;
  }
  absl::Time now = absl::Now();
  for (P2POp* op : ops) {
    if (op->finished || now <= op->deadline) continue;
    Fail(*op,
         absl::DeadlineExceededError(absl::StrCat(Describe(*op), " on group '", group_name_,
                                                  "' with tag ", op->tag, " timed out (", op->done,
                                                  " of ", op->bytes, " bytes moved)")),
         true);
    any = true;
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

ShmPointToPoint::ShmPointToPoint(GroupSegment* segment, int rank, std::string group_name,
                                 std::vector<int> global_ranks)
    : group_name_(group_name),
      segment_(segment),
      engine_(segment, rank, std::move(group_name), std::move(global_ranks)) {}

ShmPointToPoint::~ShmPointToPoint() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  segment_->Wake();
  if (thread_.joinable()) thread_.join();
  std::deque<std::unique_ptr<Pending>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(new_);
  }
  for (auto& p : left) {
    p->done(absl::CancelledError(absl::StrCat("group '", group_name_, "' was destroyed")), -1);
  }
}

absl::Status ShmPointToPoint::Validate(bool send, int peer, uint64_t tag) const {
  P2POp op;
  op.send = send;
  op.peer = peer;
  op.tag = tag;
  return engine_.Validate(op);
}

void ShmPointToPoint::Post(bool send, int peer, uint64_t tag, void* data, size_t bytes,
                           absl::Time deadline, Done done) {
  auto p = std::make_unique<Pending>();
  p->op.send = send;
  p->op.peer = peer;
  p->op.tag = tag;
  p->op.data = static_cast<char*>(data);
  p->op.bytes = bytes;
  p->op.deadline = deadline;
  p->done = std::move(done);
  if (absl::Status s = engine_.Validate(p->op); !s.ok()) {
    p->done(s, -1);
    return;
  }
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping) {
      new_.push_back(std::move(p));
      if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    }
  }
  if (stopping) {  // answered outside mu_, as every completion
    p->done(absl::CancelledError(absl::StrCat("group '", group_name_, "' was destroyed")), -1);
    return;
  }
  segment_->Wake();
}

void ShmPointToPoint::Abort(const absl::Status& reason) { segment_->AbortLocally(reason); }

void ShmPointToPoint::Run() {
  std::list<std::unique_ptr<Pending>> active;
  while (true) {
    uint32_t epoch = segment_->header().epoch.load(std::memory_order_acquire);
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      if (active.empty()) {
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !new_.empty(); };
        mu_.Await(absl::Condition(&ready));
      }
      stopping = stopping_;
      while (!stopping && !new_.empty()) {
        active.push_back(std::move(new_.front()));
        new_.pop_front();
      }
    }
    if (stopping) {
      for (auto& p : active) {
        p->done(absl::CancelledError(absl::StrCat("group '", group_name_, "' was destroyed")), -1);
      }
      return;
    }
    std::vector<P2POp*> ops;
    for (auto& p : active) ops.push_back(&p->op);
    bool moved = engine_.Progress(ops);
    for (auto it = active.begin(); it != active.end();) {
      P2POp& op = (*it)->op;
      if (op.finished) {
        (*it)->done(op.status, op.send ? -1 : op.source);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    if (!moved && !active.empty()) segment_->Sleep(epoch, 1000);
  }
}

}  // namespace muster
