// The NCCL unique-id exchange for one communicator, through the job's
// store: the group's rank 0 generates the id and publishes it under `key`
// (the group's name and the job attempt's generation are part of the key);
// every other rank waits for it. Waits run in short slices so that a broken
// group (abort_reason non-empty) stops them at once.
//
// Thread-safe if `store` is.
#ifndef MUSTER_DAEMON_GPU_UID_RENDEZVOUS_H_
#define MUSTER_DAEMON_GPU_UID_RENDEZVOUS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "muster/store.h"

namespace muster {

// "muster/<job>/<generation>/nccl/<group>/<epoch>/uid": `epoch` tells apart
// successive communicators of one group name (e.g. after a destroy).
std::string UniqueIdKey(const std::string& job_id, int64_t generation, const std::string& group,
                        int64_t epoch);

// Rank 0 (`is_root`) calls `generate` and publishes its result; others read
// it. Returns the id's bytes (checked to be `id_bytes` long).
// DeadlineExceeded names the key and the group rank 0 that never published;
// Aborted carries `abort_reason()`.
absl::StatusOr<std::string> ExchangeUniqueId(
    Store& store, const std::string& key, bool is_root, size_t id_bytes,
    const std::function<absl::StatusOr<std::string>()>& generate, absl::Time deadline,
    const std::function<std::string()>& abort_reason);

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_UID_RENDEZVOUS_H_
