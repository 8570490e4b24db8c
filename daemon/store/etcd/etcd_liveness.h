// EtcdLiveness: one musterd's etcd lease, and watches of other musterds'
// leased keys, so that a node that vanishes (power, network, musterd killed)
// is noticed by the others within the lease's TTL.
//
//  - A keeper thread grants a lease (LeaseGrant, `ttl`) and renews it every
//    ttl/3 over a LeaseKeepAlive stream (one stream per renewal, with its own
//    deadline, so a member that hangs never stalls renewal; the next endpoint
//    is tried on failure). Failed renewals are logged. When etcd says the
//    lease is gone (it expired while etcd was unreachable from here), the
//    keeper grants a new one and puts every held key again with it.
//  - Hold(key, value) puts a key with the lease and keeps it (put again after
//    a new lease); Release(key, value) puts it without a lease (it no longer
//    vanishes with this node) and stops keeping it.
//  - WatchLost(prefix, fn) runs an etcd Watch (prev_kv, deletions only) over
//    the keys under `prefix` and calls fn with the keys that vanished while
//    a lease held them, one call per deletion revision (a lease's keys all
//    go in one). A broken stream is resumed from the next revision.
//
// Keys are store keys: etcd keys are options.prefix + key, as in EtcdStore.
//
// Thread-safe: Hold, Release, WatchLost and the cancel functions may be
// called from any thread. The keeper thread and each watch's thread are
// owned by this object / the watch's cancel function.
#ifndef MUSTER_DAEMON_STORE_ETCD_ETCD_LIVENESS_H_
#define MUSTER_DAEMON_STORE_ETCD_ETCD_LIVENESS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/store/etcd/etcd_store.h"

namespace muster {

class EtcdLiveness {
 public:
  // A key that vanished with the lease that held it.
  struct Lost {
    std::string key;    // store key (prefix stripped)
    std::string value;  // what it held (prev_kv)
    int64_t revision = 0;
    int64_t lease = 0;
  };
  using Cancel = std::function<void()>;

  // Checks the options and starts the keeper (the lease is granted as soon
  // as etcd answers; until then Hold only remembers its keys). `ttl` is
  // rounded to whole seconds, at least 1.
  static absl::StatusOr<std::unique_ptr<EtcdLiveness>> Start(const EtcdStoreOptions& options,
                                                             absl::Duration ttl);
  // Stops the keeper and lets the lease expire (not revoked: this node's
  // keys vanish after the TTL, as if it had died, unless released).
  ~EtcdLiveness();

  absl::Status Hold(const std::string& key, const std::string& value);
  absl::Status Release(const std::string& key, const std::string& value);
  // `lost` runs on the watch's own thread; the returned function ends the
  // watch and waits for a running call of `lost` (do not call it from there).
  Cancel WatchLost(const std::string& prefix, std::function<void(const std::vector<Lost>&)> lost);

  absl::Duration ttl() const { return ttl_; }
  // The lease now (0: none granted yet, or lost and not yet granted again).
  int64_t lease_id() const;
  // Leases granted so far (a new one after each loss).
  int64_t leases_granted() const;
  // Tests: stop (true) or resume renewing the lease, as if this node's
  // musterd had been frozen.
  void PauseKeepAliveForTesting(bool paused);
  // Stops the keeper (idempotent); Hold/Release fail afterwards.
  void Stop();

  class Channels;  // etcd endpoints (channels, stubs, auth token)

 private:
  EtcdLiveness(const EtcdStoreOptions& options, absl::Duration ttl,
               std::shared_ptr<Channels> channels);
  // The keeper thread's job: grant, renew, re-grant.
  void Keep();
  // Puts key=value with `lease` (0: none).
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  absl::StatusOr<int64_t> Grant();
  // One renewal: the TTL etcd granted (0 or less: the lease is gone).
  absl::StatusOr<int64_t> KeepAliveOnce(int64_t lease);

  const EtcdStoreOptions options_;
  const absl::Duration ttl_;
  const std::shared_ptr<Channels> channels_;

  // Serializes puts of held keys (Hold, Release, the re-puts after a new
  // lease) so that a released key is never put again with a lease.
  absl::Mutex keys_mu_;
  std::map<std::string, std::string> held_ ABSL_GUARDED_BY(keys_mu_);

  mutable absl::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t granted_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keeper_;  // owned: runs Keep() until Stop()
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_ETCD_ETCD_LIVENESS_H_
