#include "muster/hash_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/store_wire.h"

namespace muster {

absl::Status HashStore::AwaitKeys(std::unique_lock<std::mutex>& lock,
                                  const std::vector<std::string>& keys, absl::Duration timeout) {
  auto all_present = [this, &keys] {
    for (const std::string& k : keys) {
      if (map_.find(k) == map_.end()) return false;
    }
    return true;
  };
  bool ready =
      timeout == absl::InfiniteDuration()
          ? (changed_.wait(lock, all_present), true)
          : changed_.wait_until(lock, absl::ToChronoTime(absl::Now() + timeout), all_present);
  if (ready) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) missing.push_back(wire::PrintableKey(k));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("store wait timed out after ", absl::FormatDuration(timeout),
                   "; missing keys: ", absl::StrJoin(missing, ", ")));
}

absl::Status HashStore::Set(absl::string_view key, absl::string_view value) {
  std::unique_lock<std::mutex> lock(mu_);
  map_[std::string(key)] = std::string(value);
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::Get(absl::string_view key, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  std::string k(key);
  absl::Status ready = AwaitKeys(lock, {k}, timeout);
  if (!ready.ok()) return ready;
  return map_.find(k)->second;
}

absl::StatusOr<int64_t> HashStore::Add(absl::string_view key, int64_t delta) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = map_.find(key);
  int64_t value = delta;
  if (it != map_.end()) {
    std::optional<int64_t> current = wire::ParseCounter(it->second);
    if (!current.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ADD on key '", wire::PrintableKey(key), "' whose value is not a number"));
    }
    value = static_cast<int64_t>(static_cast<uint64_t>(*current) + static_cast<uint64_t>(delta));
  }
  map_[std::string(key)] = absl::StrCat(value);
  changed_.notify_all();
  return value;
}

absl::StatusOr<std::string> HashStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = map_.find(key);
  std::string reply;
  std::optional<std::string> store = wire::CompareSetResult(
      it == map_.end() ? std::nullopt : std::optional<std::string>(it->second), expected, desired,
      &reply);
  if (store.has_value()) {
    map_[std::string(key)] = *store;
    changed_.notify_all();
  }
  return reply;
}

absl::Status HashStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return AwaitKeys(lock, keys, timeout);
}

absl::StatusOr<bool> HashStore::Check(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mu_);
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) return false;
  }
  return true;
}

absl::StatusOr<bool> HashStore::DeleteKey(absl::string_view key) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

absl::StatusOr<int64_t> HashStore::NumKeys() {
  std::unique_lock<std::mutex> lock(mu_);
  return static_cast<int64_t>(map_.size());
}

absl::Status HashStore::Append(absl::string_view key, absl::string_view value) {
  std::unique_lock<std::mutex> lock(mu_);
  map_[std::string(key)].append(value.data(), value.size());
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> HashStore::MultiGet(const std::vector<std::string>& keys,
                                                             absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Status ready = AwaitKeys(lock, keys, timeout);
  if (!ready.ok()) return ready;
  std::vector<std::string> values;
  for (const std::string& k : keys) values.push_back(map_.find(k)->second);
  return values;
}

absl::Status HashStore::MultiSet(const std::vector<std::string>& keys,
                                 const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultiSet: ", keys.size(), " keys but ", values.size(), " values"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = values[i];
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> HashStore::ListKeys() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : map_) keys.push_back(k);
  return keys;
}

}  // namespace muster
