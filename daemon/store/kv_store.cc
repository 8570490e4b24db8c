#include "daemon/store/kv_store.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/store_wire.h"

namespace muster {
namespace {

// A string's own allocation: libstdc++ keeps up to 15 bytes inside the
// object; longer ones take a heap block of size + 1, which malloc rounds up
// to 16 bytes with an 8-byte header.
uint64_t HeapBytes(uint64_t n) { return n <= 15 ? 0 : (n + 1 + 8 + 15) & ~uint64_t{15}; }

// A hash-map slot: two 32-byte strings (a key and its value, or a key and
// its queue's deque, 80 bytes) and a control byte, at the load of 7/16 to
// 7/8 the table keeps.
constexpr uint64_t kEntrySlotBytes = 128;
constexpr uint64_t kQueueSlotBytes = 192;
// A deque's map and first 512-byte block, allocated with its first item.
constexpr uint64_t kQueueBlockBytes = 512 + 64 + 32;
// An item's std::string inside its deque block.
constexpr uint64_t kItemBytes = 32;

}  // namespace

uint64_t KvStore::EntryCharge(uint64_t key, uint64_t value_capacity) {
  return kEntrySlotBytes + HeapBytes(key) + HeapBytes(value_capacity);
}

uint64_t KvStore::ChargeOf(absl::string_view key, const std::string& value) {
  return EntryCharge(key.size(), value.capacity());
}

uint64_t KvStore::QueueCharge(uint64_t key) {
  return kQueueSlotBytes + kQueueBlockBytes + HeapBytes(key);
}

uint64_t KvStore::ItemCharge(uint64_t value) {
  return kItemBytes + std::max(value, HeapBytes(value));
}

absl::Status KvStore::Reserve(uint64_t added, uint64_t removed, absl::string_view key) {
  uint64_t after = total_bytes_ - std::min(removed, total_bytes_) + added;
  if (added > removed && after > max_total_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store holds ", total_bytes_, " bytes; writing key '", wire::PrintableKey(key),
                     "' would exceed --store-max-total-bytes=", max_total_bytes_));
  }
  return absl::OkStatus();
}

void KvStore::Report(Mutation::Type type, absl::string_view key, absl::string_view value) {
  if (listener_) listener_(Mutation{type, key, value});
}

void KvStore::StoreValue(absl::string_view key, std::string value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    it = map_.emplace(std::string(key), std::move(value)).first;
  } else {
    total_bytes_ -= ChargeOf(key, it->second);
    it->second.swap(value);  // the old buffer goes with `value` (not kept)
  }
  total_bytes_ += ChargeOf(key, it->second);
}

absl::Status KvStore::Set(absl::string_view key, absl::string_view value) {
  const std::string* old = Find(key);
  absl::Status ok = ReserveValue(key, old, value.size());
  if (!ok.ok()) return ok;
  StoreValue(key, std::string(value));
  Report(Mutation::Type::kSet, key, value);
  KeyWritten(key);
  return absl::OkStatus();
}

absl::Status KvStore::SetOwned(absl::string_view key, std::string value) {
  const std::string* old = Find(key);
  absl::Status ok = ReserveValue(key, old, value.size());
  if (!ok.ok()) return ok;
  StoreValue(key, std::move(value));
  Report(Mutation::Type::kSet, key, *Find(key));
  KeyWritten(key);
  return absl::OkStatus();
}

absl::Status KvStore::ReserveValue(absl::string_view key, const std::string* old, uint64_t value) {
  return Reserve(EntryCharge(key.size(), value), old ? ChargeOf(key, *old) : 0, key);
}

const std::string* KvStore::Find(absl::string_view key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view key, int64_t delta) {
  const std::string* old = Find(key);
  int64_t value = delta;
  if (old != nullptr) {
    std::optional<int64_t> current = wire::ParseCounter(*old);
    if (!current.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("ADD on key '", wire::PrintableKey(key),
                                                        "' whose value is not a number (",
                                                        old->size(), " bytes)"));
    }
    // Wrap around like the two's-complement arithmetic of the reference.
    value = static_cast<int64_t>(static_cast<uint64_t>(*current) + static_cast<uint64_t>(delta));
  }
  std::string text = absl::StrCat(value);
  absl::Status ok = ReserveValue(key, old, text.size());
  if (!ok.ok()) return ok;
  StoreValue(key, text);
  Report(Mutation::Type::kSet, key, text);
  KeyWritten(key);
  return value;
}

absl::StatusOr<std::string> KvStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                absl::string_view desired) {
  const std::string* old = Find(key);
  std::string reply;
  std::optional<std::string> to_store = wire::CompareSetResult(
      old ? std::optional<std::string>(*old) : std::nullopt, expected, desired, &reply);
  if (to_store.has_value()) {
    absl::Status ok = ReserveValue(key, old, to_store->size());
    if (!ok.ok()) return ok;
    StoreValue(key, *to_store);
    Report(Mutation::Type::kSet, key, *to_store);
    KeyWritten(key);
  }
  return reply;
}

absl::Status KvStore::Append(absl::string_view key, absl::string_view value) {
  const std::string* old = Find(key);
  // Appending grows the string's capacity geometrically: what it will
  // take is charged, not only its bytes.
  const uint64_t size = (old ? old->size() : 0) + value.size();
  const uint64_t capacity = old == nullptr || size <= old->capacity()
                                ? size
                                : std::max<uint64_t>(size, 2 * old->capacity());
  absl::Status ok = Reserve(EntryCharge(key.size(), capacity), old ? ChargeOf(key, *old) : 0, key);
  if (!ok.ok()) return ok;
  auto it = map_.find(key);
  if (it == map_.end()) {
    it = map_.emplace(std::string(key), std::string(value)).first;
  } else {
    total_bytes_ -= ChargeOf(key, it->second);
    it->second.append(value.data(), value.size());
  }
  total_bytes_ += ChargeOf(key, it->second);
  Report(Mutation::Type::kAppend, key, value);
  KeyWritten(key);
  return absl::OkStatus();
}

absl::Status KvStore::MultiSet(const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) {
  // All or nothing: check the total first. A key may repeat (the last
  // value wins), so count each distinct key once, with its final value.
  absl::flat_hash_map<absl::string_view, size_t> final_value;
  for (size_t i = 0; i < keys.size(); ++i) final_value[keys[i]] = i;
  uint64_t added = 0, removed = 0;
  for (const auto& [key, i] : final_value) {
    const std::string* old = Find(key);
    added += EntryCharge(key.size(), values[i].size());
    removed += old ? ChargeOf(key, *old) : 0;
  }
  absl::Status ok = Reserve(added, removed, keys.empty() ? "" : keys[0]);
  if (!ok.ok()) return ok;
  for (size_t i = 0; i < keys.size(); ++i) {
    StoreValue(keys[i], values[i]);
    Report(Mutation::Type::kSet, keys[i], values[i]);
  }
  for (const std::string& k : keys) KeyWritten(k);
  return absl::OkStatus();
}

bool KvStore::Delete(absl::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  total_bytes_ -= ChargeOf(it->first, it->second);
  map_.erase(it);
  Report(Mutation::Type::kDelete, key);
  return true;
}

bool KvStore::Check(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end() && QueueLen(k) == 0) return false;
  }
  return true;
}

uint64_t KvStore::MissingKeys(const std::vector<std::string>& keys, size_t max_named,
                              std::vector<std::string>* named) const {
  uint64_t missing = 0;
  for (const std::string& k : keys) {
    if (map_.contains(k) || (!queues_.empty() && QueueLen(k) > 0)) continue;
    if (missing++ < max_named) named->push_back(k);
  }
  return missing;
}

std::vector<std::string> KvStore::MissingKeys(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end() && QueueLen(k) == 0) missing.push_back(k);
  }
  return missing;
}

std::vector<std::string> KvStore::ListKeys(absl::string_view prefix) const {
  std::vector<std::string> keys;
  for (const auto& [k, v] : map_) {
    if (absl::StartsWith(k, prefix)) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

void KvStore::ForEachKey(const std::function<void(absl::string_view)>& fn) const {
  for (const auto& [k, v] : map_) fn(k);
}

void KvStore::MeasureKeys(absl::string_view prefix, uint64_t* count, uint64_t* bytes) const {
  *count = 0;
  *bytes = 0;
  for (const auto& [k, v] : map_) {
    if (!absl::StartsWith(k, prefix)) continue;
    ++*count;
    *bytes += k.size();
  }
}

const std::string* KvStore::QueueFront(absl::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() || it->second.empty() ? nullptr : &it->second.front();
}

absl::Status KvStore::QueuePush(absl::string_view key, absl::string_view value) {
  auto it = queues_.find(key);
  const uint64_t charge =
      ItemCharge(value.size()) + (it == queues_.end() ? QueueCharge(key.size()) : 0);
  absl::Status ok = Reserve(charge, 0, key);
  if (!ok.ok()) return ok;
  if (it == queues_.end()) it = queues_.try_emplace(key).first;
  it->second.emplace_back(value);
  total_bytes_ += charge;
  Report(Mutation::Type::kQueuePush, key, value);
  KeyWritten(key, /*wake_one=*/true);
  return absl::OkStatus();
}

int64_t KvStore::QueuePop(absl::string_view key, std::string* value) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return 0;
  int64_t before = static_cast<int64_t>(it->second.size());
  *value = std::move(it->second.front());
  it->second.pop_front();
  total_bytes_ -= ItemCharge(value->size());
  if (it->second.empty()) {
    total_bytes_ -= QueueCharge(key.size());
    queues_.erase(it);
  }
  Report(Mutation::Type::kQueuePop, key);
  return before;
}

int64_t KvStore::QueueLen(absl::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

const std::deque<std::string>* KvStore::QueueItems(absl::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? nullptr : &it->second;
}

void KvStore::ForEachQueueItem(
    const std::function<void(absl::string_view, absl::string_view)>& fn) const {
  for (const auto& [key, items] : queues_) {
    for (const std::string& item : items) fn(key, item);
  }
}

KvStore::WaitId KvStore::Wait(const std::vector<std::string>& keys,
                              std::function<void()> on_ready) {
  WaitId id = BeginWait(std::move(on_ready));
  AddWaitKeys(id, keys.data(), keys.size());
  return EndWait(id) ? id : 0;
}

KvStore::WaitId KvStore::BeginWait(std::function<void()> on_ready, size_t expected_keys) {
  WaitId id = next_wait_id_++;
  WaitState& state = waits_[id];
  state.on_ready = std::move(on_ready);
  state.registering = true;
  state.keys.reserve(expected_keys);
  return id;
}

void KvStore::AddWaitKeys(WaitId id, const std::string* keys, size_t count) {
  auto w = waits_.find(id);
  if (w == waits_.end()) return;
  WaitState& state = w->second;
  for (size_t i = 0; i < count; ++i) {
    const std::string& k = keys[i];
    if (map_.contains(k) || QueueLen(k) > 0) continue;
    auto& list = waiters_[k];
    // Sorted: a fresh registration usually goes last; a repeated key is
    // already there.
    auto pos = std::lower_bound(list.begin(), list.end(), id);
    if (pos != list.end() && *pos == id) continue;
    list.insert(pos, id);
    state.keys.push_back(k);
    ++state.missing;
  }
}

bool KvStore::EndWait(WaitId id) {
  auto w = waits_.find(id);
  if (w == waits_.end()) return false;
  w->second.registering = false;
  if (w->second.missing > 0) return true;
  // Its keys are all written and gone from waiters_.
  Retire(id, w->second, /*unlink=*/false);
  waits_.erase(w);
  return false;
}

void KvStore::Unlink(WaitId id, const std::string& key) {
  auto list = waiters_.find(key);
  if (list == waiters_.end()) return;  // that key was already written
  auto& ids = list->second;
  auto pos = std::lower_bound(ids.begin(), ids.end(), id);
  if (pos != ids.end() && *pos == id) ids.erase(pos);
  if (ids.empty()) waiters_.erase(list);
}

void KvStore::Retire(WaitId id, WaitState& state, bool unlink) {
  if (state.keys.size() <= kCancelInlineKeys) {
    if (unlink) {
      for (const std::string& k : state.keys) Unlink(id, k);
    }
    return;  // the list is freed with the state
  }
  pending_reap_keys_ += state.keys.size();
  reaping_.push_back(Reaping{id, std::move(state.keys), unlink});
}

void KvStore::CancelWait(WaitId id) {
  auto it = waits_.find(id);
  if (it == waits_.end()) return;
  Retire(id, it->second, /*unlink=*/true);
  waits_.erase(it);
}

size_t KvStore::ReapCancelled(size_t max_keys) {
  size_t done = 0;
  while (done < max_keys && !reaping_.empty()) {
    Reaping& r = reaping_.front();
    size_t n = std::min(max_keys - done, r.keys.size());
    for (size_t i = 0; i < n; ++i) {
      if (r.unlink) Unlink(r.id, r.keys.back());
      r.keys.pop_back();
    }
    done += n;
    pending_reap_keys_ -= n;
    if (r.keys.empty()) reaping_.pop_front();
  }
  return done;
}

void KvStore::KeyWritten(absl::string_view key, bool wake_one) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  absl::InlinedVector<WaitId, 2> ids;
  if (wake_one) {
    // Hand the item to the longest-waiting live registration only (stale
    // ids of cancelled ones are dropped on the way).
    auto& list = it->second;
    size_t stale = 0;
    while (stale < list.size() && !waits_.contains(list[stale])) ++stale;
    if (stale < list.size()) {
      ids.push_back(list[stale]);
      ++stale;
    }
    list.erase(list.begin(), list.begin() + stale);
    if (list.empty()) waiters_.erase(it);
  } else {
    ids = std::move(it->second);
    waiters_.erase(it);
  }
  std::vector<std::function<void()>> released;
  for (WaitId id : ids) {
    auto w = waits_.find(id);
    if (w == waits_.end()) continue;  // cancelled
    if (--w->second.missing == 0 && !w->second.registering) {
      released.push_back(std::move(w->second.on_ready));
      Retire(id, w->second, /*unlink=*/false);
      waits_.erase(w);
    }
  }
  for (auto& callback : released) callback();
}

}  // namespace muster
