// muster::Store — the key-value store every rank uses to find the others,
// with c10d's semantics: values are opaque bytes; Add keeps a decimal
// counter; Get and Wait block until the keys exist or the timeout passes
// (DeadlineExceeded naming the missing keys). The default timeout is 300 s
// (kDefaultStoreTimeout), settable per store and per call.
//
// Core operations every implementation has; optional ones (Append,
// MultiGet, MultiSet, ListKeys) are behind Supports(): an implementation
// without one returns Unimplemented.
//
// Implementations: TcpStore (talks to musterd or a PyTorch TCPStore),
// PrefixStore (namespaces keys of another store), HashStore (in memory,
// for tests). Each documents its own thread-safety; all of them may be used
// from several threads.
#ifndef MUSTER_CORE_INCLUDE_MUSTER_STORE_H_
#define MUSTER_CORE_INCLUDE_MUSTER_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muster {

inline constexpr absl::Duration kDefaultStoreTimeout = absl::Seconds(300);

enum class StoreCapability { kAppend, kMultiGet, kMultiSet, kListKeys };

class Store {
 public:
  virtual ~Store() = default;

  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // Blocks until `key` exists.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;
  // Adds `delta` to the counter at `key` (missing: starts at 0) and returns
  // the new value. FailedPrecondition if the value is not a number.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
  // If the value equals `expected` (or the key is missing and `expected` is
  // empty) store `desired`. Returns the value stored afterwards; for a
  // missing key and non-empty `expected`, returns `expected` (c10d's rule).
  virtual absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                                 absl::string_view desired) = 0;
  // Blocks until every key exists.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // True if every key exists now.
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;
  // True if the key existed.
  virtual absl::StatusOr<bool> DeleteKey(absl::string_view key) = 0;
  virtual absl::StatusOr<int64_t> NumKeys() = 0;

  virtual bool Supports(StoreCapability capability) const = 0;
  // Appends to the value (missing: creates it).
  virtual absl::Status Append(absl::string_view key, absl::string_view value) = 0;
  // Blocks until every key exists; values in the order of `keys`.
  virtual absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                            absl::Duration timeout) = 0;
  virtual absl::Status MultiSet(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) = 0;
  // Every key, sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListKeys() = 0;

  // The same calls with the store's default timeout.
  absl::StatusOr<std::string> Get(absl::string_view key) { return Get(key, timeout()); }
  absl::Status Wait(const std::vector<std::string>& keys) { return Wait(keys, timeout()); }
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys) {
    return MultiGet(keys, timeout());
  }

  absl::Duration timeout() const { return timeout_; }
  void set_timeout(absl::Duration timeout) { timeout_ = timeout; }

 private:
  absl::Duration timeout_ = kDefaultStoreTimeout;
};

}  // namespace muster

#endif  // MUSTER_CORE_INCLUDE_MUSTER_STORE_H_
