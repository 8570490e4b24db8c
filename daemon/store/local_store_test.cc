// LocalStore against a real StoreServer (in process, no socket): c10d
// semantics, waits woken by the write that completes them, Watch and its
// cancellation, and shutdown.
#include "daemon/store/local_store.h"

#include <catch2/catch.hpp>
#include <thread>

#include "absl/synchronization/notification.h"

namespace muster {
namespace {

std::unique_ptr<StoreServer> StartServer() {
  StoreServerOptions options;
  options.listen_address = "127.0.0.1";
  options.port = 0;
  auto server = StoreServer::Start(options);
  REQUIRE(server.ok());
  return std::move(*server);
}

TEST_CASE("LocalStore keeps c10d's semantics") {
  auto server = StartServer();
  LocalStore store(server.get());
  REQUIRE(store.Set("a", "1").ok());
  CHECK(*store.Get("a", absl::Seconds(1)) == "1");
  CHECK(*store.Add("n", 5) == 5);
  CHECK(*store.Add("n", -2) == 3);
  CHECK(store.Add("a2", 1).ok());
  REQUIRE(store.Set("text", "x").ok());
  CHECK(store.Add("text", 1).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(*store.CompareSet("c", "", "first") == "first");
  CHECK(*store.CompareSet("c", "wrong", "second") == "first");
  CHECK(*store.CompareSet("missing", "expected", "x") == "expected");
  REQUIRE(store.Append("c", "+").ok());
  CHECK(*store.Get("c", absl::Seconds(1)) == "first+");
  REQUIRE(store.MultiSet({"m1", "m2"}, {"x", "y"}).ok());
  CHECK(*store.MultiGet({"m2", "m1"}, absl::Seconds(1)) == std::vector<std::string>{"y", "x"});
  CHECK(store.MultiSet({"k"}, {}).code() == absl::StatusCode::kInvalidArgument);
  CHECK(*store.Check({"m1", "m2"}));
  CHECK_FALSE(*store.Check({"m1", "nope"}));
  CHECK(*store.DeleteKey("m1"));
  CHECK_FALSE(*store.DeleteKey("m1"));
  auto keys = store.ListKeys();
  REQUIRE(keys.ok());
  CHECK(std::find(keys->begin(), keys->end(), "m2") != keys->end());
  CHECK(*store.NumKeys() == static_cast<int64_t>(keys->size()));
}

TEST_CASE("LocalStore waits end when the key is written, or at their timeout") {
  auto server = StartServer();
  LocalStore store(server.get());
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    LocalStore other(server.get());
    REQUIRE(other.Set("late", "v").ok());
  });
  absl::Time start = absl::Now();
  auto got = store.Get("late", absl::Seconds(20));
  writer.join();
  REQUIRE(got.ok());
  CHECK(*got == "v");
  CHECK(absl::Now() - start < absl::Seconds(10));

  auto timed_out = store.Wait({"late", "never"}, absl::Milliseconds(50));
  CHECK(timed_out.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(timed_out.message().find("never") != std::string::npos);
  CHECK(timed_out.message().find("late") == std::string::npos);
}

TEST_CASE("a key that holds only a queue, or was deleted during the wait, reads as NOT_FOUND") {
  auto server = StartServer();
  LocalStore store(server.get());
  // QUEUE_PUSH (a TCP client's) makes "q" present for waits, with no value.
  absl::Notification pushed;
  REQUIRE(server->Post([&](StoreServer::Loop& loop) {
    REQUIRE(loop.kv().QueuePush("q", "item").ok());
    pushed.Notify();
  }));
  pushed.WaitForNotification();
  auto got = store.Get("q", absl::Seconds(1));
  CHECK(got.status().code() == absl::StatusCode::kNotFound);
  CHECK(got.status().message() ==
        "store key 'q' has no value (it holds only a queue, or it was deleted while other keys "
        "were awaited)");
  REQUIRE(store.Set("a", "1").ok());
  CHECK(store.MultiGet({"a", "q"}, absl::Seconds(1)).status().code() ==
        absl::StatusCode::kNotFound);
  // "a" is there when the wait starts, deleted before "b" comes.
  absl::StatusOr<std::vector<std::string>> both = absl::UnknownError("unset");
  std::thread reader([&] { both = store.MultiGet({"a", "b"}, absl::Seconds(20)); });
  // Until its wait for "b" is parked in the loop.
  for (bool parked = false; !parked;) {
    absl::Notification looked;
    REQUIRE(server->Post([&](StoreServer::Loop& loop) {
      parked = loop.kv().num_waits() == 1;
      looked.Notify();
    }));
    looked.WaitForNotification();
    if (!parked) absl::SleepFor(absl::Milliseconds(5));
  }
  LocalStore other(server.get());
  REQUIRE(*other.DeleteKey("a"));
  REQUIRE(other.Set("b", "2").ok());
  reader.join();
  CHECK(both.status().code() == absl::StatusCode::kNotFound);
  CHECK(both.status().message().find("'a'") != std::string::npos);
}

TEST_CASE("WhenPresent runs one of ready and expired, naming the missing keys") {
  // The one park-until-present-or-timeout of the store's front-ends
  // (LocalStore and StoreService).
  auto server = StartServer();
  LocalStore store(server.get());
  REQUIRE(store.Set("here", "1").ok());
  struct Outcome {
    absl::Notification done;
    int ready = 0, expired = 0;
    absl::Status status;
  };
  auto park = [&](std::vector<std::string> keys, absl::Duration timeout) {
    auto outcome = std::make_shared<Outcome>();
    REQUIRE(server->Post([outcome, keys, timeout](StoreServer::Loop& loop) {
      WhenPresent(
          loop, keys, timeout,
          [outcome] {
            ++outcome->ready;
            outcome->done.Notify();
          },
          [outcome](absl::Status s) {
            ++outcome->expired;
            outcome->status = s;
            outcome->done.Notify();
          });
    }));
    return outcome;
  };
  auto present = park({"here"}, absl::Seconds(5));
  REQUIRE(present->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(present->ready == 1);
  auto expired = park({"here", "gone"}, absl::Milliseconds(50));
  REQUIRE(expired->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(expired->ready == 0);
  CHECK(absl::IsDeadlineExceeded(expired->status));
  CHECK(expired->status.message() == "store wait timed out after 50ms; missing keys: gone");
  auto later = park({"later"}, absl::InfiniteDuration());
  REQUIRE(store.Set("later", "v").ok());
  REQUIRE(later->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(later->ready == 1);
  auto stopped = park({"never"}, absl::InfiniteDuration());
  absl::SleepFor(absl::Milliseconds(20));
  server->Stop();
  REQUIRE(stopped->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(absl::IsUnavailable(stopped->status));
  // Exactly one callback each.
  for (auto* o : {present.get(), expired.get(), later.get(), stopped.get()}) {
    CHECK(o->ready + o->expired == 1);
  }
}

TEST_CASE("LocalStore::Watch calls back once the keys exist; a cancelled one never") {
  auto server = StartServer();
  LocalStore store(server.get());
  absl::Notification fired;
  absl::Status seen = absl::UnknownError("unset");
  auto cancel = LocalStore::Watch(server.get(), {"w1", "w2"}, [&](absl::Status s) {
    seen = s;
    fired.Notify();
  });
  REQUIRE(store.Set("w1", "").ok());
  CHECK_FALSE(fired.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  REQUIRE(store.Set("w2", "").ok());
  REQUIRE(fired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(seen.ok());
  cancel();  // after firing: harmless

  bool cancelled_fired = false;
  auto cancel2 =
      LocalStore::Watch(server.get(), {"x"}, [&](absl::Status) { cancelled_fired = true; });
  cancel2();
  REQUIRE(store.Set("x", "").ok());
  REQUIRE(store.Check({"x"}).ok());  // one more loop round trip
  CHECK_FALSE(cancelled_fired);

  // Keys already present: at once.
  absl::Notification present;
  auto cancel3 = LocalStore::Watch(server.get(), {"x"}, [&](absl::Status) { present.Notify(); });
  CHECK(present.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_CASE("LocalStore calls fail UNAVAILABLE once the server stops") {
  auto server = StartServer();
  LocalStore store(server.get());
  absl::Notification fired;
  absl::Status seen;
  auto cancel = LocalStore::Watch(server.get(), {"never"}, [&](absl::Status s) {
    seen = s;
    fired.Notify();
  });
  absl::StatusOr<std::string> pending = absl::UnknownError("unset");
  std::thread waiter([&] { pending = store.Get("never", absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(50));
  server->Stop();
  waiter.join();
  CHECK(pending.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(fired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(seen.code() == absl::StatusCode::kUnavailable);
  CHECK(store.Set("k", "v").code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace muster
