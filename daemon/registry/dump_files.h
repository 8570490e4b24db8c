// The flight-recorder dumps under --dump-dir (trace-*.json, written by the
// registry when a group breaks): each is the job's user's alone, and all of
// them are bounded in bytes (every user can make them by aborting its own
// groups, and they share the state disk).
// Stateless; thread-safe (concurrent prunes of one directory may remove a
// file twice, which is harmless).
#ifndef MUSTER_DAEMON_REGISTRY_DUMP_FILES_H_
#define MUSTER_DAEMON_REGISTRY_DUMP_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace muster {

// Writes `text` to `path` inside `dir` (created mode 0711: nobody else can
// list it) through a temporary file renamed into place; the file is mode
// 0600 and, when musterd runs as root, belongs to `owner_uid` (the job's
// user; -1 or 0: root keeps it). A symlink at the temporary path is not
// followed.
absl::Status WriteDump(const std::string& dir, const std::string& path, const std::string& text,
                       int64_t owner_uid);

// Removes the oldest dumps of `dir` (by modification time, then name) until
// the rest take at most `max_bytes`; returns how many it removed. Other
// files are left alone.
int PruneDumps(const std::string& dir, uint64_t max_bytes);

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_DUMP_FILES_H_
