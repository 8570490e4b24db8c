// The store conformance suite (store_conformance_test.cc) against the etcd
// backend with a real 3-member etcd cluster (tools/etcd_cluster.sh): EtcdStore
// itself, and TcpStore clients (native with a token, PyTorch 1.13) through
// StoreFrontend over EtcdStore — what musterd --store-backend etcd serves.
// Every fixture gets fresh storage: its own etcd key prefix.
//
// Without etcd installed every case passes at once and the binary prints
// MUSTER_TEST_SKIPPED (see main below).
#define CATCH_CONFIG_RUNNER
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/store/etcd/etcd_store.h"
#include "daemon/store/store_frontend.h"
#include "muster/tcp_store.h"

namespace muster {
namespace {

// One cluster per test binary, started on first use, stopped at exit.
struct EtcdCluster {
  std::string dir;
  std::vector<std::string> endpoints;
  bool available = false;
  static EtcdCluster& Get() {
    static EtcdCluster* c = [] {
      auto* c = new EtcdCluster;
      const char* tmp = std::getenv("TEST_TMPDIR");
      c->dir = absl::StrCat(tmp ? tmp : "/tmp", "/etcd-", ::getpid());
      std::string script = "tools/etcd_cluster.sh";
      if (::access("/usr/bin/etcd", X_OK) != 0) return c;
      std::string cmd = absl::StrCat(script, " start ", c->dir, " >/dev/null");
      if (std::system(cmd.c_str()) != 0) return c;
      std::FILE* f = std::fopen((c->dir + "/endpoints").c_str(), "r");
      char line[4096] = {};
      if (f == nullptr || std::fgets(line, sizeof(line), f) == nullptr) return c;
      std::fclose(f);
      std::string eps(line);
      while (!eps.empty() && eps.back() == '\n') eps.pop_back();
      c->endpoints = absl::StrSplit(eps, ',');
      c->available = true;
      std::atexit([] {
        std::string stop = absl::StrCat("tools/etcd_cluster.sh stop ", Get().dir);
        (void)std::system(stop.c_str());
      });
      return c;
    }();
    return *c;
  }
};

std::string FreshPrefix() {
  static std::atomic<int> n{0};
  return absl::StrCat("/conformance-", ::getpid(), "-", n++, "/");
}

std::shared_ptr<EtcdStore> NewEtcdStore(const std::string& prefix) {
  EtcdStoreOptions options;
  options.endpoints = EtcdCluster::Get().endpoints;
  options.prefix = prefix;
  auto store = EtcdStore::Create(options);
  REQUIRE(store.ok());
  return std::move(*store);
}

struct EtcdFixture {
  std::string prefix = FreshPrefix();
  EtcdFixture() { REQUIRE(EtcdCluster::Get().available); }
  std::shared_ptr<Store> Open() { return NewEtcdStore(prefix); }
};

template <TcpStoreOptions::Protocol P, bool kToken>
struct FrontendFixture {
  static constexpr const char* kTheToken = "etcd-conformance-token";
  std::unique_ptr<StoreFrontend> frontend;
  FrontendFixture() {
    REQUIRE(EtcdCluster::Get().available);
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
  auto& cluster = EtcdCluster::Get();
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
  auto& cluster = EtcdCluster::Get();
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
