#include "backends/gloo/gloo_p2p.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"

namespace muster {
namespace {

// Slots of point-to-point messages: a prefix no Gloo collective uses (they
// use small prefixes in the top byte), then the tag.
constexpr uint64_t kP2PSlotPrefix = uint64_t{0xE7} << 56;

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
    for (auto& op : waiting_) {
      if (op->send) {
        op->buffer->abortWaitSend();
      } else {
        op->buffer->abortWaitRecv();
      }
    }
    threads.swap(threads_);
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
        absl::StrCat(Describe(*op), ": group '", group_name_, "' was destroyed")));
  }
}

std::string GlooP2P::Describe(const Pending& op) const {
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
  op->done = std::move(done);
  if (absl::Status s = Validate(peer, tag); !s.ok()) {
    op->done(s);
    return;
  }
  try {
    op->buffer = context_->createUnboundBuffer(data, bytes);
    if (send) {
      op->buffer->send(peer, kP2PSlotPrefix | tag, 0, bytes);
    } else {
      op->buffer->recv(peer, kP2PSlotPrefix | tag, 0, bytes);
    }
  } catch (const std::exception& e) {
    op->done(absl::AbortedError(
        absl::StrCat(Describe(*op), " on group '", group_name_, "' failed over gloo: ", e.what())));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(op);
      // Every queued operation needs a waiter of its own.
      if (queue_.size() > static_cast<size_t>(idle_)) {
        threads_.emplace_back([this] { Waiter(); });
      }
      return;
    }
  }
  // The destructor runs concurrently: not ours to wait for any more.
  op->done(absl::CancelledError(
      absl::StrCat(Describe(*op), ": group '", group_name_, "' was destroyed")));
}

absl::Status GlooP2P::Wait(Pending& op) {
  absl::Duration left = op.deadline - absl::Now();
  if (left < absl::Milliseconds(1)) left = absl::Milliseconds(1);
  if (left > absl::Hours(24)) left = absl::Hours(24);
  auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(left));
  std::string where = absl::StrCat(Describe(op), " on group '", group_name_, "'");
  try {
    bool completed = op.send ? op.buffer->waitSend(timeout) : op.buffer->waitRecv(timeout);
    if (!completed) return absl::CancelledError(absl::StrCat(where, ": the group was destroyed"));
  } catch (const std::exception& e) {
    std::string message = absl::StrCat(where, " failed over gloo: ", e.what());
    if (message.find("imed out") != std::string::npos) {
      return absl::DeadlineExceededError(message);
    }
    return absl::AbortedError(message);
  }
  return absl::OkStatus();
}

void GlooP2P::Waiter() {
  while (true) {
    std::shared_ptr<Pending> op;
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
      waiting_.push_back(op);
    }
    absl::Status status = Wait(*op);
    {
      absl::MutexLock lock(&mu_);
      waiting_.remove(op);
    }
    op->done(std::move(status));
  }
}

}  // namespace muster
