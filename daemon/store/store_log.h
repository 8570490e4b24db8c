// StoreLog: the store's write-ahead log under --state-dir, so a restarted
// musterd serves the same keys, counters and queues.
//
// File `store.log` is a sequence of records:
//   u32 payload length | u32 CRC-32C of payload | payload
//   payload = u8 Mutation::Type | u64 key length | key | u64 value length | value
// A record is "verifiable" when its length fits the file, its payload is
// well formed (type 1..5, key and value lengths add up) and its CRC matches;
// records are found again after damage by scanning for the next verifiable
// one (a false match needs the length, shape and 32-bit CRC to agree).
//
// Acknowledgement: mutations are applied to the KvStore first and Record()ed
// here; Flush() writes the batch (and fdatasyncs with `fsync`) at the end of
// each server loop iteration, before any reply of that iteration leaves. If
// the write or sync fails, Flush() cuts the file back to the last good
// offset (no fragment stays), keeps the error (failing()) and the server
// calls Rollback(), which restores every key the failed batch touched to its
// state in the file, and fails every reply of that iteration that wrote or
// read a key the batch touched (Touched(); the rest read durable state and
// still go out). While failing, Flush() writes
// nothing and the server refuses writes up front; Probe() (the server calls
// it every second) cuts the file back again, appends as many zero bytes as
// the failed batch had and cuts them off; once that works the log accepts
// writes again.
//
// Recovery (Open) replays records in order. The first bad record at offset P
// is a torn tail (a crash mid-write; dropped with a WARNING and truncated)
// only if it is incomplete (its header or payload runs past the end of the
// file, or the rest of the file is zero bytes) and no verifiable record
// follows it. Anything else is corruption, including a complete last record
// with a bad CRC, and a whole last record whose length field was damaged
// (its payload's own lengths give a shorter record the CRC matches): Open
// fails with DataLoss naming the file, P, the bytes after P and the
// verifiable records among them. With `recover`, Open keeps the original as
// store.log.corrupt-<UTC time> (hard link, else a copy), loads every
// verifiable record (skipping damaged bytes), and writes a clean log in its
// place.
//
// Compaction rewrites the live contents to a new file and renames it over
// the log once the log is more than twice the live data (and more than
// min_compact_bytes). Its steps, so that a failure at any of them leaves
// every acknowledged write in the file a restart reads:
//   1. write the live contents to store.log.compact, a slice of
//      compact_slice_bytes after each durable batch (LogCompaction: the
//      mutations meanwhile go to the old log as always and, as needed, to
//      the new file), then fsync it; a failed batch drops the compaction;
//   2. rename it over store.log (a failure so far: the old log stays, the
//      new file is removed, and only the next compaction waits);
//   3. switch to the new file's descriptor (opened in step 1, so nothing can
//      fail here) and close the old one: later writes go to the new file;
//   4. fsync the directory. If that fails, a crash could bring back the old
//      file without what is written later, so the log turns failing (writes
//      are refused) until Probe() syncs the directory.
// Batches follow one order too: write at the end, fdatasync (with fsync),
// and only then is the batch durable and its replies may leave; a failure
// cuts the file back to the last durable batch before anything is replied.
//
// Every system call goes through LogFiles, so a test fails each in turn.
//
// Not thread-safe: owned by the store server's loop thread.
#ifndef MUSTER_DAEMON_STORE_STORE_LOG_H_
#define MUSTER_DAEMON_STORE_STORE_LOG_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/store/kv_store.h"
#include "daemon/store/log_compaction.h"
#include "daemon/store/log_files.h"

namespace muster {

uint32_t Crc32c(const char* data, size_t size);

struct StoreLogOptions {
  bool fsync = false;  // fdatasync every batch (and fsync on compaction)
  // A corrupt log: keep it aside and load what verifies (else DataLoss).
  bool recover = false;
  // Compaction waits until the log is larger than this (and 2x the data).
  uint64_t min_compact_bytes = 1 << 20;
  // Records a compaction writes after each batch (its slice of the loop).
  uint64_t compact_slice_bytes = 1 << 20;
  LogFiles* files = nullptr;  // nullptr: LogFiles::System()
};

struct RecoveryStats {
  uint64_t records = 0;
  uint64_t discarded_bytes = 0;  // torn tail
  // With `recover`: damaged regions skipped, their bytes, and where the
  // original file was kept ("" if it was clean).
  uint64_t corrupt_regions = 0;
  uint64_t corrupt_bytes = 0;
  std::string corrupt_copy;
};

class StoreLog {
 public:
  // Opens (creating the directory and file if needed) and replays the log
  // into `store`, which must be empty, unlimited and have no listener yet
  // (set its limit after: a lowered limit must not drop recovered data).
  // A corrupt log fails with DataLoss unless `recover` (see above).
  static absl::StatusOr<std::unique_ptr<StoreLog>> Open(const std::string& state_dir,
                                                        const StoreLogOptions& options,
                                                        KvStore* store, RecoveryStats* stats);
  ~StoreLog();
  StoreLog(const StoreLog&) = delete;
  StoreLog& operator=(const StoreLog&) = delete;

  void Record(const Mutation& mutation);
  // Writes buffered records (and fsyncs if asked). Compacts when due. On
  // failure (or while failing) the batch stays buffered for Rollback().
  // Writes at most `max_bytes` per call (plus the small records recorded
  // since the last call, so the batch always catches up), so a 16 MiB
  // record does not stall the caller's loop: OK with has_pending() still
  // true means the batch is partly written (records added meanwhile join
  // it) and not yet durable; call again. The file holds whole batches only once Flush says so: a
  // crash mid-batch leaves a torn tail, which recovery drops.
  absl::Status Flush(const KvStore& store, uint64_t max_bytes = UINT64_MAX);
  // Restores every key the buffered batch touched to its state in the file
  // and drops the batch. Mutations it makes are not recorded.
  absl::Status Rollback(KvStore* store);
  // While failing: syncs the directory if a compaction's sync failed, cuts
  // the file back to the last good offset and tries a scratch append; OK
  // (and no longer failing) when all worked.
  absl::Status Probe();
  bool failing() const { return !error_.ok(); }
  // Why the log cannot be written (OK when it can).
  const absl::Status& error() const { return error_; }
  bool has_pending() const { return !pending_.empty(); }
  // True if a buffered (not yet written) record touched `key`.
  bool Touched(absl::string_view key) const {
    return pending_keys_.find(std::string(key)) != pending_keys_.end();
  }
  // Rewrites the log as the live contents of `store`, at once (Flush
  // compacts in slices by itself when due).
  absl::Status Compact(const KvStore& store);

  uint64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return path_; }

 private:
  StoreLog(std::string dir, std::string path, int fd, const StoreLogOptions& options,
           LogFiles* files)
      : dir_(std::move(dir)),
        path_(std::move(path)),
        fd_(fd),
        fsync_(options.fsync),
        min_compact_bytes_(options.min_compact_bytes),
        compact_slice_bytes_(options.compact_slice_bytes),
        files_(files) {}

  // Open's steps: replay the file into `store`; keep a corrupt original.
  absl::Status Replay(KvStore* store, RecoveryStats* stats, bool recover, bool* corrupt);
  absl::Status CorruptAt(const std::string& data, size_t pos, bool incomplete, size_t next,
                         bool damaged_length, uint64_t good_records) const;
  absl::Status KeepOriginal(RecoveryStats* stats);
  absl::Status Fail(absl::Status error);
  // A compaction's steps (see the header): open the new file and take the
  // keys; write a slice (and finish when none is left); drop it.
  absl::Status StartCompaction(const KvStore& store);
  absl::Status ContinueCompaction(const KvStore& store);
  absl::Status FinishCompaction();
  void AbortCompaction();
  void CompactionFailed(const absl::Status& why);

  std::string dir_;
  std::string path_;
  int fd_;  // always open: compaction switches to a descriptor it holds
  bool fsync_;
  uint64_t min_compact_bytes_;
  uint64_t compact_slice_bytes_;
  LogFiles* files_;
  // The compaction in progress (null: none), its new file and its size.
  std::unique_ptr<LogCompaction> compaction_;
  std::string compact_path_;
  int compact_fd_ = -1;
  uint64_t compact_written_ = 0;
  uint64_t compact_synced_ = 0;
  // A compaction renamed the log but the directory is not synced yet.
  bool dir_unsynced_ = false;

  std::string pending_;
  // Bytes of pending_ already written at file_bytes_ (a batch written over
  // several Flush calls).
  uint64_t written_ = 0;
  // Bytes of records up to kSmallRecordBytes recorded since the last Flush
  // (added to its slice).
  static constexpr size_t kSmallRecordBytes = 64 << 10;
  uint64_t small_recorded_ = 0;
  // Keys the pending batch touched (what Rollback restores).
  std::set<std::string> pending_keys_;
  bool rolling_back_ = false;
  // Invariant: the file is exactly file_bytes_ long, all verifiable
  // records, except while failing (then Probe() cuts it back first).
  uint64_t file_bytes_ = 0;
  absl::Status error_;
  uint64_t probe_bytes_ = 4096;
  // Compaction is not retried before the file reaches this size.
  uint64_t next_compact_bytes_ = 0;
};

// Appends one encoded record for `mutation` to `out`.
void EncodeLogRecord(const Mutation& mutation, std::string* out);

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_LOG_H_
