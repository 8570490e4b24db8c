#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace muster {
namespace {

LogLevel InitialLevel() {
  const char* env = std::getenv("MUSTER_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string value = absl::AsciiStrToLower(env);
  if (value == "debug") return LogLevel::kDebug;
  if (value == "warning") return LogLevel::kWarning;
  if (value == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel> min_level{InitialLevel()};
std::string* program_name = new std::string("muster");

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

}  // namespace

void SetMinLogLevel(LogLevel level) { min_level.store(level); }
LogLevel MinLogLevel() { return min_level.load(std::memory_order_relaxed); }
void SetLogProgramName(absl::string_view name) { *program_name = std::string(name); }

namespace internal {

LogMessage::~LogMessage() {
  std::string line = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone());
  line += LevelName(level_);
  line += ' ';
  line += *program_name;
  line += ": ";
  line += stream_.str();
  line += '\n';
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace muster
