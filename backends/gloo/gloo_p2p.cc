#include "backends/gloo/gloo_p2p.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"

namespace muster {
namespace {

// Slots of point-to-point messages: prefixes no Gloo collective uses (they
// use small prefixes in the top byte), then the tag. Data, the sender's size
// (sender -> receiver), the receiver's size (receiver -> sender).
constexpr uint64_t kP2PSlotPrefix = uint64_t{0xE7} << 56;
constexpr uint64_t kSendSizeSlotPrefix = uint64_t{0xE8} << 56;
constexpr uint64_t kRecvSizeSlotPrefix = uint64_t{0xE9} << 56;

std::chrono::milliseconds Left(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left < absl::Milliseconds(1)) left = absl::Milliseconds(1);
  if (left > absl::Hours(24)) left = absl::Hours(24);
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(left));
}

}  // namespace

GlooP2P::GlooP2P(std::shared_ptr<gloo::Context> context, std::string group_name,
                 std::vector<int> global_ranks)
    : context_(std::move(context)),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)) {}

GlooP2P::~GlooP2P() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // A waiter may be in any of its waits (or about to start one): every
    // one of them returns false from now on.
    for (auto& op : waiting_) {
      for (auto* b : {op->header.get(), op->buffer.get()}) {
        b->abortWaitSend();
        b->abortWaitRecv();
      }
    }
    threads.swap(threads_);
    unposted_.clear();
    behind_any_.clear();
  }
  for (auto& t : threads) t.join();
  // Operations never picked up by a waiter.
  std::deque<std::shared_ptr<Pending>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (auto& op : left) {
    op->done(absl::CancelledError(
                 absl::StrCat(Describe(*op), ": group '", group_name_, "' was destroyed")),
             -1);
  }
}

void GlooP2P::Abort() {
  absl::MutexLock lock(&mu_);
  if (aborted_) return;
  aborted_ = true;
  // As in the destructor: every wait of these returns false from now on;
  // operations not picked up yet fail when a waiter takes them.
  for (auto& op : waiting_) {
    for (auto* b : {op->header.get(), op->buffer.get()}) {
      b->abortWaitSend();
      b->abortWaitRecv();
    }
  }
}

std::string GlooP2P::Describe(const Pending& op) const {
  if (op.any && op.peer == kAnySource) {
    return absl::StrCat("recv from any rank (tag ", op.tag, ", ", op.bytes, " bytes)");
  }
  int global = op.peer >= 0 && op.peer < static_cast<int>(global_ranks_.size())
                   ? global_ranks_[op.peer]
                   : op.peer;
  return absl::StrCat(op.send ? "send to" : "recv from", " rank ", global, " (tag ", op.tag, ", ",
                      op.bytes, " bytes)");
}

absl::Status GlooP2P::Validate(int peer, uint64_t tag) const {
  if (peer < 0 || peer >= context_->size) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer, " is outside group '", group_name_, "'"));
  }
  if (peer == context_->rank) {
    return absl::InvalidArgumentError("point-to-point with oneself");
  }
  if (tag > kMaxTag) {
    return absl::InvalidArgumentError(absl::StrCat("tag ", tag, " is above 2^56-1"));
  }
  return absl::OkStatus();
}

void GlooP2P::Post(bool send, int peer, uint64_t tag, void* data, size_t bytes, absl::Time deadline,
                   Done done) {
  auto op = std::make_shared<Pending>();
  op->send = send;
  op->peer = peer;
  op->tag = tag;
  op->bytes = bytes;
  op->deadline = deadline;
  op->done = [done = std::move(done)](absl::Status s, int) { done(std::move(s)); };
  if (absl::Status s = Validate(peer, tag); !s.ok()) {
    op->done(s, -1);
    return;
  }
  PostOp(std::move(op), data);
}

void GlooP2P::PostRecvAnySource(uint64_t tag, void* data, size_t bytes, absl::Time deadline,
                                DoneFrom done) {
  auto op = std::make_shared<Pending>();
  op->send = false;
  op->peer = kAnySource;
  op->any = true;
  op->tag = tag;
  op->bytes = bytes;
  op->deadline = deadline;
  op->done = std::move(done);
  if (tag > kMaxTag) {
    op->done(absl::InvalidArgumentError(absl::StrCat("tag ", tag, " is above 2^56-1")), -1);
    return;
  }
  if (context_->size < 2) {
    op->done(absl::InvalidArgumentError(
                 absl::StrCat("recv from any rank: group '", group_name_, "' has no other member")),
             -1);
    return;
  }
  PostOp(std::move(op), data);
}

bool GlooP2P::PostHeader(const std::shared_ptr<Pending>& op) {
  // Posted under mu_ so that the sizes go out in the order of unposted_.
  // The receive first: once the match has our size, it can send us its.
  try {
    if (op->any) {
      // Our size goes to the sender once we know it (Wait).
      std::vector<int> others;
      for (int i = 0; i < context_->size; ++i) {
        if (i != context_->rank) others.push_back(i);
      }
      op->header->recv(others, kSendSizeSlotPrefix | op->tag, sizeof(uint64_t), sizeof(uint64_t));
    } else {
      uint64_t in = op->send ? kRecvSizeSlotPrefix : kSendSizeSlotPrefix;
      uint64_t out = op->send ? kSendSizeSlotPrefix : kRecvSizeSlotPrefix;
      op->header->recv(op->peer, in | op->tag, sizeof(uint64_t), sizeof(uint64_t));
      op->header->send(op->peer, out | op->tag, 0, sizeof(uint64_t));
      unposted_[Key(op->peer, op->tag, op->send)].push_back(op);
    }
  } catch (const std::exception& e) {
    op->status = absl::AbortedError(
        absl::StrCat(Describe(*op), " on group '", group_name_, "' failed over gloo: ", e.what()));
    op->posted = true;
    return false;
  }
  op->posted = true;
  return true;
}

void GlooP2P::Resolved(uint64_t tag) {
  auto it = behind_any_.find(tag);
  if (it == behind_any_.end()) return;
  auto& waiting = it->second;
  waiting.pop_front();  // the receive from any source that learnt its sender
  while (!waiting.empty()) {
    std::shared_ptr<Pending> next = waiting.front();
    if (PostHeader(next) && next->any) return;  // the next one to wait behind
    waiting.pop_front();
  }
  behind_any_.erase(it);
}

void GlooP2P::PostOp(std::shared_ptr<Pending> op, void* data) {
  op->sizes[0] = op->bytes;
  try {
    op->buffer = context_->createUnboundBuffer(data, op->bytes);
    op->header = context_->createUnboundBuffer(op->sizes, sizeof(op->sizes));
  } catch (const std::exception& e) {
    op->done(absl::AbortedError(absl::StrCat(Describe(*op), " on group '", group_name_,
                                             "' failed over gloo: ", e.what())),
             -1);
    return;
  }
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) {
      failed = absl::CancelledError(
          absl::StrCat(Describe(*op), " on group '", group_name_, "': the group was aborted"));
    } else if (!stopping_) {
      auto behind = op->send ? behind_any_.end() : behind_any_.find(op->tag);
      if (behind != behind_any_.end()) {
        // After a receive from any source with this tag: posted once it
        // knows its sender (Resolved).
        behind->second.push_back(op);
      } else if (PostHeader(op)) {
        if (op->any) behind_any_[op->tag].push_back(op);
      } else {
        failed = op->status;
      }
      if (failed.ok()) {
        queue_.push_back(op);
        // Every queued operation needs a waiter of its own.
        if (queue_.size() > static_cast<size_t>(idle_)) {
          threads_.emplace_back([this] { Waiter(); });
        }
        return;
      }
    } else {
      // The destructor runs concurrently: not ours to wait for any more.
      failed = absl::CancelledError(
          absl::StrCat(Describe(*op), ": group '", group_name_, "' was destroyed"));
    }
  }
  op->done(std::move(failed), -1);
}

void GlooP2P::PostReady(const Key& key) {
  auto it = unposted_.find(key);
  if (it == unposted_.end()) return;
  auto& ops = it->second;
  while (!ops.empty() && ops.front()->header_done) {
    std::shared_ptr<Pending> op = std::move(ops.front());
    ops.pop_front();
    op->data_posted = true;
    if (!op->status.ok()) continue;
    uint64_t theirs = op->sizes[1];
    if (theirs != op->bytes) {
      // Both sides see both sizes: neither posts the data.
      op->status = absl::InvalidArgumentError(
          absl::StrCat(Describe(*op), " on group '", group_name_, "': the matching ",
                       op->send ? "receive" : "send", " is ", theirs,
                       " bytes (a receive must have the size ", "of the message it matches)"));
      continue;
    }
    if (op->bytes == 0) continue;
    try {
      if (op->send) {
        op->buffer->send(op->peer, kP2PSlotPrefix | op->tag, 0, op->bytes);
      } else {
        op->buffer->recv(op->peer, kP2PSlotPrefix | op->tag, 0, op->bytes);
      }
    } catch (const std::exception& e) {
      op->status = absl::AbortedError(absl::StrCat(Describe(*op), " on group '", group_name_,
                                                   "' failed over gloo: ", e.what()));
    }
  }
  if (ops.empty()) unposted_.erase(it);
}

absl::Status GlooP2P::Wait(const std::shared_ptr<Pending>& op) {
  std::string where = absl::StrCat(Describe(*op), " on group '", group_name_, "'");
  auto cancelled = [&] {
    return absl::CancelledError(absl::StrCat(where, ": the group was destroyed or aborted"));
  };
  auto fail = [&](const std::exception& e) {
    std::string message = absl::StrCat(where, " failed over gloo: ", e.what());
    if (message.find("imed out") != std::string::npos) {
      return absl::DeadlineExceededError(message);
    }
    return absl::AbortedError(message);
  };
  // 0. Posted (a receive behind one from any source with its tag waits).
  {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return op->posted || stopping_ || aborted_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), op->deadline)) {
      auto it = behind_any_.find(op->tag);
      if (it != behind_any_.end()) {
        auto& ops = it->second;
        ops.erase(std::remove(ops.begin(), ops.end(), op), ops.end());
      }
      return absl::DeadlineExceededError(
          absl::StrCat(where,
                       ": an earlier receive from any source with the same tag is still "
                       "pending"));
    }
    if (!op->posted) return cancelled();
    if (!op->status.ok()) return op->status;
  }
  // 1. The match's size (from any source: the first sender's, which makes
  // it the match; our size goes to it now).
  absl::Status status;
  try {
    int source = -1;
    if (!op->header->waitRecv(op->any ? &source : nullptr, Left(op->deadline))) {
      status = cancelled();
    }
    if (op->any && status.ok()) {
      absl::MutexLock lock(&mu_);
      op->header->send(source, kRecvSizeSlotPrefix | op->tag, 0, sizeof(uint64_t));
      op->peer = source;
      unposted_[Key(source, op->tag, false)].push_back(op);
      Resolved(op->tag);
    }
  } catch (const std::exception& e) {
    status = fail(e);
  }
  if (op->any && op->peer == kAnySource) {
    absl::MutexLock lock(&mu_);
    Resolved(op->tag);  // failed before it knew its sender
    return status.ok() ? cancelled() : status;
  }
  Key key(op->peer, op->tag, op->send);
  {
    absl::MutexLock lock(&mu_);
    op->header_done = true;
    op->status = status;
    PostReady(key);
    // 2. Our data posted once every earlier operation of the key posted its.
    auto posted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return op->data_posted || stopping_ || aborted_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&posted), op->deadline)) {
      auto it = unposted_.find(key);
      if (it != unposted_.end()) {
        auto& ops = it->second;
        for (auto i = ops.begin(); i != ops.end(); ++i) {
          if (*i == op) {
            ops.erase(i);
            break;
          }
        }
        if (ops.empty()) unposted_.erase(it);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": an earlier operation with the same peer and tag is still pending"));
    }
    if (!op->data_posted) return cancelled();
    status = op->status;
  }
  // A size mismatch still waits for our size to be delivered (it lives in
  // `op`); other failures broke the pairs.
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) return status;
  try {
    // 3. The data, then our size delivered.
    if (status.ok() && op->bytes > 0) {
      bool completed = op->send ? op->buffer->waitSend(Left(op->deadline))
                                : op->buffer->waitRecv(Left(op->deadline));
      if (!completed) return cancelled();
    }
    if (!op->header->waitSend(Left(op->deadline))) return cancelled();
  } catch (const std::exception& e) {
    return fail(e);
  }
  return status;
}

void GlooP2P::Waiter() {
  while (true) {
    std::shared_ptr<Pending> op;
    bool aborted;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      ++idle_;
      mu_.Await(absl::Condition(&ready));
      --idle_;
      if (stopping_) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      if (!aborted_) waiting_.push_back(op);
      aborted = aborted_;
    }
    absl::Status status =
        aborted ? absl::CancelledError(absl::StrCat(Describe(*op), " on group '", group_name_,
                                                    "': the group was aborted"))
                : Wait(op);
    {
      absl::MutexLock lock(&mu_);
      waiting_.remove(op);
    }
    op->done(std::move(status), op->peer);
  }
}

}  // namespace muster
