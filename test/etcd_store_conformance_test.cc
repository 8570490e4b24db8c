// The store conformance suite (store_conformance_test.cc) against the etcd
// backend with a real 3-member etcd cluster (tools/etcd_cluster.sh): EtcdStore
// itself, and TcpStore clients (native with a token, PyTorch 1.13) through
// StoreFrontend over EtcdStore — what musterd --store-backend etcd serves.
// Every fixture gets fresh storage: its own etcd key prefix.
//
// Without etcd installed every case passes at once and the binary prints
// MUSTER_TEST_SKIPPED (see main below).
#define CATCH_CONFIG_RUNNER
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/store_wire.h"
#include "daemon/store/etcd/etcd_store.h"
#include "daemon/store/store_frontend.h"
#include "muster/tcp_store.h"
#include "test/etcd_test_cluster.h"
#include "test/subprocess.h"

namespace muster {
namespace {

// The 3-member cluster of this binary.
const testing::TestEtcdCluster& Cluster() { return testing::TestEtcdCluster::Get(3); }

std::string FreshPrefix() { return testing::FreshEtcdPrefix("conformance"); }

std::shared_ptr<EtcdStore> NewEtcdStore(const std::string& prefix) {
  EtcdStoreOptions options;
  options.endpoints = Cluster().endpoints;
  options.prefix = prefix;
  auto store = EtcdStore::Create(options);
  REQUIRE(store.ok());
  return std::move(*store);
}

struct EtcdFixture {
  std::string prefix = FreshPrefix();
  EtcdFixture() { REQUIRE(Cluster().available); }
  std::shared_ptr<Store> Open() { return NewEtcdStore(prefix); }
};

template <TcpStoreOptions::Protocol P, bool kToken>
struct FrontendFixture {
  static constexpr const char* kTheToken = "etcd-conformance-token";
  std::unique_ptr<StoreFrontend> frontend;
  FrontendFixture() {
    REQUIRE(Cluster().available);
    StoreFrontendOptions options;
    options.listen_address = "127.0.0.1";
    options.port = 0;
    if (kToken) options.token = kTheToken;
    auto started = StoreFrontend::Start(options, NewEtcdStore(FreshPrefix()));
    REQUIRE(started.ok());
    frontend = std::move(*started);
  }
  std::shared_ptr<Store> Open() {
    TcpStoreOptions options;
    options.port = frontend->port();
    options.protocol = P;
    if (kToken) options.token = kTheToken;
    auto store = TcpStore::Connect(options);
    REQUIRE(store.ok());
    return std::shared_ptr<Store>(std::move(*store));
  }
};
using FrontendNativeFixture = FrontendFixture<TcpStoreOptions::Protocol::kNative, true>;
using FrontendTorch113Fixture = FrontendFixture<TcpStoreOptions::Protocol::kTorch113, false>;

}  // namespace
}  // namespace muster

#define STORE_FIXTURES \
  EtcdFixture, FrontendNativeFixture, FrontendTorch113Fixture, PrefixFixture<EtcdFixture>
#include "test/store_conformance_test.cc"

namespace muster {
namespace {

TEST_CASE("concurrent Adds of one key share read-modify-write rounds", "[etcd]") {
  auto store = NewEtcdStore(FreshPrefix());
  constexpr int kThreads = 32, kAdds = 20;
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  std::vector<std::vector<int64_t>> seen(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        auto r = store->Add("barrier", 1);
        if (!r.ok()) {
          ++failed;
        } else {
          seen[t].push_back(*r);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(*store->Add("barrier", 0) == kThreads * kAdds);
  // Every caller got a distinct value: a serial order exists.
  std::set<int64_t> all;
  for (auto& v : seen) all.insert(v.begin(), v.end());
  CHECK(all.size() == size_t{kThreads * kAdds});
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAdds);
  // Coalesced: fewer rounds than Adds.
  std::printf("%d Adds took %llu read-modify-write rounds\n", kThreads * kAdds + 1,
              static_cast<unsigned long long>(store->add_rounds()));
  CHECK(store->add_rounds() < uint64_t{kThreads * kAdds});
}

TEST_CASE("an Add's reply never waits on other callers' rounds while they keep coming", "[etcd]") {
  // 1.13's store barrier: every rank ADDs the same key again and again. One
  // caller runs a round for the callers queued; the next round is the next
  // caller's, so no single Add takes as long as the stream lasts.
  auto store = NewEtcdStore(FreshPrefix());
  constexpr int kThreads = 32;
  const absl::Duration kStream = absl::Seconds(5);
  const absl::Time end = absl::Now() + kStream;
  std::vector<std::thread> threads;
  std::atomic<int64_t> slowest_ms{0}, adds{0}, failed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (absl::Now() < end) {
        const absl::Time start = absl::Now();
        if (!store->Add("stream", 1).ok()) ++failed;
        ++adds;
        int64_t ms = absl::ToInt64Milliseconds(absl::Now() - start);
        int64_t seen = slowest_ms.load();
        while (ms > seen && !slowest_ms.compare_exchange_weak(seen, ms)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::printf("%lld Adds in %s, the slowest took %lld ms\n", static_cast<long long>(adds.load()),
              absl::FormatDuration(kStream).c_str(), static_cast<long long>(slowest_ms.load()));
  CHECK(failed.load() == 0);
  CHECK(*store->Add("stream", 0) == adds.load());
  // A caller that ran every round while others kept coming took 1665 ms
  // here; one round per caller, 9 ms.
  CHECK(slowest_ms.load() < 400);
}

TEST_CASE("concurrent reads that may join a read in flight all get their answer", "[etcd]") {
  // ValuesSince lets a caller join a read already sent (since = the past):
  // the reader hands results out while others keep joining, so a caller
  // that joined a batch already answered would wait forever. The threads
  // are detached and counted, so such a lost caller fails the test instead
  // of hanging it.
  auto store = NewEtcdStore(FreshPrefix());
  REQUIRE(store->Set("joined", "value").ok());
  constexpr int kThreads = 64, kReads = 100;
  struct Tally {
    std::atomic<int> finished{0};
    std::atomic<int> wrong{0};
  };
  auto tally = std::make_shared<Tally>();
  for (int t = 0; t < kThreads; ++t) {
    std::thread([store, tally, t] {
      for (int i = 0; i < kReads; ++i) {
        absl::Time since = (i + t) % 2 ? absl::InfinitePast() : absl::Now();
        auto v = store->ValuesSince({"joined"}, since);
        if (!v.ok() || v->size() != 1 || (*v)[0] != "value") ++tally->wrong;
      }
      ++tally->finished;
    }).detach();
  }
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (tally->finished.load() < kThreads && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE(tally->finished.load() == kThreads);
  CHECK(tally->wrong.load() == 0);
}

TEST_CASE("concurrent waits on one key share a watch and each times out on its own", "[etcd]") {
  auto store = NewEtcdStore(FreshPrefix());
  constexpr int kWaiters = 16;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      // Half give up early; the rest see the key.
      results[i] = store->Wait({"shared"}, i % 2 ? absl::Milliseconds(200) : absl::Seconds(20));
    });
  }
  absl::SleepFor(absl::Milliseconds(800));
  REQUIRE(store->Set("shared", "v").ok());
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWaiters; ++i) {
    if (i % 2) {
      CHECK(results[i].code() == absl::StatusCode::kDeadlineExceeded);
      CHECK(std::string(results[i].message()).find("shared") != std::string::npos);
    } else {
      CHECK(results[i].ok());
    }
  }
  CHECK(store->Wait({"not-there"}, absl::ZeroDuration()).code() ==
        absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("a waiter that joined another's watch is cancelled at once while the owner waits on",
          "[etcd]") {
  auto store = NewEtcdStore(FreshPrefix());
  absl::Status first_result, second_result;
  absl::Duration second_took;
  std::thread first(
      [&] { first_result = store->WaitCancellable({"joined-wait"}, absl::Seconds(30), nullptr); });
  absl::SleepFor(absl::Milliseconds(500));  // the first owns the watch
  WaitCancel cancel;
  std::thread second([&] {
    absl::Time start = absl::Now();
    second_result = store->WaitCancellable({"joined-wait"}, absl::Seconds(30), &cancel);
    second_took = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(500));
  cancel.Cancel();
  second.join();
  CHECK(second_result.code() == absl::StatusCode::kCancelled);
  CHECK(second_took < absl::Seconds(5));  // woken by its cancel, not its 30 s deadline
  REQUIRE(store->Set("joined-wait", "v").ok());
  first.join();
  CHECK(first_result.ok());
}

TEST_CASE("an unreachable etcd fails calls UNAVAILABLE naming the endpoint", "[etcd]") {
  EtcdStoreOptions options;
  options.endpoints = {"http://127.0.0.1:1"};
  auto store = std::move(*EtcdStore::Create(options));
  store->set_timeout(absl::Milliseconds(500));
  absl::Time start = absl::Now();
  absl::Status s = store->Set("k", "v");
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(s.message()).find("127.0.0.1:1") != std::string::npos);
  CHECK(absl::Now() - start < absl::Seconds(3));
  auto g = store->Get("k", absl::Milliseconds(300));
  CHECK(g.status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("killing the etcd leader mid-run: the store keeps working", "[etcd]") {
  auto& cluster = Cluster();
  REQUIRE(cluster.available);
  auto store = NewEtcdStore(FreshPrefix());
  auto waiter = NewEtcdStore(store->options().prefix);
  REQUIRE(store->Set("before", "1").ok());
  // A Get blocked in a watch across the leader's death.
  absl::StatusOr<std::string> late;
  std::thread blocked([&] { late = waiter->Get("after", absl::Seconds(20)); });
  std::atomic<bool> stop{false};
  std::atomic<int> adds{0}, add_failures{0};
  std::thread writer([&] {
    while (!stop.load()) {
      if (store->Add("count", 1).ok()) {
        ++adds;
      } else {
        ++add_failures;
      }
    }
  });
  // The same through musterd's front-end: a native client over StoreFrontend.
  StoreFrontendOptions fo;
  fo.listen_address = "127.0.0.1";
  fo.port = 0;
  auto frontend = StoreFrontend::Start(fo, NewEtcdStore(store->options().prefix));
  REQUIRE(frontend.ok());
  TcpStoreOptions to;
  to.port = (*frontend)->port();
  auto client = TcpStore::Connect(to);
  REQUIRE(client.ok());
  std::atomic<int> client_adds{0}, client_failures{0};
  std::thread tcp_writer([&] {
    while (!stop.load()) {
      if ((*client)->Add("tcp_count", 1).ok()) {
        ++client_adds;
      } else {
        ++client_failures;
        break;  // a native client's connection ends with its error
      }
    }
  });
  absl::SleepFor(absl::Milliseconds(300));
  std::string leader_cmd = absl::StrCat("tools/etcd_cluster.sh leader ", cluster.dir);
  std::FILE* p = ::popen(leader_cmd.c_str(), "r");
  char name[256] = {};
  REQUIRE(std::fscanf(p, "%255s", name) == 1);
  ::pclose(p);
  REQUIRE(std::system(
              absl::StrCat("tools/etcd_cluster.sh kill ", cluster.dir, " ", name).c_str()) == 0);
  absl::SleepFor(absl::Seconds(2));
  stop = true;
  writer.join();
  tcp_writer.join();
  // An Add whose reply was lost with the leader fails (UNAVAILABLE: maybe
  // applied) instead of being applied twice; none is lost.
  CHECK(client_adds > 0);
  int64_t tcp_count = store->Add("tcp_count", 0).value_or(-1);
  CHECK(tcp_count >= client_adds.load());
  CHECK(tcp_count <= client_adds.load() + client_failures.load());
  int before_kill_and_after = adds.load();
  CHECK(before_kill_and_after > 0);
  // The two surviving members still have quorum: everything works.
  REQUIRE(store->Set("after", "2").ok());
  blocked.join();
  REQUIRE(late.ok());
  CHECK(*late == "2");
  CHECK(*store->Get("before") == "1");
  // Failed Adds (if any) were refused, never applied twice or lost.
  CHECK(*store->Add("count", 0) >= adds.load());
  CHECK(*store->Add("count", 0) <= adds.load() + add_failures.load());
  std::printf(
      "leader %s killed: %d adds ok, %d failed during failover; %d through musterd's "
      "front-end, %d failed\n",
      name, adds.load(), add_failures.load(), client_adds.load(), client_failures.load());
  REQUIRE(std::system(
              absl::StrCat("tools/etcd_cluster.sh restart ", cluster.dir, " ", name).c_str()) == 0);
}

TEST_CASE("without quorum calls fail UNAVAILABLE, and work again once it is back", "[etcd]") {
  auto& cluster = Cluster();
  REQUIRE(cluster.available);
  auto store = NewEtcdStore(FreshPrefix());
  REQUIRE(store->Set("kept", "yes").ok());
  auto run = [&](const std::string& what) {
    return std::system(absl::StrCat("tools/etcd_cluster.sh ", what).c_str());
  };
  REQUIRE(run(absl::StrCat("kill ", cluster.dir, " m1")) == 0);
  REQUIRE(run(absl::StrCat("kill ", cluster.dir, " m2")) == 0);
  store->set_timeout(absl::Seconds(2));
  absl::Time start = absl::Now();
  absl::Status set = store->Set("during", "x");
  absl::Duration took = absl::Now() - start;
  CHECK(set.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(set.message()).find("etcd at http://127.0.0.1:") != std::string::npos);
  CHECK(took < absl::Seconds(4));  // the call's timeout, not etcd's
  auto got = store->Get("kept", absl::Seconds(1));
  CHECK(got.status().code() == absl::StatusCode::kUnavailable);
  std::printf("no quorum: %s (after %s)\n", std::string(set.message()).c_str(),
              absl::FormatDuration(took).c_str());
  REQUIRE(run(absl::StrCat("restart ", cluster.dir, " m1")) == 0);
  REQUIRE(run(absl::StrCat("restart ", cluster.dir, " m2")) == 0);
  store->set_timeout(absl::Seconds(30));
  absl::Status after = store->Set("after", "ok");
  INFO(after.ToString());
  REQUIRE(after.ok());
  CHECK(store->Get("kept").value_or("") == "yes");
  CHECK(store->Get("after").value_or("") == "ok");
  CHECK(store->Add("n", 1).value_or(0) == 1);
}

TEST_CASE("a wait whose watch starts while other writes commit wakes at once", "[etcd]") {
  // Regression: the watch used to start at the revision after the wait's
  // read; with writes committing meanwhile (a barrier's Adds) etcd treats
  // such a watcher as unsynced and delivers its events from a loop that runs
  // every 100 ms, so a woken Get came 0 to 100 ms late.
  auto store = NewEtcdStore(FreshPrefix());
  auto writer = NewEtcdStore(store->options().prefix);
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int t = 0; t < 4; ++t) {
    busy.emplace_back([&, t] {
      while (!stop.load()) (void)writer->Set(absl::StrCat("busy/", t), "x");
    });
  }
  std::vector<double> late_ms;
  for (int i = 0; i < 20; ++i) {
    std::string key = absl::StrCat("wake/", i);
    absl::Time woke;
    absl::StatusOr<std::string> got;
    std::thread waiter([&] {
      got = store->Get(key, absl::Seconds(20));
      woke = absl::Now();
    });
    // Soon after the waiter's read and watch (etcd syncs an unsynced
    // watcher within 100 ms, after that it would not show).
    absl::SleepFor(absl::Milliseconds(25));
    REQUIRE(writer->Set(key, "v").ok());
    absl::Time set_done = absl::Now();
    waiter.join();
    REQUIRE(got.ok());
    late_ms.push_back(absl::ToDoubleMilliseconds(woke - set_done));
  }
  stop = true;
  for (auto& t : busy) t.join();
  std::sort(late_ms.begin(), late_ms.end());
  std::printf("Get woken after its key's Set, with writes committing (ms):");
  for (double ms : late_ms) std::printf(" %.1f", ms);
  std::printf("\n");
  CHECK(late_ms[16] < 40);
}

// ---- Queues (PyTorch 2.8+ QUEUE_PUSH / QUEUE_POP / QUEUE_LEN) ----

TEST_CASE("queues: FIFO, exact length, apart from the keys", "[etcd][queue]") {
  auto store = NewEtcdStore(FreshPrefix());
  std::string v;
  CHECK(*store->QueueLen("q") == 0);
  CHECK(*store->QueuePop("q", &v, absl::ZeroDuration(), nullptr) == 0);
  for (const char* item : {"first", "second", "third"}) REQUIRE(store->QueuePush("q", item).ok());
  REQUIRE(store->QueuePush("q2", std::string("\0bin", 4)).ok());
  CHECK(*store->QueueLen("q") == 3);
  // A queue is not a key: not counted, not listed, not a value to Get...
  CHECK(*store->NumKeys() == 0);
  CHECK(store->ListKeys()->empty());
  CHECK(store->Get("q", absl::Milliseconds(100)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  // ...but WAIT and CHECK (PyTorch's) count it as present.
  CHECK(store->MissingOrQueued({"q", "none"})->size() == 1);
  CHECK(store->WaitCancellableOrQueued({"q"}, absl::Seconds(5), nullptr).ok());
  CHECK(store->Missing({"q"})->size() == 1);
  // A key of the same name is its own thing.
  REQUIRE(store->Set("q", "a value").ok());
  CHECK(*store->Get("q") == "a value");
  CHECK(*store->QueueLen("q") == 3);
  CHECK(*store->QueuePop("q", &v, absl::ZeroDuration(), nullptr) == 3);
  CHECK(v == "first");
  CHECK(*store->QueuePop("q", &v, absl::ZeroDuration(), nullptr) == 2);
  CHECK(v == "second");
  CHECK(*store->QueuePop("q", &v, absl::ZeroDuration(), nullptr) == 1);
  CHECK(v == "third");
  v = "untouched";
  CHECK(*store->QueuePop("q", &v, absl::ZeroDuration(), nullptr) == 0);
  CHECK(v == "untouched");
  CHECK(*store->QueueLen("q") == 0);
  CHECK(*store->QueuePop("q2", &v, absl::ZeroDuration(), nullptr) == 1);
  CHECK(v == std::string("\0bin", 4));
  // A queue whose name extends another's is a different queue.
  REQUIRE(store->QueuePush("q/x", "x").ok());
  CHECK(*store->QueueLen("q") == 0);
  CHECK(*store->QueueLen("q/x") == 1);
  CHECK(*store->Get("q") == "a value");
}

TEST_CASE("queues: a blocking pop waits in a watch and honours its timeout", "[etcd][queue]") {
  auto popper = NewEtcdStore(FreshPrefix());
  auto pusher = NewEtcdStore(popper->options().prefix);  // another musterd
  std::string v;
  absl::Time start = absl::Now();
  auto timed_out = popper->QueuePop("jobs", &v, absl::Milliseconds(400), nullptr);
  absl::Duration took = absl::Now() - start;
  CHECK(timed_out.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(timed_out.status().message()).find("jobs") != std::string::npos);
  CHECK(took >= absl::Milliseconds(400));
  CHECK(took < absl::Seconds(3));
  // A key named like the queue does not end the pop's wait.
  REQUIRE(popper->Set("jobs", "not an item").ok());
  absl::StatusOr<int64_t> got;
  absl::Time popped_at;
  std::thread t([&] {
    got = popper->QueuePop("jobs", &v, absl::Seconds(20), nullptr);
    popped_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(500));
  absl::Time pushed_at = absl::Now();
  REQUIRE(pusher->QueuePush("jobs", "work").ok());
  t.join();
  REQUIRE(got.ok());
  CHECK(*got == 1);
  CHECK(v == "work");
  std::printf("blocking pop woke %s after the push\n",
              absl::FormatDuration(popped_at - pushed_at).c_str());
  CHECK(popped_at - pushed_at < absl::Seconds(2));
  // Cancelled from another thread.
  WaitCancel cancel;
  std::thread c([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancel.Cancel();
  });
  auto cancelled = popper->QueuePop("jobs", &v, absl::Seconds(20), &cancel);
  c.join();
  CHECK(cancelled.status().code() == absl::StatusCode::kCancelled);
}

TEST_CASE("queues: two musterds popping concurrently get every item exactly once, in order",
          "[etcd][queue]") {
  auto a = NewEtcdStore(FreshPrefix());
  auto b = NewEtcdStore(a->options().prefix);
  constexpr int kPushers = 4, kItems = 60, kPoppers = 8;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0}, popped{0};
  absl::Mutex mu;
  // Per popper: the items it got, in its order.
  std::vector<std::vector<std::string>> got(kPoppers);
  for (int p = 0; p < kPushers; ++p) {
    threads.emplace_back([&, p] {
      EtcdStore& s = p % 2 ? *b : *a;
      for (int i = 0; i < kItems; ++i) {
        if (!s.QueuePush("work", absl::StrCat(p, ":", i)).ok()) ++failures;
      }
    });
  }
  for (int p = 0; p < kPoppers; ++p) {
    threads.emplace_back([&, p] {
      EtcdStore& s = p % 2 ? *b : *a;
      while (popped.load() < kPushers * kItems) {
        std::string v;
        auto r = s.QueuePop("work", &v, absl::Milliseconds(300), nullptr);
        if (absl::IsDeadlineExceeded(r.status())) continue;
        if (!r.ok()) {
          ++failures;
          break;
        }
        if (*r > 0) {
          got[p].push_back(v);
          ++popped;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  std::map<std::string, int> times;
  for (int p = 0; p < kPoppers; ++p) {
    // FIFO: what one popper got of one pusher is in push order.
    std::map<int, int> last;
    for (const std::string& v : got[p]) {
      ++times[v];
      std::vector<std::string> parts = absl::StrSplit(v, ':');
      int pusher = std::stoi(parts[0]), i = std::stoi(parts[1]);
      if (last.count(pusher)) CHECK(i > last[pusher]);
      last[pusher] = i;
    }
  }
  CHECK(times.size() == size_t{kPushers * kItems});
  for (const auto& [v, n] : times) {
    INFO(v);
    CHECK(n == 1);
  }
  CHECK(*a->QueueLen("work") == 0);
  std::printf("%d items, %d poppers on two EtcdStores: %llu + %llu pop conflicts retried\n",
              kPushers * kItems, kPoppers,
              static_cast<unsigned long long>(a->queue_pop_conflicts()),
              static_cast<unsigned long long>(b->queue_pop_conflicts()));
}

// A PyTorch 2.x client on the wire (VALIDATE first, then 2.x command bytes).
class Torch2Client {
 public:
  explicit Torch2Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    std::string hello;
    wire::PutU8(&hello, 0);
    wire::PutU32(&hello, wire::kValidateMagic);
    Send(hello);
  }
  ~Torch2Client() { ::close(fd_); }
  static std::string Command(wire::Op op) {
    std::string out;
    wire::PutU8(&out, *wire::CommandByte(wire::Dialect::kTorch2, op));
    return out;
  }
  void Send(const std::string& bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  // Exactly n bytes within `timeout`, or nullopt.
  std::optional<std::string> Read(size_t n, absl::Duration timeout) {
    std::string out;
    absl::Time deadline = absl::Now() + timeout;
    while (out.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (left <= 0 || ::poll(&p, 1, left) <= 0) return std::nullopt;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) return std::nullopt;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  int64_t ReadI64(absl::Duration timeout = absl::Seconds(10)) {
    auto b = Read(8, timeout);
    REQUIRE(b.has_value());
    int64_t v;
    std::memcpy(&v, b->data(), 8);
    return v;
  }
  void Push(const std::string& key, const std::string& value) {
    std::string req = Command(wire::Op::kQueuePush);
    wire::PutBytes(&req, key);
    wire::PutBytes(&req, value);
    Send(req);
  }
  int64_t Len(const std::string& key) {
    std::string req = Command(wire::Op::kQueueLen);
    wire::PutBytes(&req, key);
    Send(req);
    return ReadI64();
  }
  // Non-blocking pop: nullopt when empty ("queue is empty" in torch).
  std::optional<std::string> Pop(const std::string& key,
                                 absl::Duration timeout = absl::Seconds(10)) {
    std::string req = Command(wire::Op::kQueuePop);
    wire::PutBytes(&req, key);
    Send(req);
    int64_t before = ReadI64(timeout);
    if (before == 0) return std::nullopt;
    int64_t size = ReadI64();
    auto v = Read(static_cast<size_t>(size), absl::Seconds(10));
    REQUIRE(v.has_value());
    return v;
  }
  // torch's queue_pop(block=True): WAIT on the key, then QUEUE_POP.
  std::optional<std::string> BlockingPop(const std::string& key) {
    std::string req = Command(wire::Op::kWait);
    wire::PutKeyList(&req, {key});
    Send(req);
    auto stop = Read(1, absl::Seconds(20));
    REQUIRE(stop.has_value());
    CHECK(static_cast<uint8_t>((*stop)[0]) == wire::kStopWaiting);
    return Pop(key, absl::Seconds(20));
  }
  bool Check(const std::string& key) {
    std::string req = Command(wire::Op::kCheck);
    wire::PutKeyList(&req, {key});
    Send(req);
    auto b = Read(1, absl::Seconds(10));
    REQUIRE(b.has_value());
    return static_cast<uint8_t>((*b)[0]) == wire::kCheckReady;
  }

 private:
  int fd_ = -1;
};

// The queue commands on the wire, the same for musterd's in-memory store
// (StoreServer) and its etcd backend (StoreFrontend over EtcdStore).
struct MemoryPort {
  std::unique_ptr<StoreServer> server;
  MemoryPort() {
    StoreServerOptions options;
    options.listen_address = "127.0.0.1";
    options.port = 0;
    server = std::move(*StoreServer::Start(options));
  }
  int port() { return server->port(); }
};
struct EtcdPort {
  std::unique_ptr<StoreFrontend> frontend;
  EtcdPort() {
    REQUIRE(Cluster().available);
    StoreFrontendOptions options;
    options.listen_address = "127.0.0.1";
    options.port = 0;
    frontend = std::move(*StoreFrontend::Start(options, NewEtcdStore(FreshPrefix())));
  }
  int port() { return frontend->port(); }
};

TEMPLATE_TEST_CASE("queues over PyTorch 2.x's wire protocol", "[etcd][queue]", MemoryPort,
                   EtcdPort) {
  TestType server;
  Torch2Client c(server.port());
  CHECK(c.Len("q") == 0);
  CHECK_FALSE(c.Pop("q").has_value());
  CHECK_FALSE(c.Check("q"));
  c.Push("q", "one");
  c.Push("q", std::string("t\0o", 3));
  CHECK(c.Len("q") == 2);
  CHECK(c.Check("q"));
  CHECK(c.Pop("q") == std::optional<std::string>("one"));
  CHECK(c.BlockingPop("q") == std::optional<std::string>(std::string("t\0o", 3)));
  CHECK(c.Len("q") == 0);

  // Blocking pops on four connections, then four pushes from a fifth: each
  // popper gets one item, none fails "queue is empty".
  constexpr int kPoppers = 4;
  std::vector<std::optional<std::string>> got(kPoppers);
  std::vector<std::thread> poppers;
  for (int i = 0; i < kPoppers; ++i) {
    poppers.emplace_back([&, i] {
      Torch2Client p(server.port());
      got[i] = p.BlockingPop("jobs");
    });
  }
  absl::SleepFor(absl::Milliseconds(500));
  for (int i = 0; i < kPoppers; ++i) {
    c.Push("jobs", absl::StrCat("job", i));
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (auto& t : poppers) t.join();
  std::set<std::string> items;
  for (const auto& g : got) {
    REQUIRE(g.has_value());
    items.insert(*g);
  }
  CHECK(items.size() == size_t{kPoppers});
  CHECK(c.Len("jobs") == 0);

  // torch 2.x gives up on a WAIT with CANCEL_WAIT: the wait ends (only the
  // cancel is answered) and the connection goes on.
  std::string req = Torch2Client::Command(wire::Op::kWait);
  wire::PutKeyList(&req, {"never"});
  c.Send(req);
  CHECK_FALSE(c.Read(1, absl::Milliseconds(300)).has_value());
  absl::Time cancelled_at = absl::Now();
  c.Send(Torch2Client::Command(wire::Op::kCancelWait));
  auto answer = c.Read(1, absl::Seconds(5));
  REQUIRE(answer.has_value());
  CHECK(static_cast<uint8_t>((*answer)[0]) == wire::kWaitCanceled);
  CHECK(absl::Now() - cancelled_at < absl::Seconds(2));
  CHECK(c.Len("jobs") == 0);
}
using testing::ClosedWithin;
using testing::ConnectLoopback;

TEST_CASE(
    "the etcd front-end with a token refuses torch clients at their first bytes, closes "
    "idle ones at the auth timeout, and idle ones do not keep token holders out",
    "[etcd]") {
  REQUIRE(Cluster().available);
  StoreFrontendOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  options.token = "front-token";
  options.auth_timeout = absl::Seconds(2);  // a newcomer replaces one idle for 0.5 s
  options.max_unauthenticated_connections = 2;
  options.max_connections = 1;
  auto started = StoreFrontend::Start(options, NewEtcdStore(FreshPrefix()));
  REQUIRE(started.ok());
  const int port = (*started)->port();

  // A 1.13 SET declaring a 16 MiB value, 26 bytes of it sent: closed at
  // once, nothing of it buffered.
  int torch = ConnectLoopback(port);
  REQUIRE(torch >= 0);
  std::string set;
  wire::PutU8(&set, 0);
  wire::PutBytes(&set, "k");
  wire::PutU64(&set, 16 << 20);
  set += "12345678";
  REQUIRE(::send(torch, set.data(), set.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(set.size()));
  CHECK(ClosedWithin(torch, absl::Seconds(2)));

  // Two idle connections fill the unauthenticated pool: a third, 0.1 s
  // later, is refused at accept.
  int idle1 = ConnectLoopback(port);
  absl::SleepFor(absl::Milliseconds(50));
  int idle2 = ConnectLoopback(port);
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(ClosedWithin(ConnectLoopback(port), absl::Seconds(1)));
  // Later a token holder replaces the oldest idle one and gets in
  // (max_connections counts only authenticated connections); the other is
  // closed at the auth timeout.
  absl::SleepFor(absl::Milliseconds(500));
  TcpStoreOptions to;
  to.port = port;
  to.token = "front-token";
  auto holder = TcpStore::Connect(to);
  REQUIRE(holder.ok());
  CHECK((*holder)->Set("front", "ok").ok());
  CHECK(*(*holder)->Get("front") == "ok");
  CHECK(ClosedWithin(idle1, absl::Milliseconds(200)));
  CHECK(ClosedWithin(idle2, absl::Seconds(3)));
}

TEST_CASE("the etcd front-end: a CANCEL_WAIT sent together with its WAIT cancels it", "[etcd]") {
  // Both in one segment: the wait must not block on a key nobody sets (the
  // watcher of waiting sockets sees only input that arrives later).
  REQUIRE(Cluster().available);
  StoreFrontendOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  auto started = StoreFrontend::Start(options, NewEtcdStore(FreshPrefix()));
  REQUIRE(started.ok());
  int fd = ConnectLoopback((*started)->port());
  REQUIRE(fd >= 0);
  std::string bytes;
  wire::PutU8(&bytes, 0);  // VALIDATE
  wire::PutU32(&bytes, wire::kValidateMagic);
  wire::PutU8(&bytes, *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kWait));
  wire::PutKeyList(&bytes, {"never-set"});
  wire::PutU8(&bytes, *wire::CommandByte(wire::Dialect::kTorch2, wire::Op::kCancelWait));
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bytes.size()));
  pollfd p{fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 3000) == 1);
  char reply = 0x7f;
  CHECK(::recv(fd, &reply, 1, 0) == 1);
  CHECK(reply == static_cast<char>(wire::kWaitCanceled));
  ::close(fd);
}

}  // namespace
}  // namespace muster

// Catch2's main, plus a clear skip when etcd is not installed.
int main(int argc, char** argv) {
  if (::access("/usr/bin/etcd", X_OK) != 0) {
    std::printf("MUSTER_TEST_SKIPPED: etcd not installed (apt-get install etcd-server)\n");
    return 0;
  }
  return Catch::Session().run(argc, argv);
}
