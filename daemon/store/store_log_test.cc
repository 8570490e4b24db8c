#include "daemon/store/store_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

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

std::unique_ptr<StoreLog> OpenInto(const std::string& dir, KvStore* kv, RecoveryStats* stats) {
  auto log = StoreLog::Open(dir, false, kv, stats);
  REQUIRE(log.ok());
  StoreLog* raw = log->get();
  kv->SetMutationListener([raw](const Mutation& m) { raw->Record(m); });
  return std::move(*log);
}

TEST_CASE("CRC-32C matches the standard check value") {
  CHECK(Crc32c("123456789", 9) == 0xE3069283u);
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

TEST_CASE("a corrupted byte stops replay at that record") {
  Dir dir;
  {
    KvStore kv;
    RecoveryStats stats;
    auto log = OpenInto(dir.path, &kv, &stats);
    REQUIRE(kv.Set("one", "1").ok());
    REQUIRE(kv.Set("two", "2").ok());
    REQUIRE(log->Flush(kv).ok());
  }
  std::string path = dir.path + "/store.log";
  int fd = ::open(path.c_str(), O_RDWR);
  struct stat st;
  ::fstat(fd, &st);
  char byte = 'X';
  REQUIRE(::pwrite(fd, &byte, 1, st.st_size - 1) == 1);  // inside record two
  ::close(fd);
  KvStore kv;
  RecoveryStats stats;
  auto log = OpenInto(dir.path, &kv, &stats);
  CHECK(stats.records == 1);
  CHECK(kv.Find("one") != nullptr);
  CHECK(kv.Find("two") == nullptr);
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
