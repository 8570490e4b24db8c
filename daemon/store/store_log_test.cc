#include "daemon/store/store_log.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

struct Dir {
  std::string path;
  Dir() {
    char tmpl[] = "/tmp/muster-log-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

StoreLogOptions Recovering() {
  StoreLogOptions options;
  options.recover = true;
  return options;
}

std::unique_ptr<StoreLog> OpenInto(const std::string& dir, KvStore* kv, RecoveryStats* stats) {
  auto log = StoreLog::Open(dir, {}, kv, stats);
  REQUIRE(log.ok());
  StoreLog* raw = log->get();
  kv->SetMutationListener([raw](const Mutation& m) { raw->Record(m); });
  return std::move(*log);
}

TEST_CASE("CRC-32C matches the standard check value") {
  CHECK(Crc32c("123456789", 9) == 0xE3069283u);
  // The hardware path (8 bytes at a time, then a byte tail) agrees with a
  // bitwise reference at every length and alignment.
  auto reference = [](const char* data, size_t size) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < size; ++i) {
      c ^= static_cast<uint8_t>(data[i]);
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
  };
  std::string data;
  for (int i = 0; i < 4096 + 64; ++i) data.push_back(static_cast<char>((i * 131 + 7) & 0xFF));
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t size : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096}) {
      CHECK(Crc32c(data.data() + offset, size) == reference(data.data() + offset, size));
    }
  }
}

TEST_CASE("the log replays sets, adds, appends, deletes and queues") {
  Dir dir;
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    CHECK(stats.records == 0);
    REQUIRE(kv.Set("a", "1").ok());
    REQUIRE(kv.Add("n", 5).ok());
    REQUIRE(kv.Add("n", 2).ok());
    REQUIRE(kv.Append("s", "x").ok());
    REQUIRE(kv.Append("s", "y").ok());
    REQUIRE(kv.Set("gone", "v").ok());
    kv.Delete("gone");
    REQUIRE(kv.QueuePush("q", "first").ok());
    REQUIRE(kv.QueuePush("q", "second").ok());
    std::string popped;
    kv.QueuePop("q", &popped);
    REQUIRE(log->Flush(kv).ok());
  }
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  CHECK(stats.records == 10);
  CHECK(stats.discarded_bytes == 0);
  CHECK(*kv.Find("a") == "1");
  CHECK(*kv.Find("n") == "7");
  CHECK(*kv.Find("s") == "xy");
  CHECK(kv.Find("gone") == nullptr);
  std::string v;
  CHECK(kv.QueuePop("q", &v) == 1);
  CHECK(v == "second");
}

TEST_CASE("a 16 MiB batch is written in slices and is durable only once all of it is") {
  Dir dir;
  const std::string big(16 << 20, 'b');
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    REQUIRE(kv.Set("small", "s").ok());
    REQUIRE(log->Flush(kv, 1 << 20).ok());
    CHECK_FALSE(log->has_pending());
    const uint64_t before = log->file_bytes();
    REQUIRE(kv.Set("big", big).ok());
    int calls = 1;
    REQUIRE(log->Flush(kv, 1 << 20).ok());
    CHECK(log->has_pending());  // 1 MiB of it written, not yet durable
    CHECK(log->Touched("big"));
    CHECK(log->file_bytes() == before);
    CHECK(std::filesystem::file_size(dir.path + "/store.log") == before + (1 << 20));
    // A crash now leaves a torn tail: recovery keeps what came before.
    {
      Dir copy;
      std::filesystem::copy_file(dir.path + "/store.log", copy.path + "/store.log");
      KvStore recovered;
      RecoveryStats copy_stats;
      auto reopened = StoreLog::Open(copy.path, {}, &recovered, &copy_stats);
      REQUIRE(reopened.ok());
      CHECK(recovered.Find("small") != nullptr);
      CHECK(recovered.Find("big") == nullptr);
      CHECK(copy_stats.discarded_bytes == (1u << 20));
    }
    // A write made meanwhile joins the batch.
    REQUIRE(kv.Set("later", "l").ok());
    while (log->has_pending()) {
      REQUIRE(log->Flush(kv, 1 << 20).ok());
      ++calls;
    }
    CHECK(calls == 17);  // 16 MiB and two headers' worth, 1 MiB a call
    CHECK(log->file_bytes() == std::filesystem::file_size(dir.path + "/store.log"));
  }
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  REQUIRE(kv.Find("big") != nullptr);
  CHECK(*kv.Find("big") == big);
  CHECK(*kv.Find("later") == "l");
  CHECK(stats.discarded_bytes == 0);
}

TEST_CASE("a batch behind a 16 MiB record catches up while small writes keep coming") {
  Dir dir;
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  REQUIRE(kv.Set("big", std::string(16 << 20, 'b')).ok());
  const std::string small(32 << 10, 's');
  int calls = 0;
  do {
    // 1.25 MiB of small records per call: more than the 1 MiB slice.
    for (int i = 0; i < 40; ++i) REQUIRE(kv.Set(absl::StrCat("small", i), small).ok());
    REQUIRE(log->Flush(kv, 1 << 20).ok());
    ++calls;
  } while (log->has_pending() && calls < 100);
  CHECK_FALSE(log->has_pending());
  CHECK(calls <= 17);
}

TEST_CASE("recovery drops a torn last record and keeps everything before it") {
  Dir dir;
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    REQUIRE(kv.Set("kept", "yes").ok());
    REQUIRE(kv.Set("torn", std::string(1000, 'z')).ok());
    REQUIRE(log->Flush(kv).ok());
  }
  std::string path = dir.path + "/store.log";
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  REQUIRE(::truncate(path.c_str(), st.st_size - 10) == 0);  // cut mid-record
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    CHECK(stats.records == 1);
    CHECK(stats.discarded_bytes > 0);
    CHECK(*kv.Find("kept") == "yes");
    CHECK(kv.Find("torn") == nullptr);
    // New writes after recovery land after the good prefix.
    REQUIRE(kv.Set("after", "1").ok());
    REQUIRE(log->Flush(kv).ok());
  }
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  CHECK(stats.discarded_bytes == 0);
  CHECK(*kv.Find("after") == "1");
  CHECK(*kv.Find("kept") == "yes");
}

std::string ReadFile(const std::string& path) {
  std::string data;
  FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  std::fclose(f);
  return data;
}

void WriteFile(const std::string& path, const std::string& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(data.data(), 1, data.size(), f) == data.size());
  std::fclose(f);
}

// Writes `n` keys k0..k(n-1) (values of 20 bytes); returns each record's offset.
std::vector<uint64_t> WriteKeys(const std::string& dir, int n) {
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir, &kv, &stats);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < n; ++i) {
    offsets.push_back(log->file_bytes());
    REQUIRE(kv.Set("k" + std::to_string(i), std::string(20, 'a' + i % 26)).ok());
    REQUIRE(log->Flush(kv).ok());
  }
  return offsets;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE("a flipped bit anywhere but a torn tail refuses start; --store-recover keeps the rest") {
  // (a) first record, (b) a middle record, (c) the last record's body (a
  // complete record with a bad CRC is corruption, not a torn tail), (d) a
  // middle record's length field, so it seems to run past the end.
  struct Case {
    const char* name;
    int record;
    int byte;  // within the record
  };
  for (Case flip : {Case{"first", 0, 12}, Case{"middle", 5, 20}, Case{"last body", 9, 30},
                    Case{"middle length", 5, 3}}) {
    DYNAMIC_SECTION(flip.name) {
      Dir dir;
      std::vector<uint64_t> offsets = WriteKeys(dir.path, 10);
      std::string path = dir.path + "/store.log";
      std::string data = ReadFile(path);
      uint64_t at = offsets[flip.record] + flip.byte;
      data[at] ^= 0x10;
      WriteFile(path, data);
      {
        KvStore kv;
        RecoveryStats stats;
        auto log = StoreLog::Open(dir.path, {}, &kv, &stats);
        REQUIRE_FALSE(log.ok());
        INFO(log.status().ToString());
        CHECK(log.status().code() == absl::StatusCode::kDataLoss);
        CHECK_THAT(std::string(log.status().message()),
                   Catch::Contains(path) &&
                       Catch::Contains("at byte offset " + std::to_string(offsets[flip.record])) &&
                       Catch::Contains(std::to_string(data.size() - offsets[flip.record]) +
                                       " bytes follow") &&
                       Catch::Contains("holding " + std::to_string(9 - flip.record) +
                                       " verifiable records") &&
                       Catch::Contains("--store-recover"));
        CHECK(ReadFile(path) == data);  // untouched
      }
      KvStore kv;
      RecoveryStats stats;
      auto log = StoreLog::Open(dir.path, Recovering(), &kv, &stats);
      REQUIRE(log.ok());
      CHECK(kv.NumKeys() == 9);
      CHECK(kv.Find("k" + std::to_string(flip.record)) == nullptr);
      CHECK(stats.records == 9);
      CHECK(stats.corrupt_regions == 1);
      REQUIRE_FALSE(stats.corrupt_copy.empty());
      CHECK(ReadFile(stats.corrupt_copy) == data);  // the original, byte for byte
      CHECK(Files(dir.path).size() == 2);
      log->reset();
      // The new log is clean: a plain start loads the same 9 keys.
      KvStore again;
      RecoveryStats again_stats;
      auto reopened = StoreLog::Open(dir.path, {}, &again, &again_stats);
      REQUIRE(reopened.ok());
      CHECK(again.NumKeys() == 9);
      CHECK(again_stats.discarded_bytes == 0);
    }
  }
}

TEST_CASE("a zero-filled tail (blocks allocated before a crash) is dropped as torn") {
  Dir dir;
  WriteKeys(dir.path, 3);
  std::string path = dir.path + "/store.log";
  std::string data = ReadFile(path);
  WriteFile(path, data + std::string(4096, '\0'));
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  CHECK(kv.NumKeys() == 3);
  CHECK(stats.discarded_bytes == 4096);
  CHECK(ReadFile(path) == data);
}

// Makes writes past `bytes` fail with EFBIG in this process (a full disk
// without root); restores the limit when it goes.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    ::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_) == 0);
    Set(bytes);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &saved_); }
  void Set(uint64_t bytes) {
    rlimit r = saved_;
    r.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &r) == 0);
  }
  void Lift() { REQUIRE(::setrlimit(RLIMIT_FSIZE, &saved_) == 0); }

 private:
  rlimit saved_{};
};

TEST_CASE("a failed log write is cut off, rolled back, refused until the log works again") {
  Dir dir;
  std::string path = dir.path + "/store.log";
  uint64_t good_size;
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    REQUIRE(kv.Set("a", "1").ok());
    REQUIRE(kv.QueuePush("q", "x").ok());
    REQUIRE(log->Flush(kv).ok());
    good_size = log->file_bytes();
    {
      FileSizeLimit limit(good_size + 100);  // room for part of the next batch
      REQUIRE(kv.Set("a", "2").ok());
      REQUIRE(kv.Set("big", std::string(1000, 'b')).ok());
      REQUIRE(kv.QueuePush("q", "y").ok());
      absl::Status s = log->Flush(kv);
      CHECK_FALSE(s.ok());
      CHECK(log->failing());
      CHECK_THAT(std::string(log->error().message()), Catch::Contains(path));
      CHECK(ReadFile(path).size() == good_size);  // no fragment
      REQUIRE(log->Rollback(&kv).ok());
      CHECK(*kv.Find("a") == "1");
      CHECK(kv.Find("big") == nullptr);
      CHECK(kv.QueueLen("q") == 1);
      CHECK_FALSE(log->has_pending());
      // Still no room: the probe fails, and a flush writes nothing.
      CHECK_FALSE(log->Probe().ok());
      CHECK(log->failing());
      REQUIRE(kv.Set("c", "3").ok());
      CHECK_FALSE(log->Flush(kv).ok());
      REQUIRE(log->Rollback(&kv).ok());
      CHECK(kv.Find("c") == nullptr);
      CHECK(ReadFile(path).size() == good_size);
      limit.Lift();
      // Room again: the probe clears the failure and writes are logged.
      REQUIRE(log->Probe().ok());
      CHECK_FALSE(log->failing());
      CHECK(ReadFile(path).size() == good_size);
      REQUIRE(kv.Set("d", "4").ok());
      REQUIRE(log->Flush(kv).ok());
    }
  }
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  CHECK(stats.discarded_bytes == 0);
  CHECK(stats.records == 3);
  CHECK(*kv.Find("a") == "1");
  CHECK(*kv.Find("d") == "4");
  CHECK(kv.Find("big") == nullptr);
  CHECK(kv.Find("c") == nullptr);
  CHECK(kv.QueueLen("q") == 1);
}

TEST_CASE("compaction shrinks a log of overwrites to the live data") {
  Dir dir;
  uint64_t compacted_size;
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    for (int i = 0; i < 3000; ++i) {
      REQUIRE(kv.Set("hot", std::string(1000, 'a' + i % 26)).ok());
      REQUIRE(log->Flush(kv).ok());
    }
    compacted_size = log->file_bytes();
    CHECK(compacted_size < 3000 * 1000 / 2);
  }
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  CHECK(*kv.Find("hot") == std::string(1000, 'a' + 2999 % 26));
  CHECK(kv.NumKeys() == 1);
}

}  // namespace
}  // namespace muster
