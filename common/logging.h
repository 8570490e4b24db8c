// Minimal leveled logging to stderr, one line per message, prefixed with
// time, level and program name. Abseil 20220623 has no absl/log.
//
//   MLOG(INFO) << "listening on " << address;
//
// Thread-safe: each message is written with one write(2) call.
#ifndef MUSTER_COMMON_LOGGING_H_
#define MUSTER_COMMON_LOGGING_H_

#include <sstream>

#include "absl/strings/string_view.h"

namespace muster {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Default: kInfo (MUSTER_LOG_LEVEL=debug
// lowers it). Call before starting threads.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Name printed in each line; default "muster".
void SetLogProgramName(absl::string_view name);

namespace internal {

// Collects one message and emits it when destroyed.
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace internal
}  // namespace muster

#define MUSTER_LOG_LEVEL_DEBUG ::muster::LogLevel::kDebug
#define MUSTER_LOG_LEVEL_INFO ::muster::LogLevel::kInfo
#define MUSTER_LOG_LEVEL_WARNING ::muster::LogLevel::kWarning
#define MUSTER_LOG_LEVEL_ERROR ::muster::LogLevel::kError

// A for-statement rather than if/else so that MLOG is safe inside an
// unbraced if (no dangling else).
#define MLOG(level)                                                                               \
  for (bool muster_log_on_ = MUSTER_LOG_LEVEL_##level >= ::muster::MinLogLevel(); muster_log_on_; \
       muster_log_on_ = false)                                                                    \
  ::muster::internal::LogMessage(MUSTER_LOG_LEVEL_##level).stream()

#endif  // MUSTER_COMMON_LOGGING_H_
