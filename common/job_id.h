// The rule for job ids, shared by musterd, the SDK and muster-run: a job id
// names store keys, log directories and dump files, so it is 1-128 letters,
// digits, '_', '-' and '.', and never "." or ".." (no path can be made of it).
// Stateless; thread-safe.
#ifndef MUSTER_COMMON_JOB_ID_H_
#define MUSTER_COMMON_JOB_ID_H_

#include <string>

#include "absl/status/status.h"

namespace muster {

// InvalidArgument naming the id and the rule, else OK.
absl::Status ValidateJobId(const std::string& job_id);

}  // namespace muster

#endif  // MUSTER_COMMON_JOB_ID_H_
