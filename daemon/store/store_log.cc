#include "daemon/store/store_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/store_wire.h"

namespace muster {
namespace {

constexpr uint64_t kMinCompactBytes = 1 << 20;
constexpr uint32_t kMaxRecordBytes = 1u << 31;

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

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", dir));
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
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

}  // namespace

uint32_t Crc32c(const char* data, size_t size) {
  static const CrcTable* table = new CrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    c = table->entries[(c ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (c >> 8);
  }
  return c ^ 0xFFFFFFFFu;
}

void EncodeLogRecord(const Mutation& mutation, std::string* out) {
  std::string payload;
  wire::PutU8(&payload, static_cast<uint8_t>(mutation.type));
  wire::PutBytes(&payload, mutation.key);
  wire::PutBytes(&payload, mutation.value);
  wire::PutU32(out, static_cast<uint32_t>(payload.size()));
  wire::PutU32(out, Crc32c(payload.data(), payload.size()));
  out->append(payload);
}

absl::StatusOr<std::unique_ptr<StoreLog>> StoreLog::Open(const std::string& state_dir, bool fsync,
                                                         KvStore* store, RecoveryStats* stats) {
  if (::mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("cannot create --state-dir ", state_dir));
  }
  std::string path = state_dir + "/store.log";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::unique_ptr<StoreLog> log(new StoreLog(state_dir, path, fd, fsync));

  // Read the whole file; logs are compacted, so this is about the live size.
  std::string data;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read ", path));
    if (n == 0) break;
    data.append(buf, n);
  }
  size_t pos = 0;
  while (data.size() - pos >= 8) {
    uint32_t len, crc;
    std::memcpy(&len, data.data() + pos, 4);
    std::memcpy(&crc, data.data() + pos + 4, 4);
    if (len > kMaxRecordBytes || data.size() - pos - 8 < len) break;
    const char* payload = data.data() + pos + 8;
    if (Crc32c(payload, len) != crc || !Apply(payload, len, store)) break;
    pos += 8 + len;
    ++stats->records;
  }
  stats->discarded_bytes = data.size() - pos;
  if (stats->discarded_bytes > 0) {
    MLOG(WARNING) << "store log " << path << ": discarding " << stats->discarded_bytes
                  << " bytes of torn or corrupt records after record " << stats->records;
    if (::ftruncate(fd, pos) != 0) return ErrnoToStatus(errno, absl::StrCat("truncate ", path));
  }
  if (::lseek(fd, pos, SEEK_SET) < 0) return ErrnoToStatus(errno, absl::StrCat("seek ", path));
  log->file_bytes_ = pos;
  return log;
}

StoreLog::~StoreLog() { ::close(fd_); }

void StoreLog::Record(const Mutation& mutation) { EncodeLogRecord(mutation, &pending_); }

absl::Status StoreLog::Flush(const KvStore& store) {
  if (pending_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(WriteAll(fd_, pending_, path_));
  file_bytes_ += pending_.size();
  pending_.clear();
  if (fsync_ && ::fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path_));
  if (file_bytes_ > kMinCompactBytes && file_bytes_ > 2 * store.total_bytes() + kMinCompactBytes) {
    return Compact(store);
  }
  return absl::OkStatus();
}

absl::Status StoreLog::Compact(const KvStore& store) {
  std::string tmp_path = path_ + ".compact";
  std::string data;
  for (const std::string& key : store.ListKeys()) {
    EncodeLogRecord(Mutation{Mutation::Type::kSet, key, *store.Find(key)}, &data);
  }
  store.ForEachQueueItem([&data](absl::string_view key, absl::string_view value) {
    EncodeLogRecord(Mutation{Mutation::Type::kQueuePush, key, value}, &data);
  });
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", tmp_path));
  absl::Status written = WriteAll(fd, data, tmp_path);
  if (written.ok() && ::fsync(fd) != 0) written = ErrnoToStatus(errno, "fsync " + tmp_path);
  if (!written.ok()) {
    ::close(fd);
    ::unlink(tmp_path.c_str());
    return written;
  }
  if (::rename(tmp_path.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp_path.c_str());
    return ErrnoToStatus(err, absl::StrCat("rename ", tmp_path));
  }
  RETURN_IF_ERROR(SyncDir(dir_));
  uint64_t before = file_bytes_;
  ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("reopen ", path_));
  file_bytes_ = data.size();
  MLOG(INFO) << "compacted store log " << path_ << ": " << before << " -> " << file_bytes_
             << " bytes";
  return absl::OkStatus();
}

}  // namespace muster
