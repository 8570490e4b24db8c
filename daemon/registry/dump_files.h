// The flight-recorder dumps under --dump-dir (trace-*.json, written by the
// registry when a group breaks) are bounded in bytes: every user can make
// them (by aborting its own groups), and they share the state disk.
// Stateless; thread-safe (concurrent prunes of one directory may remove a
// file twice, which is harmless).
#ifndef MUSTER_DAEMON_REGISTRY_DUMP_FILES_H_
#define MUSTER_DAEMON_REGISTRY_DUMP_FILES_H_

#include <cstdint>
#include <string>

namespace muster {

// Removes the oldest dumps of `dir` (by modification time, then name) until
// the rest take at most `max_bytes`; returns how many it removed. Other
// files are left alone.
int PruneDumps(const std::string& dir, uint64_t max_bytes);

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_DUMP_FILES_H_
