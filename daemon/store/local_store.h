// LocalStore: a muster::Store over this process's StoreServer, without a
// socket. Each call is a task on the server's loop thread (StoreServer::Post)
// that the calling thread waits for; writes return once the durability log
// holds them (a failed flush fails the call), as for TCP clients. Blocking
// calls (Get, Wait, MultiGet) are woken by the store when the keys appear,
// not polled. Watch() calls back once keys exist, for callers that wait on
// several things at once (musterd's registry: keys or an abort).
//
// Thread-safe; calls block their thread (never the loop's). The server must
// outlive the LocalStore and every Watch it started.
#ifndef MUSTER_DAEMON_STORE_LOCAL_STORE_H_
#define MUSTER_DAEMON_STORE_LOCAL_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/store/store_server.h"
#include "muster/store.h"

namespace muster {

class LocalStore final : public Store {
 public:
  explicit LocalStore(StoreServer* server) : server_(server) {}

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

  // Runs `ready` once (on the loop thread; it must not block) when every key
  // exists, or with UNAVAILABLE if the server stops first. The returned
  // function cancels it (from any thread; idempotent; after it returns,
  // `ready` runs no more).
  using Cancel = std::function<void()>;
  static Cancel Watch(StoreServer* server, std::vector<std::string> keys,
                      std::function<void(absl::Status)> ready);

 private:
  StoreServer* server_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_LOCAL_STORE_H_
