// Liveness from etcd leases (EtcdLiveness, and JobCoordinator over
// EtcdJobStore as musterd --store-backend etcd runs it) against one real etcd
// member from tools/etcd_cluster.sh:
//  - a lease's keys vanish about a TTL after keep-alive stops (and a watcher
//    is told, with the value and the lease), and come back with a new lease;
//  - two watching daemons turn a lost node into exactly one failure record
//    per rank, naming the node; a rank that left in order gets none;
//  - a musterd cut off from etcd for longer than the TTL (a TCP proxy that
//    drops every connection) loses its lease, then grants a new one and
//    puts its keys again.
// Without etcd installed it prints MUSTER_TEST_SKIPPED and passes.
#define CATCH_CONFIG_RUNNER
#include "daemon/store/etcd/etcd_liveness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "daemon/etcd_job_store.h"
#include "daemon/registry/job_coordinator.h"
#include "daemon/store/etcd/etcd_store.h"
#include "test/etcd_test_cluster.h"

namespace muster {
namespace {

constexpr absl::Duration kTtl = absl::Seconds(2);

// One etcd member for this binary.
const testing::TestEtcdCluster& Etcd() { return testing::TestEtcdCluster::Get(1); }
std::string EtcdEndpoint() { return Etcd().endpoints.empty() ? "" : Etcd().endpoints[0]; }
using testing::FreshEtcdPrefix;

EtcdStoreOptions Options(const std::string& prefix, const std::string& endpoint = "") {
  EtcdStoreOptions o;
  o.endpoints = {endpoint.empty() ? EtcdEndpoint() : endpoint};
  o.prefix = prefix;
  o.attempt_timeout = absl::Milliseconds(500);
  return o;
}

std::unique_ptr<EtcdLiveness> NewLiveness(const EtcdStoreOptions& o) {
  auto l = EtcdLiveness::Start(o, kTtl);
  REQUIRE(l.ok());
  return std::move(*l);
}

std::unique_ptr<EtcdStore> NewStore(const std::string& prefix) {
  auto s = EtcdStore::Create(Options(prefix));
  REQUIRE(s.ok());
  return std::move(*s);
}

// What a WatchLost callback saw, with when.
struct Seen {
  absl::Mutex mu;
  std::vector<EtcdLiveness::Lost> lost ABSL_GUARDED_BY(mu);
  absl::Time at ABSL_GUARDED_BY(mu);
  bool Await(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lost.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::function<void(const std::vector<EtcdLiveness::Lost>&)> Callback() {
    return [this](const std::vector<EtcdLiveness::Lost>& keys) {
      absl::MutexLock lock(&mu);
      for (const auto& k : keys) lost.push_back(k);
      at = absl::Now();
    };
  }
};

// A TCP relay 127.0.0.1:port() -> 127.0.0.1:upstream whose Cut() drops
// every connection and refuses new ones until Restore() (same port): etcd
// unreachable from one client while it keeps running.
class CuttableProxy {
 public:
  explicit CuttableProxy(int upstream) : upstream_(upstream) { Listen(); }
  ~CuttableProxy() {
    Cut();
    for (;;) {
      std::thread t;
      {
        absl::MutexLock lock(&mu_);
        if (threads_.empty()) break;
        t = std::move(threads_.back());
        threads_.pop_back();
      }
      t.join();
    }
  }
  int port() const { return port_; }
  void Cut() {
    absl::MutexLock lock(&mu_);
    cut_ = true;
    if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }
  void Restore() {
    {
      absl::MutexLock lock(&mu_);
      cut_ = false;
    }
    Listen();
  }

 private:
  void Listen() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    absl::MutexLock lock(&mu_);
    listen_fd_ = fd;
    // Thread: accepts until Cut(), then closes the listener.
    threads_.emplace_back([this, fd] {
      for (;;) {
        int client = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (client < 0) break;
        int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in up{};
        up.sin_family = AF_INET;
        up.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        up.sin_port = htons(static_cast<uint16_t>(upstream_));
        if (::connect(server, reinterpret_cast<sockaddr*>(&up), sizeof(up)) != 0) {
          ::close(client);
          ::close(server);
          continue;
        }
        absl::MutexLock lock(&mu_);
        if (cut_) {
          ::close(client);
          ::close(server);
          continue;
        }
        fds_.push_back(client);
        fds_.push_back(server);
        // Threads: one per direction, until either side closes or Cut().
        for (auto [from, to] : {std::pair<int, int>{client, server}, {server, client}}) {
          threads_.emplace_back([from = from, to = to] {
            char buf[16384];
            for (;;) {
              ssize_t n = ::read(from, buf, sizeof(buf));
              if (n <= 0 || ::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
            }
            ::shutdown(to, SHUT_RDWR);
            ::shutdown(from, SHUT_RDWR);
          });
        }
      }
      ::close(fd);
    });
  }

  const int upstream_;
  int port_ = 0;
  absl::Mutex mu_;
  bool cut_ ABSL_GUARDED_BY(mu_) = false;
  int listen_fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);              // closed at exit (test only)
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);  // owned; joined at the end
};

TEST_CASE("a lease's keys vanish about a TTL after keep-alive stops, and come back", "[etcd]") {
  REQUIRE(Etcd().available);
  std::string prefix = FreshEtcdPrefix("liveness");
  auto node = NewLiveness(Options(prefix));
  auto observer = NewLiveness(Options(prefix));
  auto store = NewStore(prefix);
  Seen seen;
  EtcdLiveness::Cancel cancel = observer->WatchLost("k/", seen.Callback());
  (void)node->Hold("k/a", "held");  // put once the lease is granted, if not yet
  REQUIRE(store->Wait({"k/a"}, absl::Seconds(5)).ok());
  REQUIRE(node->Release("k/released", "no lease").ok());
  // Renewed: still there after more than the TTL.
  absl::SleepFor(kTtl + absl::Seconds(1));
  CHECK(*store->Check({"k/a"}));
  int64_t lease = node->lease_id();
  REQUIRE(lease != 0);
  absl::Time stopped = absl::Now();
  node->PauseKeepAliveForTesting(true);
  REQUIRE(seen.Await(1, kTtl + absl::Seconds(5)));
  absl::Duration after;
  {
    absl::MutexLock lock(&seen.mu);
    after = seen.at - stopped;
    REQUIRE(seen.lost.size() == 1);
    CHECK(seen.lost[0].key == "k/a");
    CHECK(seen.lost[0].value == "held");
    CHECK(seen.lost[0].lease == lease);
  }
  // The last renewal was at most TTL/3 before the pause; etcd checks expiry
  // every 500 ms.
  CHECK(after >= kTtl * 2 / 3 - absl::Milliseconds(100));
  CHECK(after <= kTtl + absl::Milliseconds(1500));
  CHECK_FALSE(*store->Check({"k/a"}));
  CHECK(*store->Check({"k/released"}));  // not held: it stays
  // Renewing again finds the lease gone: a new one, the key put again.
  node->PauseKeepAliveForTesting(false);
  REQUIRE(store->Wait({"k/a"}, absl::Seconds(10)).ok());
  CHECK(node->leases_granted() == 2);
  CHECK(node->lease_id() != lease);
  cancel();
  std::printf("keep-alive stopped: key gone after %s (TTL %s); regained with a new lease\n",
              absl::FormatDuration(after).c_str(), absl::FormatDuration(kTtl).c_str());
}

// A daemon: its lease and a coordinator of job "j" over EtcdJobStore.
struct Daemon {
  std::shared_ptr<EtcdLiveness> liveness;
  std::unique_ptr<JobCoordinator> coordinator;
  absl::Mutex mu;
  // By rank: told at once by its own lease watch, and again through the
  // failure record (the registry ignores the repeat).
  std::map<int, std::vector<FailureRecord>> failures ABSL_GUARDED_BY(mu);
  Daemon(const std::string& prefix, const std::string& node) {
    liveness = NewLiveness(Options(prefix));
    coordinator =
        std::make_unique<JobCoordinator>("j", 0, EtcdJobStore(Options(prefix), liveness, node));
  }
  void Watch() {
    coordinator->WatchFailures([this](const FailureRecord& f) {
      absl::MutexLock lock(&mu);
      failures[f.rank].push_back(f);
    });
  }
  // Until `n` ranks were each told `times` times.
  bool AwaitFailures(size_t n, size_t times, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto enough = [this, n, times]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      size_t done = 0;
      for (const auto& [rank, told] : failures) done += told.size() >= times;
      return done >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
};

TEST_CASE("watchers turn a lost node into exactly one failure record per rank", "[etcd]") {
  REQUIRE(Etcd().available);
  std::string prefix = FreshEtcdPrefix("liveness");
  Daemon a(prefix, "host-a"), b(prefix, "host-b"), c(prefix, "host-c");
  b.Watch();
  c.Watch();
  auto store = NewStore(prefix);
  RemoteRank r0{0, "host-a", 100, "daemon-a", ""}, r1{1, "host-a", 101, "daemon-a", ""};
  RemoteRank r2{2, "host-a", 102, "daemon-a", ""}, r3{3, "host-b", 103, "daemon-b", ""};
  REQUIRE(a.coordinator->PublishRank(4, r0).ok());
  REQUIRE(a.coordinator->PublishRank(4, r1).ok());
  REQUIRE(a.coordinator->PublishRank(4, r2).ok());
  REQUIRE(b.coordinator->PublishRank(4, r3).ok());
  // Rank 2 leaves in order (its daemon records it gone): never reported.
  REQUIRE(a.coordinator->MarkGone(r2).ok());
  // (A key held before the lease was granted is put as soon as it is.)
  REQUIRE(store
              ->Wait({"muster/j/0/alive/0", "muster/j/0/alive/1", "muster/j/0/alive/3"},
                     absl::Seconds(5))
              .ok());
  REQUIRE(*store->Get("muster/j/0/alive/2") == "-");
  absl::Time stopped = absl::Now();
  a.liveness->PauseKeepAliveForTesting(true);  // node a vanishes
  REQUIRE(b.AwaitFailures(2, 1, kTtl + absl::Seconds(10)));
  absl::Duration after = absl::Now() - stopped;  // told (b's own watch)
  CHECK(after <= kTtl + absl::Milliseconds(1500));
  REQUIRE(c.AwaitFailures(2, 1, absl::Seconds(5)));
  REQUIRE(b.AwaitFailures(2, 2, absl::Seconds(10)));  // and through the records
  REQUIRE(c.AwaitFailures(2, 2, absl::Seconds(10)));
  // Another moment for a second writer, if there were one.
  absl::SleepFor(absl::Milliseconds(500));
  const std::string reason = "node host-a (musterd lease expired after 2 s): ranks 0, 1 lost";
  for (Daemon* d : {&b, &c}) {
    absl::MutexLock lock(&d->mu);
    REQUIRE(d->failures.size() == 2);  // ranks 0 and 1, not 2 (it left) or 3
    for (int r : {0, 1}) {
      const std::vector<FailureRecord>& told = d->failures[r];
      CHECK(told.size() == 2);  // its own watch, then the one record
      for (const FailureRecord& f : told) {
        CHECK(f.host == "host-a");
        CHECK(f.pid == 100 + r);
        CHECK(f.reason == reason);
      }
    }
  }
  CHECK(*store->Add("muster/j/0/failures", 0) == 2);
  CHECK_FALSE(*store->Check({"muster/j/0/failure/3"}));
  // As the ranks' own daemon would: gone/<r>, so a new process may take over.
  CHECK(*store->Get("muster/j/0/gone/0") == "host-a\t100\tdaemon-a\t");
  CHECK(*store->Get("muster/j/0/gone/1") == "host-a\t101\tdaemon-a\t");
  // Node b is alive: its rank 3 keeps its key.
  CHECK(*store->Check({"muster/j/0/alive/3"}));
  std::printf(
      "node lost: both watchers told of ranks 0 and 1 %s after keep-alive stopped; "
      "2 failure records\n",
      absl::FormatDuration(after).c_str());
}

TEST_CASE("a musterd cut off from etcd for longer than the TTL regains a lease", "[etcd]") {
  REQUIRE(Etcd().available);
  std::string endpoint = EtcdEndpoint();
  int port = 0;
  REQUIRE(absl::SimpleAtoi(endpoint.substr(endpoint.rfind(':') + 1), &port));
  CuttableProxy proxy(port);
  std::string prefix = FreshEtcdPrefix("liveness");
  auto node = NewLiveness(Options(prefix, absl::StrCat("127.0.0.1:", proxy.port())));
  auto observer = NewLiveness(Options(prefix));
  auto store = NewStore(prefix);
  Seen seen;
  EtcdLiveness::Cancel cancel = observer->WatchLost("r/", seen.Callback());
  (void)node->Hold("r/d", "node d");
  REQUIRE(store->Wait({"r/d"}, absl::Seconds(5)).ok());
  int64_t lease = node->lease_id();
  REQUIRE(lease != 0);
  proxy.Cut();
  absl::Time cut = absl::Now();
  REQUIRE(seen.Await(1, kTtl + absl::Seconds(5)));  // etcd expired the lease
  absl::Duration lost_after = absl::Now() - cut;
  CHECK_FALSE(*store->Check({"r/d"}));
  absl::SleepFor(absl::Milliseconds(500));  // unreachable for a while longer
  CHECK(node->lease_id() == lease);         // it cannot know yet
  proxy.Restore();
  absl::Time restored = absl::Now();
  REQUIRE(store->Wait({"r/d"}, absl::Seconds(10)).ok());
  absl::Duration regained_after = absl::Now() - restored;
  CHECK(*store->Get("r/d") == "node d");
  CHECK(node->leases_granted() == 2);
  CHECK(node->lease_id() != lease);
  CHECK(node->lease_id() != 0);
  cancel();
  std::printf(
      "cut off from etcd: lease expired %s after the cut, key back %s after etcd was "
      "reachable again\n",
      absl::FormatDuration(lost_after).c_str(), absl::FormatDuration(regained_after).c_str());
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  if (::access("/usr/bin/etcd", X_OK) != 0) {
    std::printf("MUSTER_TEST_SKIPPED: etcd not installed (apt-get install etcd-server)\n");
    return 0;
  }
  return Catch::Session().run(argc, argv);
}
