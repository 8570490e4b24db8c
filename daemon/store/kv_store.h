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
// before the call returns. Memory is bounded by `max_total_bytes`; a write
// beyond it fails with ResourceExhausted. What counts is what holding the
// data costs in memory (EntryCharge, QueueCharge, ItemCharge: the bytes,
// their allocations and the table slot or queue block), so that many tiny
// keys or queue items cannot hold many times the limit.
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

#include "absl/container/btree_map.h"
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
  // Set, keeping `value`'s storage (no copy of a 16 MiB value).
  absl::Status SetOwned(absl::string_view key, std::string value);
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
  // How many of `keys` are missing; the first `max_named` of them (in list
  // order) are copied to `named`. One lookup per key, no other copies.
  uint64_t MissingKeys(const std::vector<std::string>& keys, size_t max_named,
                       std::vector<std::string>* named) const;
  int64_t NumKeys() const { return static_cast<int64_t>(map_.size()); }
  // Sorted; only keys starting with `prefix`.
  std::vector<std::string> ListKeys(absl::string_view prefix = "") const;
  // What ListKeys(prefix) would return, measured without copying: the number
  // of keys and the sum of their sizes (to bound a reply before building it).
  void MeasureKeys(absl::string_view prefix, uint64_t* count, uint64_t* bytes) const;
  // Calls `fn` with every key, in no particular order, copying nothing.
  void ForEachKey(const std::function<void(absl::string_view)>& fn) const;

  absl::Status QueuePush(absl::string_view key, absl::string_view value);
  // Length before the pop; *value set when it was > 0.
  int64_t QueuePop(absl::string_view key, std::string* value);
  int64_t QueueLen(absl::string_view key) const;
  // The item QueuePop would return; nullptr if the queue is empty.
  const std::string* QueueFront(absl::string_view key) const;
  // Every queued item, queue by queue, oldest first (for log compaction).
  void ForEachQueueItem(const std::function<void(absl::string_view, absl::string_view)>& fn) const;
  // The items of the queue at `key` (null: none).
  const std::deque<std::string>* QueueItems(absl::string_view key) const;

  // 0 if every key is present now (nothing registered); else an id whose
  // callback runs once when all are present, unless cancelled first.
  WaitId Wait(const std::vector<std::string>& keys, std::function<void()> on_ready);
  // The same registration in steps, for key lists too long to register in
  // one go without stalling the caller: BeginWait, AddWaitKeys for slices of
  // the list (later slices see keys written meanwhile as present), EndWait.
  // The callback cannot run before EndWait. `expected_keys` reserves room for
  // that many keys up front, so the registration's list never regrows. Each
  // key costs O(log keys waited on) (the waiter index is a B-tree: it never
  // rehashes, so no single key registers slowly).
  WaitId BeginWait(std::function<void()> on_ready, size_t expected_keys = 0);
  void AddWaitKeys(WaitId id, const std::string* keys, size_t count);
  // False if no key was missing: the registration is gone, its callback
  // never runs. Else the id stays live as with Wait().
  bool EndWait(WaitId id);
  // Forgets a registration at once (its callback never runs, num_waits()
  // drops); harmless for ids that already fired. A registration on more than
  // kCancelInlineKeys keys is unlinked from the per-key index later, in
  // slices, by ReapCancelled(); until then its id may still sit in those
  // keys' lists, where it matches no live registration.
  void CancelWait(WaitId id);
  // Does up to about `max_keys` keys of deferred work: unlinking cancelled
  // registrations from the index and freeing the key lists of finished ones.
  // Returns the keys done (0: nothing is pending).
  size_t ReapCancelled(size_t max_keys);
  // Keys whose deferred work (see ReapCancelled) is still pending.
  uint64_t pending_reap_keys() const { return pending_reap_keys_; }
  size_t num_waits() const { return waits_.size(); }

  // Registrations on at most this many keys are cancelled in one go.
  static constexpr size_t kCancelInlineKeys = 256;

  // What the data holds of max_total_bytes (see the charges below).
  uint64_t total_bytes() const { return total_bytes_; }
  // The charge for a key and a value of that capacity, a queue (charged
  // with its first item, freed with its last) and one queued item. A held
  // value is charged at its capacity (ChargeOf), so appends are too.
  static uint64_t EntryCharge(uint64_t key_bytes, uint64_t value_capacity);
  static uint64_t ChargeOf(absl::string_view key, const std::string& value);
  static uint64_t QueueCharge(uint64_t key_bytes);
  static uint64_t ItemCharge(uint64_t value_bytes);

 private:
  struct WaitState {
    std::vector<std::string> keys;  // the missing keys at registration
    size_t missing = 0;
    std::function<void()> on_ready;
    bool registering = false;  // between BeginWait and EndWait
  };

  // A finished registration whose keys are still to be unlinked from
  // waiters_ (`unlink`: it was cancelled) and freed, last key first.
  struct Reaping {
    WaitId id;
    std::vector<std::string> keys;
    bool unlink;
  };

  absl::Status Reserve(uint64_t added, uint64_t removed, absl::string_view key);
  // Reserve for `key` holding a `value`-byte value instead of `old`.
  absl::Status ReserveValue(absl::string_view key, const std::string* old, uint64_t value);
  // Removes `id` from the waiter list of `key`, if it is there.
  void Unlink(WaitId id, const std::string& key);
  // `state` ended: its key list is freed now if short, else later.
  void Retire(WaitId id, WaitState& state, bool unlink);
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
  // key k of its registration, and waits_[id].missing is their number. A
  // cancelled id is in waiters_ only for keys of its entry in reaping_ (so
  // stale ids are bounded by the pending deferred work); ids are never
  // reused, so a stale id matches nothing. Each list is sorted (oldest
  // registration first) and duplicate-free. A B-tree, not a hash map: a hash
  // map rehashes every entry at once when it grows, which with millions of
  // waited keys stalls the store's loop for tens of milliseconds.
  absl::btree_map<std::string, absl::InlinedVector<WaitId, 2>, std::less<>> waiters_;
  absl::flat_hash_map<WaitId, WaitState> waits_;
  std::deque<Reaping> reaping_;
  uint64_t pending_reap_keys_ = 0;  // keys in reaping_
  WaitId next_wait_id_ = 1;
  MutationListener listener_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_KV_STORE_H_
