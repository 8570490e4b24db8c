// HashStore: an in-memory Store for tests and single-process use. Blocking
// calls wait on a condition variable; every operation is atomic.
//
// Thread-safe. (std::mutex rather than absl::Mutex so that ThreadSanitizer,
// which cannot see into Debian's uninstrumented Abseil, understands it.)
#ifndef MUSTER_CORE_INCLUDE_MUSTER_HASH_STORE_H_
#define MUSTER_CORE_INCLUDE_MUSTER_HASH_STORE_H_

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "muster/store.h"

namespace muster {

class HashStore : public Store {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  bool Supports(StoreCapability) const override { return true; }
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<std::vector<std::string>> ListKeys() override;
  using Store::Get;
  using Store::MultiGet;
  using Store::Wait;

 private:
  // Waits (holding `lock` on mu_) until every key exists; DeadlineExceeded
  // names the missing ones.
  absl::Status AwaitKeys(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                         absl::Duration timeout);

  std::mutex mu_;
  std::condition_variable changed_;                      // notified on every write
  std::map<std::string, std::string, std::less<>> map_;  // guarded by mu_
};

}  // namespace muster

#endif  // MUSTER_CORE_INCLUDE_MUSTER_HASH_STORE_H_
