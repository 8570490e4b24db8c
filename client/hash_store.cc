#include "muster/hash_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/store_wire.h"

namespace muster {

absl::Status HashStore::AwaitKeys(const std::vector<std::string>& keys, absl::Duration timeout) {
  auto all_present = [this, &keys]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& k : keys) {
      if (map_.find(k) == map_.end()) return false;
    }
    return true;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) missing.push_back(wire::PrintableKey(k));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("store wait timed out after ", absl::FormatDuration(timeout),
                   "; missing keys: ", absl::StrJoin(missing, ", ")));
}

absl::Status HashStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  map_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::string k(key);
  absl::Status ready = AwaitKeys({k}, timeout);
  if (!ready.ok()) return ready;
  return map_.find(k)->second;
}

absl::StatusOr<int64_t> HashStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
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
  return value;
}

absl::StatusOr<std::string> HashStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) {
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  std::string reply;
  std::optional<std::string> store = wire::CompareSetResult(
      it == map_.end() ? std::nullopt : std::optional<std::string>(it->second), expected, desired,
      &reply);
  if (store.has_value()) map_[std::string(key)] = *store;
  return reply;
}

absl::Status HashStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return AwaitKeys(keys, timeout);
}

absl::StatusOr<bool> HashStore::Check(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) return false;
  }
  return true;
}

absl::StatusOr<bool> HashStore::DeleteKey(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

absl::StatusOr<int64_t> HashStore::NumKeys() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(map_.size());
}

absl::Status HashStore::Append(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  map_[std::string(key)].append(value.data(), value.size());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> HashStore::MultiGet(const std::vector<std::string>& keys,
                                                             absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  absl::Status ready = AwaitKeys(keys, timeout);
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
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = values[i];
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> HashStore::ListKeys() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : map_) keys.push_back(k);
  return keys;
}

}  // namespace muster
