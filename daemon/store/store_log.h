// StoreLog: the store's write-ahead log under --state-dir, so a restarted
// musterd serves the same keys, counters and queues.
//
// File `store.log` is a sequence of records:
//   u32 payload length | u32 CRC-32C of payload | payload
//   payload = u8 Mutation::Type | u64 key length | key | u64 value length | value
// Appends are buffered by Record() and written by Flush(), which the server
// calls before it sends the replies of each loop iteration (so an
// acknowledged write is in the kernel before its reply leaves; with
// `fsync` also on disk). Recovery replays records in order and stops at the
// first torn or corrupt one (a crash mid-write), truncating it away.
// Compaction rewrites the live contents to a new file and renames it over
// the log once the log is more than twice the live data (and > 1 MiB).
//
// Not thread-safe: owned by the store server's loop thread.
#ifndef MUSTER_DAEMON_STORE_STORE_LOG_H_
#define MUSTER_DAEMON_STORE_STORE_LOG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/store/kv_store.h"

namespace muster {

uint32_t Crc32c(const char* data, size_t size);

struct RecoveryStats {
  uint64_t records = 0;
  uint64_t discarded_bytes = 0;  // torn or corrupt tail
};

class StoreLog {
 public:
  // Opens (creating the directory and file if needed) and replays the log
  // into `store`, which must be empty, unlimited and have no listener yet
  // (set its limit after: a lowered limit must not drop recovered data).
  static absl::StatusOr<std::unique_ptr<StoreLog>> Open(const std::string& state_dir, bool fsync,
                                                        KvStore* store, RecoveryStats* stats);
  ~StoreLog();
  StoreLog(const StoreLog&) = delete;
  StoreLog& operator=(const StoreLog&) = delete;

  void Record(const Mutation& mutation);
  // Writes buffered records (and fsyncs if asked). Compacts when due.
  absl::Status Flush(const KvStore& store);
  // Rewrites the log as the live contents of `store`.
  absl::Status Compact(const KvStore& store);

  uint64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return path_; }

 private:
  StoreLog(std::string dir, std::string path, int fd, bool fsync)
      : dir_(std::move(dir)), path_(std::move(path)), fd_(fd), fsync_(fsync) {}

  std::string dir_;
  std::string path_;
  int fd_;
  bool fsync_;
  std::string pending_;
  uint64_t file_bytes_ = 0;
};

// Appends one encoded record for `mutation` to `out`.
void EncodeLogRecord(const Mutation& mutation, std::string* out);

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_LOG_H_
