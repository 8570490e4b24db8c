// The --ready-file: one JSON object written once the daemon serves, so that
// launchers and tests learn the real ports without parsing logs:
//   {"pid":…, "grpc_port":…, "store_port":…, "socket":"…", "version":"…"}
// plus "metrics_port":… when musterd serves /metrics.
// Written to a temporary file and renamed, so readers never see half of it.
#ifndef MUSTER_DAEMON_READY_FILE_H_
#define MUSTER_DAEMON_READY_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace muster {

struct ReadyInfo {
  int64_t pid = 0;
  int grpc_port = 0;
  int store_port = 0;
  std::string socket;
  std::string version;
  int metrics_port = 0;  // written only when /metrics is served
};

std::string ReadyInfoToJson(const ReadyInfo& info);
absl::Status WriteReadyFile(const std::string& path, const ReadyInfo& info);

}  // namespace muster

#endif  // MUSTER_DAEMON_READY_FILE_H_
