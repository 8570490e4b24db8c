// One conformance suite for every Store implementation: HashStore,
// TcpStore (native and PyTorch-1.13 protocol) against a real StoreServer,
// and PrefixStore over both. Each fixture gives fresh, empty storage and
// can open a second handle onto the same data (another "rank").
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

#include "daemon/store/store_server.h"
#include "muster/hash_store.h"
#include "muster/prefix_store.h"
#include "muster/tcp_store.h"

namespace muster {
namespace {

using Protocol = TcpStoreOptions::Protocol;

struct HashFixture {
  std::shared_ptr<HashStore> shared = std::make_shared<HashStore>();
  std::shared_ptr<Store> Open() { return shared; }
  static constexpr bool kCountsAllKeys = true;
};

// kToken: the server requires a token and the client proves it holds it.
template <Protocol P, bool kToken = false>
struct TcpFixture {
  static constexpr const char* kTheToken = "conformance-token";
  std::unique_ptr<StoreServer> server;
  TcpFixture() {
    StoreServerOptions options;
    options.listen_address = "127.0.0.1";
    options.port = 0;
    if (kToken) options.token = kTheToken;
    auto started = StoreServer::Start(options);
    REQUIRE(started.ok());
    server = std::move(*started);
  }
  std::shared_ptr<Store> Open() {
    TcpStoreOptions options;
    options.port = server->port();
    options.protocol = P;
    if (kToken) options.token = kTheToken;
    auto store = TcpStore::Connect(options);
    REQUIRE(store.ok());
    return std::shared_ptr<Store>(std::move(*store));
  }
};
using TcpNativeFixture = TcpFixture<Protocol::kNative>;
using TcpNativeTokenFixture = TcpFixture<Protocol::kNative, true>;
using TcpTorch113Fixture = TcpFixture<Protocol::kTorch113>;

template <typename Base>
struct PrefixFixture {
  Base base;
  std::shared_ptr<Store> Open() { return std::make_shared<PrefixStore>("job7/pg0", base.Open()); }
};
using PrefixHashFixture = PrefixFixture<HashFixture>;
using PrefixTcpFixture = PrefixFixture<TcpNativeFixture>;

// etcd_store_conformance_test.cc defines its own fixtures and includes this file.
#ifndef STORE_FIXTURES
#define STORE_FIXTURES                                                                         \
  HashFixture, TcpNativeFixture, TcpNativeTokenFixture, TcpTorch113Fixture, PrefixHashFixture, \
      PrefixTcpFixture
#endif

TEMPLATE_TEST_CASE("Set then Get returns the bytes, including NUL and empty values", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  std::string binary("a\0b\xff", 4);
  REQUIRE(store->Set("bin", binary).ok());
  REQUIRE(store->Set("empty", "").ok());
  CHECK(*store->Get("bin") == binary);
  CHECK(*store->Get("empty") == "");
  REQUIRE(store->Set("bin", "overwritten").ok());
  CHECK(*f.Open()->Get("bin") == "overwritten");
}

TEMPLATE_TEST_CASE("Get blocks until another client sets the key", "[store]", STORE_FIXTURES) {
  TestType f;
  auto reader = f.Open();
  auto writer = f.Open();
  absl::Status set;  // Catch2 assertions stay on the test's thread
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(100));
    set = writer->Set("late", "here");
  });
  absl::Time start = absl::Now();
  auto value = reader->Get("late", absl::Seconds(10));
  t.join();
  CHECK(set.ok());
  REQUIRE(value.ok());
  CHECK(*value == "here");
  CHECK(absl::Now() - start >= absl::Milliseconds(90));
}

TEMPLATE_TEST_CASE("Get and Wait time out with DeadlineExceeded naming the key", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  auto value = store->Get("never-set", absl::Milliseconds(150));
  CHECK(value.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(value.status().message()).find("never-set") != std::string::npos);
  auto waited = store->Wait({"x1", "never-either"}, absl::Milliseconds(100));
  CHECK(waited.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(waited.message()).find("never-either") != std::string::npos);
  // The store stays usable after a timeout, and a late write does not
  // confuse the next call.
  REQUIRE(f.Open()->Set("never-set", "now").ok());
  REQUIRE(store->Set("after", "ok").ok());
  CHECK(*store->Get("after") == "ok");
  CHECK(*store->Get("never-set") == "now");
}

TEMPLATE_TEST_CASE("Add counts from the delta and stores decimal text", "[store]", STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  CHECK(*store->Add("counter", 3) == 3);
  CHECK(*store->Add("counter", -5) == -2);
  CHECK(*store->Add("counter", 0) == -2);
  CHECK(*store->Get("counter") == "-2");
  REQUIRE(store->Set("text", "7 apples").ok());
  CHECK(*store->Add("text", 1) == 8);
}

TEMPLATE_TEST_CASE("Add on a non-number is an error and the store survives it", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  REQUIRE(store->Set("word", "hello").ok());
  auto r = store->Add("word", 1);
  CHECK_FALSE(r.ok());
  CHECK(*store->Get("word") == "hello");
  CHECK(*store->Add("fine", 2) == 2);
}

TEMPLATE_TEST_CASE("CompareSet follows c10d for missing, equal and different values", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  CHECK(*store->CompareSet("k", "expected", "desired") == "expected");
  CHECK_FALSE(*store->Check({"k"}));
  CHECK(*store->CompareSet("k", "", "first") == "first");
  CHECK(*store->CompareSet("k", "wrong", "second") == "first");
  CHECK(*store->CompareSet("k", "first", "second") == "second");
  CHECK(*store->Get("k") == "second");
}

TEMPLATE_TEST_CASE("Wait releases only when every key exists; Check never blocks", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  auto other = f.Open();
  REQUIRE(store->Set("a", "1").ok());
  CHECK(*store->Check({"a"}));
  CHECK_FALSE(*store->Check({"a", "b"}));
  std::atomic<bool> released{false};
  absl::Status waited;
  std::thread t([&] {
    waited = store->Wait({"a", "b", "c"}, absl::Seconds(10));
    released = true;
  });
  REQUIRE(other->Set("b", "2").ok());
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(released.load());
  REQUIRE(other->Set("c", "3").ok());
  t.join();
  CHECK(waited.ok());
  CHECK(released.load());
  CHECK(*other->Check({"a", "b", "c"}));
}

TEMPLATE_TEST_CASE("DeleteKey reports whether the key existed; NumKeys counts", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  int64_t before = *store->NumKeys();
  REQUIRE(store->Set("d1", "x").ok());
  REQUIRE(store->Set("d2", "x").ok());
  CHECK(*store->NumKeys() == before + 2);
  CHECK(*store->DeleteKey("d1"));
  CHECK_FALSE(*store->DeleteKey("d1"));
  CHECK(*store->NumKeys() == before + 1);
  CHECK_FALSE(*store->Check({"d1"}));
}

TEMPLATE_TEST_CASE("optional operations work where supported, else Unimplemented", "[store]",
                   STORE_FIXTURES) {
  TestType f;
  auto store = f.Open();
  if (!store->Supports(StoreCapability::kAppend)) {
    CHECK(store->Append("k", "v").code() == absl::StatusCode::kUnimplemented);
    CHECK(store->MultiSet({"k"}, {"v"}).code() == absl::StatusCode::kUnimplemented);
    CHECK(store->MultiGet({"k"}).status().code() == absl::StatusCode::kUnimplemented);
    CHECK(store->ListKeys().status().code() == absl::StatusCode::kUnimplemented);
    return;
  }
  REQUIRE(store->Append("log", "a").ok());
  REQUIRE(store->Append("log", "bc").ok());
  CHECK(*store->Get("log") == "abc");
  REQUIRE(store->MultiSet({"m1", "m2", "m3"}, {"1", "2", "3"}).ok());
  CHECK(*store->MultiGet({"m3", "m1"}) == std::vector<std::string>{"3", "1"});
  CHECK(store->MultiSet({"a"}, {"1", "2"}).code() == absl::StatusCode::kInvalidArgument);
  auto keys = store->ListKeys();
  REQUIRE(keys.ok());
  CHECK(*keys == std::vector<std::string>{"log", "m1", "m2", "m3"});
  auto missing = store->MultiGet({"m1", "nope"}, absl::Milliseconds(100));
  CHECK(missing.status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEMPLATE_TEST_CASE("concurrent Adds from many clients lose nothing", "[store]", STORE_FIXTURES) {
  TestType f;
  constexpr int kThreads = 8, kAdds = 200;
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Store>> stores;
  for (int t = 0; t < kThreads; ++t) stores.push_back(f.Open());
  std::atomic<int> failed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) failed += !stores[t]->Add("total", 1).ok();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(*f.Open()->Add("total", 0) == kThreads * kAdds);
}

}  // namespace
}  // namespace muster
