// BlockingStore: a muster::Store whose blocking waits another thread can
// cancel, and that names the keys still missing — what StoreFrontend needs
// to serve the wire protocols from a Store kept elsewhere (EtcdStore).
//
// WaitCancel is the handle: Cancel() may be called from any thread, once or
// more; a wait it belongs to returns CANCELLED soon after. Thread-safe.
#ifndef MUSTER_DAEMON_STORE_BLOCKING_STORE_H_
#define MUSTER_DAEMON_STORE_BLOCKING_STORE_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "muster/store.h"

namespace muster {

class WaitCancel {
 public:
  void Cancel() {
    cancelled_.store(true);
    absl::MutexLock lock(&mu_);
    if (on_cancel_) on_cancel_();
  }
  bool cancelled() const { return cancelled_.load(); }
  // For the implementation: `fn` runs on Cancel() while set (under a lock;
  // it must not block). False if already cancelled.
  bool SetOnCancel(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    if (cancelled()) return false;
    on_cancel_ = std::move(fn);
    return true;
  }
  void ClearOnCancel() {
    absl::MutexLock lock(&mu_);
    on_cancel_ = nullptr;
  }

 private:
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

class BlockingStore : public Store {
 public:
  // Wait that `cancel` (may be null) can end early with CANCELLED.
  virtual absl::Status WaitCancellable(const std::vector<std::string>& keys, absl::Duration timeout,
                                       WaitCancel* cancel) = 0;
  // The keys of `keys` missing now, in order.
  virtual absl::StatusOr<std::vector<std::string>> Missing(
      const std::vector<std::string>& keys) = 0;

  // Queues (PyTorch 2.8+ QUEUE_PUSH / QUEUE_POP / QUEUE_LEN): FIFO lists of
  // values in a namespace apart from the keys (not counted by NumKeys, not
  // listed by ListKeys). A store without them answers Unimplemented.
  virtual absl::Status QueuePush(absl::string_view key, absl::string_view value) {
    return absl::UnimplementedError("this store has no queues");
  }
  // Pops the oldest item into *value; returns the queue's length before the
  // pop (0: the queue was empty, nothing popped). With a timeout > 0 an
  // empty queue is waited on (CANCELLED through `cancel`, DeadlineExceeded
  // naming the queue at the timeout).
  virtual absl::StatusOr<int64_t> QueuePop(absl::string_view key, std::string* value,
                                           absl::Duration timeout, WaitCancel* cancel) {
    return absl::UnimplementedError("this store has no queues");
  }
  virtual absl::StatusOr<int64_t> QueueLen(absl::string_view key) {
    return absl::UnimplementedError("this store has no queues");
  }
  // WaitCancellable and Missing as PyTorch's WAIT and CHECK see keys: a key
  // is also present while a queue of that name is non-empty (a blocking
  // queue_pop WAITs on its queue's key).
  virtual absl::Status WaitCancellableOrQueued(const std::vector<std::string>& keys,
                                               absl::Duration timeout, WaitCancel* cancel) {
    return WaitCancellable(keys, timeout, cancel);
  }
  virtual absl::StatusOr<std::vector<std::string>> MissingOrQueued(
      const std::vector<std::string>& keys) {
    return Missing(keys);
  }

  // The values of `keys` (present: a wait for them just ended), read at or
  // after `since` (when the request arrived): a store may answer many such
  // requests with one read. Missing keys fail (NotFound: deleted meanwhile).
  virtual absl::StatusOr<std::vector<std::string>> ValuesSince(const std::vector<std::string>& keys,
                                                               absl::Time since) {
    return MultiGet(keys, absl::Seconds(1));
  }
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_BLOCKING_STORE_H_
