#include "common/job_id.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace muster {

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty() || job_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id must be 1-128 characters, got '", job_id.substr(0, 256), "'"));
  }
  if (job_id == "." || job_id == "..") {
    return absl::InvalidArgumentError(absl::StrCat("job id may not be '", job_id, "'"));
  }
  for (char c : job_id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("job id '", job_id, "' may only use letters, digits, '_', '-', '.'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace muster
