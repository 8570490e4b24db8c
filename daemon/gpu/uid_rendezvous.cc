#include "daemon/gpu/uid_rendezvous.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {

std::string UniqueIdKey(const std::string& job_id, int64_t generation, const std::string& group,
                        int64_t epoch) {
  return absl::StrCat("muster/", job_id, "/", generation, "/nccl/", group, "/", epoch, "/uid");
}

absl::StatusOr<std::string> ExchangeUniqueId(
    Store& store, const std::string& key, bool is_root, size_t id_bytes,
    const std::function<absl::StatusOr<std::string>()>& generate, absl::Time deadline,
    const std::function<std::string()>& abort_reason) {
  if (is_root) {
    absl::StatusOr<std::string> id = generate();
    if (!id.ok()) return id.status();
    if (id->size() != id_bytes) {
      return absl::InternalError(
          absl::StrCat("NCCL unique id has ", id->size(), " bytes, expected ", id_bytes));
    }
    if (absl::Status s = store.Set(key, *id); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("publishing NCCL unique id ", key, ": ", s.message()));
    }
    return id;
  }
  const absl::Duration slice = absl::Milliseconds(200);
  while (true) {
    if (std::string reason = abort_reason(); !reason.empty()) {
      return absl::AbortedError(reason);
    }
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("group rank 0 never published the NCCL unique id (store key ", key, ")"));
    }
    absl::Status waited = store.Wait({key}, std::min(left, slice));
    if (waited.ok()) break;
    if (waited.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(waited.code(),
                          absl::StrCat("waiting for NCCL unique id ", key, ": ", waited.message()));
    }
  }
  absl::StatusOr<std::string> id = store.Get(key, absl::Seconds(1));
  if (!id.ok()) return id.status();
  if (id->size() != id_bytes) {
    return absl::DataLossError(absl::StrCat("NCCL unique id under ", key, " has ", id->size(),
                                            " bytes, expected ", id_bytes));
  }
  return id;
}

}  // namespace muster
