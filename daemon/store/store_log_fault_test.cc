// The store log under injected system-call failures: a workload of writes,
// batches, compactions and a recovery runs once per system call the log
// makes, with that one call failing; after each, the in-memory store holds
// exactly the acknowledged state and a restart reads exactly it back. Also:
// compactions leave no descriptor or deleted file behind.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/store/log_files.h"
#include "daemon/store/store_log.h"

namespace muster {
namespace {

struct Dir {
  std::string path;
  Dir() {
    char tmpl[] = "/tmp/muster-logfault-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

// The real calls, except call number `fail_at` (counting from 1), which
// fails with an errno fitting the call. A failing close still closes (as
// Linux does).
class FaultyFiles : public LogFiles {
 public:
  int fail_at = 0;  // 0: none
  int calls = 0;
  std::string failed;  // which call failed, for the test's messages

  int Mkdir(const std::string& path, mode_t mode) override {
    return Fault("mkdir", EACCES) ? -1 : System()->Mkdir(path, mode);
  }
  int Open(const std::string& path, int flags, mode_t mode) override {
    return Fault("open " + Base(path), EMFILE) ? -1 : System()->Open(path, flags, mode);
  }
  int Close(int fd) override {
    int r = System()->Close(fd);
    return Fault("close", EIO) ? -1 : r;
  }
  ssize_t Pread(int fd, void* data, size_t size, off_t offset) override {
    return Fault("pread", EIO) ? -1 : System()->Pread(fd, data, size, offset);
  }
  ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) override {
    return Fault("pwrite", ENOSPC) ? -1 : System()->Pwrite(fd, data, size, offset);
  }
  int Fsync(int fd) override { return Fault("fsync", EIO) ? -1 : System()->Fsync(fd); }
  int Fdatasync(int fd) override { return Fault("fdatasync", EIO) ? -1 : System()->Fdatasync(fd); }
  int Ftruncate(int fd, off_t size) override {
    return Fault("ftruncate", EIO) ? -1 : System()->Ftruncate(fd, size);
  }
  int Rename(const std::string& from, const std::string& to) override {
    return Fault("rename", EIO) ? -1 : System()->Rename(from, to);
  }
  int Link(const std::string& from, const std::string& to) override {
    return Fault("link", EIO) ? -1 : System()->Link(from, to);
  }
  int Unlink(const std::string& path) override {
    return Fault("unlink", EIO) ? -1 : System()->Unlink(path);
  }

 private:
  static LogFiles* System() { return LogFiles::System(); }
  static std::string Base(const std::string& path) {
    return path.substr(path.find_last_of('/') + 1);
  }
  bool Fault(const std::string& what, int error) {
    if (++calls != fail_at) return false;
    failed = absl::StrCat("call ", calls, " (", what, ")");
    errno = error;
    return true;
  }
};

// Keys and values, then queue items in order: what a store holds.
using Snapshot = std::map<std::string, std::string>;
Snapshot Of(const KvStore& kv) {
  Snapshot s;
  for (const std::string& key : kv.ListKeys()) s[key] = *kv.Find(key);
  std::map<std::string, int> items;  // numbered per queue: queues come in no order
  kv.ForEachQueueItem([&](absl::string_view key, absl::string_view value) {
    s[absl::StrCat("queue ", key, " #", items[std::string(key)]++)] = std::string(value);
  });
  return s;
}

StoreLogOptions Options(LogFiles* files) {
  StoreLogOptions options;
  options.fsync = true;
  options.min_compact_bytes = 64 << 10;    // several compactions in a short run
  options.compact_slice_bytes = 16 << 10;  // each over several batches
  options.files = files;
  return options;
}

// Opens the log under `dir` into `kv` and records kv's mutations in it.
std::unique_ptr<StoreLog> OpenLogged(const std::string& dir, const StoreLogOptions& options,
                                     KvStore* kv) {
  RecoveryStats stats;
  auto log = StoreLog::Open(dir, options, kv, &stats);
  REQUIRE(log.ok());
  StoreLog* raw = log->get();
  kv->SetMutationListener([raw](const Mutation& m) { raw->Record(m); });
  return std::move(*log);
}

// A log holding a few records and a torn tail (half a record), so that
// recovery reads, drops and truncates.
Snapshot Prepare(const std::string& dir) {
  KvStore kv;
  std::unique_ptr<StoreLog> log = OpenLogged(dir, Options(nullptr), &kv);
  REQUIRE(kv.Set("before", "restart").ok());
  REQUIRE(kv.Add("n", 1).ok());
  REQUIRE(log->Flush(kv).ok());
  Snapshot acknowledged = Of(kv);
  std::string torn;
  EncodeLogRecord(Mutation{Mutation::Type::kSet, "torn", "never acknowledged"}, &torn);
  torn.resize(torn.size() / 2);
  const uint64_t end = log->file_bytes();
  log.reset();
  int fd = ::open((dir + "/store.log").c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, torn.data(), torn.size(), end) == static_cast<ssize_t>(torn.size()));
  ::close(fd);
  return acknowledged;
}

// What a restart (without faults) reads back from `dir`.
Snapshot Reopened(const std::string& dir) {
  KvStore kv;
  RecoveryStats stats;
  auto log = StoreLog::Open(dir, Options(nullptr), &kv, &stats);
  REQUIRE(log.ok());
  return Of(kv);
}

int OpenFds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

struct RunResult {
  Snapshot acknowledged;
  int compactions = 0;
};

// Opens the log through `files`, then writes 40 batches (16 KiB values over
// 5 keys, a counter, a queue), probing while the log fails as the store
// server does. Checks after each batch that the store holds what was
// acknowledged. Returns the acknowledged state.
RunResult Workload(const std::string& dir, Snapshot acknowledged, FaultyFiles* files) {
  RunResult result;
  auto kv = std::make_unique<KvStore>();
  RecoveryStats stats;
  auto opened = StoreLog::Open(dir, Options(files), kv.get(), &stats);
  if (!opened.ok()) {
    // musterd would not start; started again, it does (one fault per run).
    INFO(opened.status().ToString());
    REQUIRE(absl::StrContains(files->failed, "call"));
    kv = std::make_unique<KvStore>();
    opened = StoreLog::Open(dir, Options(files), kv.get(), &stats);
    REQUIRE(opened.ok());
  }
  std::unique_ptr<StoreLog> log = std::move(*opened);
  REQUIRE(Of(*kv) == acknowledged);
  StoreLog* raw = log.get();
  kv->SetMutationListener([raw](const Mutation& m) { raw->Record(m); });
  uint64_t last_size = log->file_bytes();
  for (int i = 0; i < 40; ++i) {
    for (int probes = 0; log->failing(); ++probes) {
      REQUIRE(probes < 3);  // one fault: the second probe works
      (void)log->Probe();
    }
    REQUIRE(
        kv->Set(absl::StrCat("k", i % 5), std::string(16 << 10, static_cast<char>('a' + i))).ok());
    REQUIRE(kv->Add("n", 1).ok());
    REQUIRE(kv->QueuePush("q", absl::StrCat("item ", i)).ok());
    if (i % 3 == 2) {
      std::string popped;
      kv->QueuePop("q", &popped);
    }
    if (log->Flush(*kv).ok()) {
      acknowledged = Of(*kv);
    } else {
      REQUIRE(log->Rollback(kv.get()).ok());
    }
    INFO("batch " << i << ", " << files->failed);
    REQUIRE(Of(*kv) == acknowledged);
    if (log->file_bytes() < last_size) ++result.compactions;
    last_size = log->file_bytes();
  }
  result.acknowledged = acknowledged;
  return result;
}

TEST_CASE("every system call of the log failing once loses no acknowledged write") {
  // The count of calls in a run without faults bounds the runs with one.
  int total = 0;
  {
    Dir dir;
    Snapshot before = Prepare(dir.path);
    FaultyFiles files;
    RunResult clean = Workload(dir.path, before, &files);
    REQUIRE(clean.compactions >= 2);
    total = files.calls;
  }
  REQUIRE(total > 100);
  const int fds = OpenFds();
  for (int n = 1; n <= total; ++n) {
    Dir dir;
    Snapshot before = Prepare(dir.path);
    FaultyFiles files;
    files.fail_at = n;
    RunResult run = Workload(dir.path, before, &files);
    INFO(files.failed);
    // A restart (without faults) reads exactly what was acknowledged, and
    // nothing of the run is left open.
    CHECK(OpenFds() == fds);
    const Snapshot restarted = Reopened(dir.path);
    CHECK(restarted == run.acknowledged);
    CHECK(restarted.at("n") != "1");  // the workload's counter moved on
  }
}

TEST_CASE("a compaction in slices keeps every write made while it runs") {
  Dir dir;
  KvStore kv;
  StoreLogOptions options = Options(nullptr);
  options.compact_slice_bytes = 1024;  // about one key per batch
  std::unique_ptr<StoreLog> log = OpenLogged(dir.path, options, &kv);
  // 40 keys of 4 KiB and two queues, then enough overwrites of one key that
  // a compaction starts.
  for (int i = 0; i < 40; ++i) {
    REQUIRE(kv.Set(absl::StrCat("k", i), std::string(4096, 'a')).ok());
  }
  for (int i = 0; i < 3; ++i) REQUIRE(kv.QueuePush(absl::StrCat("q", i % 2), "old").ok());
  REQUIRE(log->Flush(kv).ok());
  uint64_t before = log->file_bytes();
  int batches = 0;
  for (; log->file_bytes() >= before; ++batches) {
    REQUIRE(batches < 2000);
    before = log->file_bytes();
    // Every kind of write, to keys the compaction has and has not reached
    // yet, and to new ones.
    const int i = batches;
    REQUIRE(
        kv.Set(absl::StrCat("k", i % 40), std::string(4096, static_cast<char>('b' + i % 20))).ok());
    REQUIRE(kv.Append(absl::StrCat("k", (i * 7) % 40), "+").ok());
    if (i % 5 == 0) kv.Delete(absl::StrCat("k", (i * 3) % 40));
    REQUIRE(kv.Set(absl::StrCat("new", i), "n").ok());
    REQUIRE(kv.Add("counter", 1).ok());
    REQUIRE(kv.QueuePush(absl::StrCat("q", i % 3), absl::StrCat("item", i)).ok());
    if (i % 2 == 0) {
      std::string popped;
      kv.QueuePop("q0", &popped);
    }
    REQUIRE(log->Flush(kv).ok());
  }
  CHECK(batches > 5);  // the compaction took several batches
  const Snapshot acknowledged = Of(kv);
  log.reset();
  CHECK(Reopened(dir.path) == acknowledged);
}

TEST_CASE("--store-recover with any one system call failing loses no verifiable record") {
  // A log of 10 keys whose 6th record has a flipped bit: recovery keeps the
  // original aside (link, else a copy), then writes a clean log (a
  // compaction). Each of its calls fails once in turn.
  Dir prepared;
  {
    KvStore kv;
    std::unique_ptr<StoreLog> log = OpenLogged(prepared.path, Options(nullptr), &kv);
    for (int i = 0; i < 10; ++i) {
      REQUIRE(kv.Set(absl::StrCat("k", i), std::string(100, static_cast<char>('a' + i))).ok());
      REQUIRE(log->Flush(kv).ok());
    }
  }
  const std::string log_path = prepared.path + "/store.log";
  std::string original;
  {
    std::ifstream in(log_path, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t record = original.size() / 10;  // all records are the same size
  original[5 * record + 20] ^= 0x10;
  StoreLogOptions recovering = Options(nullptr);
  recovering.recover = true;
  auto run = [&](FaultyFiles* files) {
    Dir dir;
    { std::ofstream(dir.path + "/store.log", std::ios::binary) << original; }
    StoreLogOptions options = recovering;
    options.files = files;
    KvStore kv;
    RecoveryStats stats;
    { auto log = StoreLog::Open(dir.path, options, &kv, &stats); }
    // Whatever happened, a recovery without faults has the 9 verifiable
    // records, and the damaged original is still somewhere in the folder.
    KvStore again;
    auto reopened = StoreLog::Open(dir.path, recovering, &again, &stats);
    REQUIRE(reopened.ok());
    CHECK(again.NumKeys() == 9);
    CHECK(again.Find("k5") == nullptr);
    CHECK(*again.Find("k9") == std::string(100, 'j'));
    bool kept = false;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
      std::ifstream in(entry.path(), std::ios::binary);
      kept |= std::string(std::istreambuf_iterator<char>(in), {}) == original;
    }
    CHECK(kept);
  };
  FaultyFiles clean;
  run(&clean);
  REQUIRE(clean.calls > 10);
  for (int n = 1; n <= clean.calls; ++n) {
    FaultyFiles files;
    files.fail_at = n;
    INFO("system call " << n << " of the recovery fails");
    run(&files);
  }
}

TEST_CASE("compactions keep no descriptor and no deleted log open") {
  Dir dir;
  Snapshot before = Prepare(dir.path);
  const int fds = OpenFds();
  KvStore kv;
  std::unique_ptr<StoreLog> log = OpenLogged(dir.path, Options(nullptr), &kv);
  int compactions = 0;
  uint64_t last = log->file_bytes();
  for (int i = 0; compactions < 30; ++i) {
    REQUIRE(i < 10000);
    REQUIRE(kv.Set("k", std::string(32 << 10, 'x')).ok());
    REQUIRE(log->Flush(kv).ok());
    if (log->file_bytes() < last) ++compactions;
    last = log->file_bytes();
  }
  CHECK(OpenFds() == fds + 1);  // the log's one descriptor
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    INFO(target);
    CHECK_FALSE(absl::EndsWith(target, "(deleted)"));
  }
}

TEST_CASE("a failed directory sync after a compaction refuses writes until a probe syncs it") {
  // Fails the first fsync of a directory: the first compaction's step 4.
  struct FailFirstDirSync : FaultyFiles {
    bool last_open_dir = false;
    bool failed_once = false;
    int Open(const std::string& path, int flags, mode_t mode) override {
      last_open_dir = (flags & O_DIRECTORY) != 0;
      return FaultyFiles::Open(path, flags, mode);
    }
    int Fsync(int fd) override {
      if (!last_open_dir || failed_once) return FaultyFiles::Fsync(fd);
      failed_once = true;
      errno = EIO;
      return -1;
    }
  };
  Dir dir;
  (void)Prepare(dir.path);
  FailFirstDirSync files;
  KvStore kv;
  std::unique_ptr<StoreLog> log = OpenLogged(dir.path, Options(&files), &kv);
  for (int i = 0; !files.failed_once; ++i) {
    REQUIRE(i < 100);
    REQUIRE(kv.Set(absl::StrCat("k", i % 5), std::string(16 << 10, 'y')).ok());
    REQUIRE(log->Flush(kv).ok());  // the batch itself is durable
  }
  REQUIRE(log->failing());
  CHECK(absl::StrContains(log->error().message(), "could not be synced after a compaction"));
  REQUIRE(kv.Set("refused", "while failing").ok());
  CHECK_FALSE(log->Flush(kv).ok());
  REQUIRE(log->Rollback(&kv).ok());
  CHECK(kv.Find("refused") == nullptr);
  CHECK(log->Probe().ok());
  CHECK_FALSE(log->failing());
  REQUIRE(kv.Set("after", "probe").ok());
  REQUIRE(log->Flush(kv).ok());
  const Snapshot acknowledged = Of(kv);
  log.reset();
  CHECK(Reopened(dir.path) == acknowledged);
}

TEST_CASE("a whole last record whose length field was damaged is corruption, not a torn tail") {
  Dir dir;
  uint64_t last_record = 0;
  {
    KvStore kv;
    std::unique_ptr<StoreLog> log = OpenLogged(dir.path, Options(nullptr), &kv);
    REQUIRE(kv.Set("first", "1").ok());
    REQUIRE(log->Flush(kv).ok());
    last_record = log->file_bytes();
    REQUIRE(kv.Set("second", "acknowledged").ok());
    REQUIRE(log->Flush(kv).ok());
  }
  // Flip a high bit of the last record's length: it now runs past the end.
  int fd = ::open((dir.path + "/store.log").c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  unsigned char byte;
  REQUIRE(::pread(fd, &byte, 1, last_record + 2) == 1);
  byte ^= 0x10;
  REQUIRE(::pwrite(fd, &byte, 1, last_record + 2) == 1);
  ::close(fd);
  KvStore kv;
  RecoveryStats stats;
  auto log = StoreLog::Open(dir.path, Options(nullptr), &kv, &stats);
  REQUIRE_FALSE(log.ok());
  CHECK(log.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(log.status().message(), "whole record whose length field is damaged"));
  CHECK(absl::StrContains(log.status().message(), absl::StrCat("offset ", last_record)));
}

}  // namespace
}  // namespace muster
