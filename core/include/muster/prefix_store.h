// PrefixStore: a namespace inside another store. Every key becomes
// "<prefix>/<key>" (c10d's PrefixStore joins the same way), so groups and
// jobs sharing one store never see each other's keys. NumKeys counts the
// whole underlying store (as c10d does); ListKeys lists only this prefix,
// with the prefix removed.
//
// Thread-safe if the underlying store is.
#ifndef MUSTER_CORE_INCLUDE_MUSTER_PREFIX_STORE_H_
#define MUSTER_CORE_INCLUDE_MUSTER_PREFIX_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "muster/store.h"

namespace muster {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  bool Supports(StoreCapability capability) const override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<std::vector<std::string>> ListKeys() override;
  using Store::Get;
  using Store::MultiGet;
  using Store::Wait;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string Key(absl::string_view key) const;
  std::vector<std::string> Keys(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace muster

#endif  // MUSTER_CORE_INCLUDE_MUSTER_PREFIX_STORE_H_
