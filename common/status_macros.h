// Small Status helpers. Abseil 20220623 has no public status macros, so the
// project keeps its own. Header-only; no state.
#ifndef MUSTER_COMMON_STATUS_MACROS_H_
#define MUSTER_COMMON_STATUS_MACROS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define MUSTER_CONCAT_INNER_(a, b) a##b
#define MUSTER_CONCAT_(a, b) MUSTER_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status muster_status_ = (expr);          \
    if (!muster_status_.ok()) return muster_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` binds the value of an absl::StatusOr
// or returns its error from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr) \
  MUSTER_ASSIGN_OR_RETURN_IMPL_(MUSTER_CONCAT_(muster_statusor_, __LINE__), lhs, expr)
#define MUSTER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

namespace muster {

// The same status with `context` prepended to its message ("context: msg").
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// Translates an errno value into a Status whose code says what to do next.
absl::Status ErrnoToStatus(int errno_value, absl::string_view context);

}  // namespace muster

#endif  // MUSTER_COMMON_STATUS_MACROS_H_
