#include "daemon/etcd_job_store.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace muster {

JobStoreAccess EtcdJobStore(const EtcdStoreOptions& options, std::shared_ptr<EtcdLiveness> liveness,
                            const std::string& node) {
  JobStoreAccess access;
  access.connect = [options]() -> absl::StatusOr<std::unique_ptr<Store>> {
    ASSIGN_OR_RETURN(std::unique_ptr<EtcdStore> store, EtcdStore::Create(options));
    // As TcpJobStore's: a coordinator's call (and so a shutdown waiting for
    // one) gives up after 30 s of etcd being unreachable, not 300 s.
    store->set_timeout(absl::Seconds(30));
    return std::unique_ptr<Store>(std::move(store));
  };
  if (liveness != nullptr) {
    auto l = std::make_shared<NodeLiveness>();
    l->node = node;
    l->ttl = liveness->ttl();
    l->hold = [liveness](const std::string& key, const std::string& value) {
      return liveness->Hold(key, value);
    };
    l->release = [liveness](const std::string& key, const std::string& value) {
      return liveness->Release(key, value);
    };
    l->watch_lost = [liveness](const std::string& prefix,
                               std::function<void(const std::vector<LostKey>&)> lost) {
      return liveness->WatchLost(
          prefix, [lost = std::move(lost)](const std::vector<EtcdLiveness::Lost>& keys) {
            std::vector<LostKey> out;
            for (const auto& k : keys) out.push_back(LostKey{k.key, k.value, k.revision});
            lost(out);
          });
    };
    access.liveness = std::move(l);
  }
  auto shared = EtcdStore::Create(options);
  if (!shared.ok()) return access;
  std::shared_ptr<EtcdStore> store = std::move(*shared);
  access.watch = [store](std::vector<std::string> keys, std::function<void(absl::Status)> ready) {
    struct State {
      WaitCancel cancel;
      absl::Mutex mu;
      bool cancelled ABSL_GUARDED_BY(mu) = false;
    };
    auto state = std::make_shared<State>();
    // Thread: one watch until the keys exist or the watch is cancelled.
    std::thread([store, keys = std::move(keys), ready = std::move(ready), state] {
      absl::Status s = store->WaitCancellable(keys, absl::Hours(24 * 365), &state->cancel);
      absl::MutexLock lock(&state->mu);
      if (!state->cancelled) ready(s);
    }).detach();
    return JobStoreAccess::Cancel([state] {
      {
        absl::MutexLock lock(&state->mu);
        state->cancelled = true;
      }
      state->cancel.Cancel();
    });
  };
  return access;
}

}  // namespace muster
