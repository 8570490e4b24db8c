// KvStore: the store's data — a flat byte-string map, FIFO queues, and the
// registrations of clients waiting for keys — with c10d's semantics
// (common/store_wire.h has the ADD and COMPARE_SET rules).
//
// Waiting: Wait(keys, cb) registers `cb` if some key is missing; every write
// of one of those keys (SET, ADD, APPEND, MULTI_SET, COMPARE_SET that stores,
// QUEUE_PUSH) counts it off, and when none is missing `cb` runs once. A
// callback never runs inside Wait() itself, and runs only after the mutation
// that released it completed, so it may touch the store again.
//
// Mutations are reported to an optional listener (the durability log)
// before the call returns. Memory is bounded by `max_total_bytes` (keys +
// values + queued items); a write beyond it fails with ResourceExhausted.
//
// Not thread-safe: owned by the store server's loop thread.
#ifndef MUSTER_DAEMON_STORE_KV_STORE_H_
#define MUSTER_DAEMON_STORE_KV_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

// One change to the store, as the durability log records it.
struct Mutation {
  enum class Type : uint8_t { kSet = 1, kDelete = 2, kAppend = 3, kQueuePush = 4, kQueuePop = 5 };
  Type type;
  absl::string_view key;
  absl::string_view value;  // kSet, kAppend, kQueuePush
};

class KvStore {
 public:
  using WaitId = uint64_t;
  using MutationListener = std::function<void(const Mutation&)>;

  explicit KvStore(uint64_t max_total_bytes = UINT64_MAX) : max_total_bytes_(max_total_bytes) {}
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  void SetMutationListener(MutationListener listener) { listener_ = std::move(listener); }
  void set_max_total_bytes(uint64_t max) { max_total_bytes_ = max; }

  absl::Status Set(absl::string_view key, absl::string_view value);
  // nullptr if missing. Valid until the next mutation.
  const std::string* Find(absl::string_view key) const;
  // FailedPrecondition if the stored value is not a number.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // Returns the value stored afterwards (c10d semantics).
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired);
  absl::Status Append(absl::string_view key, absl::string_view value);
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values);
  bool Delete(absl::string_view key);
  // True if every key is in the map or has a non-empty queue.
  bool Check(const std::vector<std::string>& keys) const;
  std::vector<std::string> MissingKeys(const std::vector<std::string>& keys) const;
  int64_t NumKeys() const { return static_cast<int64_t>(map_.size()); }
  // Sorted; only keys starting with `prefix`.
  std::vector<std::string> ListKeys(absl::string_view prefix = "") const;
  // What ListKeys(prefix) would return, measured without copying: the number
  // of keys and the sum of their sizes (to bound a reply before building it).
  void MeasureKeys(absl::string_view prefix, uint64_t* count, uint64_t* bytes) const;

  absl::Status QueuePush(absl::string_view key, absl::string_view value);
  // Length before the pop; *value set when it was > 0.
  int64_t QueuePop(absl::string_view key, std::string* value);
  int64_t QueueLen(absl::string_view key) const;
  // The item QueuePop would return; nullptr if the queue is empty.
  const std::string* QueueFront(absl::string_view key) const;
  // Every queued item, queue by queue, oldest first (for log compaction).
  void ForEachQueueItem(const std::function<void(absl::string_view, absl::string_view)>& fn) const;

  // 0 if every key is present now (nothing registered); else an id whose
  // callback runs once when all are present, unless cancelled first.
  WaitId Wait(const std::vector<std::string>& keys, std::function<void()> on_ready);
  // The same registration in steps, for key lists too long to register in
  // one go without stalling the caller: BeginWait, AddWaitKeys for slices of
  // the list (later slices see keys written meanwhile as present), EndWait.
  // The callback cannot run before EndWait. Each key costs O(1) expected
  // (a hash lookup and an append), and CancelWait O(log waiters) per key.
  WaitId BeginWait(std::function<void()> on_ready);
  void AddWaitKeys(WaitId id, const std::string* keys, size_t count);
  // False if no key was missing: the registration is gone, its callback
  // never runs. Else the id stays live as with Wait().
  bool EndWait(WaitId id);
  // Forgets a registration; harmless for ids that already fired.
  void CancelWait(WaitId id);
  size_t num_waits() const { return waits_.size(); }

  uint64_t total_bytes() const { return total_bytes_; }

 private:
  struct WaitState {
    std::vector<std::string> keys;  // the missing keys at registration
    size_t missing = 0;
    std::function<void()> on_ready;
    bool registering = false;  // between BeginWait and EndWait
  };

  absl::Status Reserve(uint64_t added, uint64_t removed, absl::string_view key);
  // `key` now exists: count it off for its waiters (all, or the first one
  // only for a queue push), then run the released callbacks.
  void KeyWritten(absl::string_view key, bool wake_one = false);
  void Report(Mutation::Type type, absl::string_view key, absl::string_view value = "");
  void StoreValue(absl::string_view key, std::string value);

  uint64_t max_total_bytes_;
  uint64_t total_bytes_ = 0;
  absl::flat_hash_map<std::string, std::string> map_;
  absl::flat_hash_map<std::string, std::deque<std::string>> queues_;
  // Invariant: a live WaitId is in waiters_[k] exactly for each still-missing
  // key k of its registration, and waits_[id].missing is their number;
  // cancelled ids are removed from waiters_ at once (no unbounded growth).
  // Each list is sorted (oldest registration first) and duplicate-free.
  absl::flat_hash_map<std::string, absl::InlinedVector<WaitId, 2>> waiters_;
  absl::flat_hash_map<WaitId, WaitState> waits_;
  WaitId next_wait_id_ = 1;
  MutationListener listener_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_KV_STORE_H_
