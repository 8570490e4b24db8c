#include "daemon/store/store_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/store_wire.h"
#include "daemon/store/log_compaction.h"
#include "daemon/store/log_files.h"

namespace muster {
namespace {

constexpr uint32_t kMaxRecordBytes = 1u << 31;
// A compaction's new file is synced every this many bytes.
constexpr uint64_t kCompactSyncBytes = 16 << 20;

struct CrcTable {
  uint32_t entries[256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      entries[i] = c;
    }
  }
};

// pwrite at `offset` (the file's end for the log): a failed or short write
// leaves bytes the caller must cut off.
absl::Status WriteAt(LogFiles* files, int fd, const char* data, size_t size, uint64_t offset,
                     const std::string& path) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = files->Pwrite(fd, data + done, size - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status WriteAt(LogFiles* files, int fd, const std::string& data, uint64_t offset,
                     const std::string& path) {
  return WriteAt(files, fd, data.data(), data.size(), offset, path);
}

absl::Status SyncDir(LogFiles* files, const std::string& dir) {
  int fd = files->Open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", dir));
  int r = files->Fsync(fd);
  int err = errno;
  files->Close(fd);
  if (r != 0) return ErrnoToStatus(err, absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

// Applies one decoded record; false if the payload is malformed.
bool Apply(const char* p, size_t n, KvStore* store) {
  if (n < 1 + 8) return false;
  uint8_t type = static_cast<uint8_t>(p[0]);
  uint64_t key_len, value_len;
  std::memcpy(&key_len, p + 1, 8);
  if (key_len > n - 9 || n - 9 - key_len < 8) return false;
  absl::string_view key(p + 9, key_len);
  std::memcpy(&value_len, p + 9 + key_len, 8);
  if (value_len != n - 17 - key_len) return false;
  absl::string_view value(p + 17 + key_len, value_len);
  std::string ignored;
  switch (static_cast<Mutation::Type>(type)) {
    // The store is replayed without a size limit, so these cannot fail.
    case Mutation::Type::kSet:
      (void)store->Set(key, value);
      return true;
    case Mutation::Type::kDelete:
      store->Delete(key);
      return true;
    case Mutation::Type::kAppend:
      (void)store->Append(key, value);
      return true;
    case Mutation::Type::kQueuePush:
      (void)store->QueuePush(key, value);
      return true;
    case Mutation::Type::kQueuePop:
      store->QueuePop(key, &ignored);
      return true;
  }
  return false;
}

// Reads the first `limit` bytes of the file (all of it with UINT64_MAX).
absl::Status ReadPrefix(LogFiles* files, int fd, uint64_t limit, const std::string& path,
                        std::string* out) {
  out->clear();
  char buf[1 << 16];
  while (out->size() < limit) {
    size_t want = std::min<uint64_t>(sizeof(buf), limit - out->size());
    ssize_t n = files->Pread(fd, buf, want, out->size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read ", path));
    if (n == 0) break;
    out->append(buf, n);
  }
  return absl::OkStatus();
}

// A payload Apply() accepts: known type, key and value lengths that add up.
bool WellFormed(const char* p, size_t n) {
  if (n < 17 || p[0] < 1 || p[0] > 5) return false;
  uint64_t key_len, value_len;
  std::memcpy(&key_len, p + 1, 8);
  if (key_len > n - 17) return false;
  std::memcpy(&value_len, p + 9 + key_len, 8);
  return value_len == n - 17 - key_len;
}

enum class RecordState { kGood, kIncomplete, kBad };

// The record at `pos`: kIncomplete if its header or payload runs past the
// end of `data`, kBad if malformed or its CRC does not match.
RecordState CheckRecord(const std::string& data, size_t pos, uint32_t* len) {
  if (data.size() - pos < 8) return RecordState::kIncomplete;
  uint32_t crc;
  std::memcpy(len, data.data() + pos, 4);
  std::memcpy(&crc, data.data() + pos + 4, 4);
  if (*len > kMaxRecordBytes || data.size() - pos - 8 < *len) return RecordState::kIncomplete;
  const char* payload = data.data() + pos + 8;
  if (!WellFormed(payload, *len) || Crc32c(payload, *len) != crc) return RecordState::kBad;
  return RecordState::kGood;
}

// Whether the incomplete record at `pos` is in fact whole with a damaged
// length field: its payload's own key and value lengths give a shorter
// record that fits the file and matches the CRC. (A torn write leaves a
// prefix of a record, whose CRC covers bytes that are not there.)
bool WholeWithDamagedLength(const std::string& data, size_t pos) {
  const size_t avail = data.size() - pos;
  if (avail < 8 + 17) return false;
  const char* p = data.data() + pos + 8;
  uint32_t crc;
  std::memcpy(&crc, data.data() + pos + 4, 4);
  uint64_t key_len, value_len;
  std::memcpy(&key_len, p + 1, 8);
  if (key_len > avail - 8 - 17) return false;
  std::memcpy(&value_len, p + 9 + key_len, 8);
  if (value_len > avail - 8 - 17 - key_len) return false;
  const size_t len = 17 + key_len + value_len;
  return WellFormed(p, len) && Crc32c(p, len) == crc;
}

// The first offset >= `from` where a verifiable record starts, or npos.
size_t FindRecord(const std::string& data, size_t from) {
  for (size_t q = from; q + 8 + 17 <= data.size(); ++q) {
    uint32_t len;
    if (CheckRecord(data, q, &len) == RecordState::kGood) return q;
  }
  return std::string::npos;
}

// Where verifiable records go on after the bad record at `pos`: right after
// its declared end if a good record starts there (a damaged payload),
// else the next one found by scanning, else npos.
size_t NextRecord(const std::string& data, size_t pos, RecordState state, uint32_t len) {
  uint32_t next_len;
  if (state == RecordState::kBad && pos + 8 + len < data.size() &&
      CheckRecord(data, pos + 8 + len, &next_len) == RecordState::kGood) {
    return pos + 8 + len;
  }
  return FindRecord(data, pos + 1);
}

bool AllZero(const std::string& data, size_t from) {
  for (size_t i = from; i < data.size(); ++i) {
    if (data[i] != 0) return false;
  }
  return true;
}

}  // namespace

namespace {

// `c` is the running (pre-inverted) CRC.
uint32_t Crc32cTable(uint32_t c, const char* data, size_t size) {
  static const CrcTable* table = new CrcTable();
  for (size_t i = 0; i < size; ++i) {
    c = table->entries[(c ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (c >> 8);
  }
  return c;
}

#if defined(__x86_64__)
// SSE4.2's CRC32 instruction computes CRC-32C, 8 bytes at a time: a 16 MiB
// value's record takes about 2 ms instead of the table's 30 ms, which would
// stall the store's loop.
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t c, const char* data,
                                                          size_t size) {
  uint64_t c64 = c;
  for (; size >= 8; data += 8, size -= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<uint32_t>(c64);
  for (; size > 0; ++data, --size) c = _mm_crc32_u8(c, static_cast<uint8_t>(*data));
  return c;
}
#endif

}  // namespace

uint32_t Crc32c(const char* data, size_t size) {
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return Crc32cHardware(0xFFFFFFFFu, data, size) ^ 0xFFFFFFFFu;
#endif
  return Crc32cTable(0xFFFFFFFFu, data, size) ^ 0xFFFFFFFFu;
}

void EncodeLogRecord(const Mutation& mutation, std::string* out) {
  // Written in place (one copy of the value, then one CRC pass over it).
  const uint64_t payload = 1 + 8 + mutation.key.size() + 8 + mutation.value.size();
  const size_t start = out->size();
  out->reserve(start + 8 + payload);
  wire::PutU32(out, static_cast<uint32_t>(payload));
  wire::PutU32(out, 0);  // the CRC, below
  wire::PutU8(out, static_cast<uint8_t>(mutation.type));
  wire::PutBytes(out, mutation.key);
  wire::PutBytes(out, mutation.value);
  std::string crc;
  wire::PutU32(&crc, Crc32c(out->data() + start + 8, payload));
  out->replace(start + 4, 4, crc);
}

absl::StatusOr<std::unique_ptr<StoreLog>> StoreLog::Open(const std::string& state_dir,
                                                         const StoreLogOptions& options,
                                                         KvStore* store, RecoveryStats* stats) {
  LogFiles* files = options.files != nullptr ? options.files : LogFiles::System();
  if (files->Mkdir(state_dir, 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("cannot create --state-dir ", state_dir));
  }
  std::string path = state_dir + "/store.log";
  int fd = files->Open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::unique_ptr<StoreLog> log(new StoreLog(state_dir, path, fd, options, files));
  bool corrupt = false;
  RETURN_IF_ERROR(log->Replay(store, stats, options.recover, &corrupt));
  if (corrupt) {
    RETURN_IF_ERROR(log->KeepOriginal(stats));
    RETURN_IF_ERROR(log->Compact(*store));
    MLOG(WARNING) << "store log " << path << ": --store-recover kept the original as "
                  << stats->corrupt_copy << ", loaded " << stats->records
                  << " verifiable records, skipped " << stats->corrupt_bytes << " bytes in "
                  << stats->corrupt_regions << " damaged regions, and wrote a clean log";
  }
  log->next_compact_bytes_ = 0;
  return log;
}

absl::Status StoreLog::Replay(KvStore* store, RecoveryStats* stats, bool recover, bool* corrupt) {
  // Read the whole file; logs are compacted, so this is about the live size.
  std::string data;
  RETURN_IF_ERROR(ReadPrefix(files_, fd_, UINT64_MAX, path_, &data));
  size_t pos = 0;
  while (pos < data.size()) {
    uint32_t len = 0;
    RecordState state = CheckRecord(data, pos, &len);
    if (state == RecordState::kGood) {
      (void)Apply(data.data() + pos + 8, len, store);  // well formed: cannot fail
      pos += 8 + len;
      ++stats->records;
      continue;
    }
    const bool damaged_length =
        state == RecordState::kIncomplete && WholeWithDamagedLength(data, pos);
    size_t next = NextRecord(data, pos, state, len);
    if (next == std::string::npos && !damaged_length &&
        (state == RecordState::kIncomplete || AllZero(data, pos))) {
      stats->discarded_bytes = data.size() - pos;
      MLOG(WARNING) << "store log " << path_ << ": dropping a torn last record ("
                    << stats->discarded_bytes << " bytes at offset " << pos << ", after record "
                    << stats->records << "), left by a crash mid-write";
      data.resize(pos);
      if (!*corrupt && files_->Ftruncate(fd_, pos) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
      }
      break;
    }
    if (!recover) {
      return CorruptAt(data, pos, state == RecordState::kIncomplete, next, damaged_length,
                       stats->records);
    }
    size_t skip_to = next == std::string::npos ? data.size() : next;
    MLOG(WARNING) << "store log " << path_ << ": --store-recover: skipping " << skip_to - pos
                  << " damaged bytes at offset " << pos;
    ++stats->corrupt_regions;
    stats->corrupt_bytes += skip_to - pos;
    *corrupt = true;
    pos = skip_to;
  }
  file_bytes_ = data.size();
  return absl::OkStatus();
}

absl::Status StoreLog::CorruptAt(const std::string& data, size_t pos, bool incomplete, size_t next,
                                 bool damaged_length, uint64_t good_records) const {
  uint64_t following = 0;
  for (size_t q = next; q != std::string::npos;) {
    uint32_t n = 0;
    RecordState s = CheckRecord(data, q, &n);
    if (s == RecordState::kGood) {
      ++following;
      q += 8 + n;
    } else {
      q = NextRecord(data, q, s, n);
    }
  }
  const char* what = damaged_length ? "a whole record whose length field is damaged"
                     : incomplete   ? "record length runs past the end of the file"
                                    : "checksum or record format mismatch";
  return absl::DataLossError(
      absl::StrCat("store log ", path_, " is corrupt at byte offset ", pos, " (", what, "), after ",
                   good_records, " good records; ", data.size() - pos,
                   " bytes follow from there to the end of the file, holding ", following,
                   " verifiable records. musterd refuses to start rather than drop them silently: "
                   "restart with --store-recover to keep the original file aside and load every "
                   "verifiable record, or restore ",
                   path_, " from a backup"));
}

absl::Status StoreLog::KeepOriginal(RecoveryStats* stats) {
  // Keep the damaged original, byte for byte, then (the caller) replace it
  // by a clean log.
  std::string aside;
  for (int attempt = 0;; ++attempt) {
    aside = absl::StrCat(path_, ".corrupt-",
                         absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()),
                         attempt == 0 ? "" : absl::StrCat("-", attempt));
    if (files_->Link(path_, aside) == 0) break;
    if (errno == EEXIST && attempt < 100) continue;
    // No hard links here: copy the file as it is.
    int copy = files_->Open(aside, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (copy < 0) return ErrnoToStatus(errno, absl::StrCat("create ", aside));
    std::string original;
    absl::Status written = ReadPrefix(files_, fd_, UINT64_MAX, path_, &original);
    if (written.ok()) written = WriteAt(files_, copy, original, 0, aside);
    if (written.ok() && files_->Fsync(copy) != 0) written = ErrnoToStatus(errno, "fsync " + aside);
    files_->Close(copy);
    RETURN_IF_ERROR(written);
    break;
  }
  RETURN_IF_ERROR(SyncDir(files_, dir_));
  stats->corrupt_copy = aside;
  return absl::OkStatus();
}

StoreLog::~StoreLog() {
  AbortCompaction();
  files_->Close(fd_);
}

void StoreLog::Record(const Mutation& mutation) {
  if (rolling_back_) return;
  const size_t before = pending_.size();
  EncodeLogRecord(mutation, &pending_);
  if (pending_.size() - before <= kSmallRecordBytes) small_recorded_ += pending_.size() - before;
  pending_keys_.emplace(mutation.key);
  if (compaction_ != nullptr) compaction_->Record(mutation);
}

absl::Status StoreLog::Fail(absl::Status error) {
  // No fragment may stay: cut back to the last good record (Probe retries
  // this if it fails now).
  (void)files_->Ftruncate(fd_, file_bytes_);
  // The compaction recorded the failed batch's mutations: it is dropped.
  AbortCompaction();
  probe_bytes_ = std::min<uint64_t>(std::max<uint64_t>(pending_.size(), 4096), 1 << 20);
  written_ = 0;  // the batch is cut off whole
  error_ = error;
  return error;
}

absl::Status StoreLog::Flush(const KvStore& store, uint64_t max_bytes) {
  if (pending_.empty()) {
    if (compaction_ != nullptr && !failing()) (void)ContinueCompaction(store);
    return absl::OkStatus();
  }
  if (failing()) return error_;
  // Small records recorded since the last call are written on top of the
  // slice, so a batch behind a large record always catches up, however
  // many small writes keep arriving.
  uint64_t budget = max_bytes;
  if (budget != UINT64_MAX) budget += small_recorded_;
  small_recorded_ = 0;
  const uint64_t n = std::min<uint64_t>(budget, pending_.size() - written_);
  if (absl::Status s =
          WriteAt(files_, fd_, pending_.data() + written_, n, file_bytes_ + written_, path_);
      !s.ok()) {
    return Fail(s);
  }
  written_ += n;
  if (written_ < pending_.size()) return absl::OkStatus();  // more in the next call
  if (fsync_ && files_->Fdatasync(fd_) != 0) {
    return Fail(ErrnoToStatus(errno, absl::StrCat("fsync ", path_)));
  }
  file_bytes_ += pending_.size();
  written_ = 0;
  if (pending_.capacity() > (1 << 20)) {
    std::string().swap(pending_);  // a large batch's buffer is not kept
  } else {
    pending_.clear();
  }
  pending_keys_.clear();
  // The batch is durable: a compaction may take its next slice (or start).
  if (compaction_ == nullptr && file_bytes_ > min_compact_bytes_ &&
      file_bytes_ > 2 * store.total_bytes() + min_compact_bytes_ &&
      file_bytes_ >= next_compact_bytes_) {
    if (absl::Status s = StartCompaction(store); !s.ok()) CompactionFailed(s);
  }
  if (compaction_ != nullptr) (void)ContinueCompaction(store);  // failures are logged
  return absl::OkStatus();
}

void StoreLog::CompactionFailed(const absl::Status& why) {
  next_compact_bytes_ = file_bytes_ + min_compact_bytes_;
  MLOG(WARNING) << "store log: compaction failed (retried after " << min_compact_bytes_
                << " more bytes): " << why.message();
}

absl::Status StoreLog::StartCompaction(const KvStore& store) {
  compact_path_ = path_ + ".compact";
  compact_fd_ = files_->Open(compact_path_, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (compact_fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("create ", compact_path_));
  compact_written_ = 0;
  compact_synced_ = 0;
  compaction_ = std::make_unique<LogCompaction>(store);
  return absl::OkStatus();
}

absl::Status StoreLog::ContinueCompaction(const KvStore& store) {
  const bool done = compaction_->Step(store, compact_slice_bytes_);
  std::string& out = compaction_->out();
  absl::Status s = WriteAt(files_, compact_fd_, out, compact_written_, compact_path_);
  compact_written_ += out.size();
  out.clear();
  // Synced as it goes, so the last step's fsync (on the loop) is short.
  if (s.ok() && compact_written_ - compact_synced_ >= kCompactSyncBytes) {
    if (files_->Fdatasync(compact_fd_) != 0) s = ErrnoToStatus(errno, "fsync " + compact_path_);
    compact_synced_ = compact_written_;
  }
  if (s.ok() && !done) return s;  // the next slice after the next batch
  if (s.ok()) s = FinishCompaction();
  if (!s.ok()) {
    AbortCompaction();
    CompactionFailed(s);
  }
  return s;
}

void StoreLog::AbortCompaction() {
  if (compaction_ == nullptr) return;
  compaction_.reset();
  files_->Close(compact_fd_);
  files_->Unlink(compact_path_);
  compact_fd_ = -1;
}

absl::Status StoreLog::Rollback(KvStore* store) {
  std::set<std::string> keys;
  keys.swap(pending_keys_);
  pending_.clear();
  if (keys.empty()) return absl::OkStatus();
  // The durable state of those keys: replay the file (the failure path only).
  std::string data;
  RETURN_IF_ERROR(ReadPrefix(files_, fd_, file_bytes_, path_, &data));
  KvStore durable;
  for (size_t pos = 0; pos < data.size();) {
    uint32_t len = 0;
    if (CheckRecord(data, pos, &len) != RecordState::kGood) {
      return absl::DataLossError(
          absl::StrCat("store log ", path_, ": unreadable record at offset ", pos, " in rollback"));
    }
    (void)Apply(data.data() + pos + 8, len, &durable);
    pos += 8 + len;
  }
  rolling_back_ = true;
  // Remove first, then restore, so the total never exceeds what it was.
  std::string ignored;
  for (const std::string& key : keys) {
    store->Delete(key);
    while (store->QueuePop(key, &ignored) > 1) {
    }
  }
  absl::Status result;
  for (const std::string& key : keys) {
    if (const std::string* v = durable.Find(key)) {
      if (absl::Status s = store->Set(key, *v); !s.ok() && result.ok()) result = s;
    }
  }
  durable.ForEachQueueItem([&](absl::string_view key, absl::string_view value) {
    if (keys.count(std::string(key)) == 0) return;
    if (absl::Status s = store->QueuePush(key, value); !s.ok() && result.ok()) result = s;
  });
  rolling_back_ = false;
  return result;
}

absl::Status StoreLog::Probe() {
  if (!failing()) return absl::OkStatus();
  // A compaction's rename first reaches the disk (until then a crash could
  // bring back the old file, without what was written since).
  if (dir_unsynced_) {
    RETURN_IF_ERROR(SyncDir(files_, dir_));
    dir_unsynced_ = false;
  }
  // Try the log itself: zeros where the failed batch would go, then cut them
  // off again. (A crash in between leaves a zero tail, which recovery
  // drops as torn.)
  if (files_->Ftruncate(fd_, file_bytes_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
  }
  absl::Status s = WriteAt(files_, fd_, std::string(probe_bytes_, '\0'), file_bytes_, path_);
  if (s.ok() && fsync_ && files_->Fdatasync(fd_) != 0) {
    s = ErrnoToStatus(errno, "fsync " + path_);
  }
  if (files_->Ftruncate(fd_, file_bytes_) != 0 && s.ok()) {
    s = ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
  }
  if (!s.ok()) return s;
  error_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status StoreLog::Compact(const KvStore& store) {
  if (compaction_ == nullptr) RETURN_IF_ERROR(StartCompaction(store));
  while (compaction_ != nullptr) RETURN_IF_ERROR(ContinueCompaction(store));
  return absl::OkStatus();
}

absl::Status StoreLog::FinishCompaction() {
  // Steps 1-3 (see the header): the new file is complete; synced, then
  // renamed over the log. A failure before the rename leaves the old log.
  if (files_->Fsync(compact_fd_) != 0) return ErrnoToStatus(errno, "fsync " + compact_path_);
  if (files_->Rename(compact_path_, path_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", compact_path_, " to ", path_));
  }
  compaction_.reset();
  const int fd = compact_fd_;
  compact_fd_ = -1;
  // Step 4: the new file is the log from here on, with no call that can
  // fail in between: later writes go where a restart reads them. The old
  // file (the same records) is closed, so its blocks are freed.
  files_->Close(fd_);
  fd_ = fd;
  const uint64_t before = file_bytes_;
  file_bytes_ = compact_written_;
  // Step 5: the rename reaches the disk. Until it does, a crash could bring
  // back the old file without what is written now, so writes are refused
  // (failing) and Probe() retries the sync.
  if (absl::Status synced = SyncDir(files_, dir_); !synced.ok()) {
    dir_unsynced_ = true;
    probe_bytes_ = 4096;
    error_ = absl::UnavailableError(
        absl::StrCat("the store log's directory could not be synced after a compaction (",
                     synced.message(), "); writes wait until it can"));
    MLOG(WARNING) << "store log: " << error_.message();
    return absl::OkStatus();  // compacted; the log refuses writes until probed
  }
  MLOG(INFO) << "compacted store log " << path_ << ": " << before << " -> " << file_bytes_
             << " bytes";
  return absl::OkStatus();
}

}  // namespace muster
