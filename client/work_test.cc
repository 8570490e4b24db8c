// Work::Impl: a result recorded once, waited for and called back across
// threads (its lock-free completion races a waiter's or a callback's
// registration: both orders must wake the one and run the other once).
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/process_group_impl.h"

namespace muster {
namespace {

constexpr int kRounds = 20000;

TEST_CASE("a Work completed while another thread waits with a deadline wakes that waiter") {
  int late = 0;
  for (int i = 0; i < kRounds; ++i) {
    std::shared_ptr<Work> work = Work::Impl::Create();
    absl::Status seen;
    absl::Time returned;
    std::thread waiter([&] {
      seen = Work::Impl::Of(*work).Wait(absl::Seconds(10));
      returned = absl::Now();
    });
    if (i % 2 == 0) std::this_thread::yield();  // both orders: before and after the wait begins
    const absl::Time completed = absl::Now();
    Work::Impl::Of(*work).Complete(absl::InternalError("round result"));
    waiter.join();
    REQUIRE(seen.code() == absl::StatusCode::kInternal);
    REQUIRE(seen.message() == "round result");
    if (returned - completed > absl::Seconds(1)) ++late;
  }
  CHECK(late == 0);
}

TEST_CASE("a callback registered while its Work completes runs exactly once with the result") {
  for (int i = 0; i < kRounds; ++i) {
    std::shared_ptr<Work> work = Work::Impl::Create();
    std::atomic<int> calls{0};
    std::atomic<int> code{-1};
    std::thread registrar([&] {
      Work::Impl::Of(*work).OnComplete([&](const absl::Status& s) {
        code.store(static_cast<int>(s.code()));
        calls.fetch_add(1);
      });
    });
    if (i % 2 == 0) std::this_thread::yield();
    Work::Impl::Of(*work).Complete(absl::AbortedError("round result"));
    registrar.join();
    REQUIRE(calls.load() == 1);
    REQUIRE(code.load() == static_cast<int>(absl::StatusCode::kAborted));
  }
}

TEST_CASE("two racing completions record one result and run the callbacks once") {
  for (int i = 0; i < kRounds / 4; ++i) {
    std::shared_ptr<Work> work = Work::Impl::Create();
    std::atomic<int> calls{0};
    Work::Impl::Of(*work).OnComplete([&](const absl::Status&) { calls.fetch_add(1); });
    std::thread other([&] { Work::Impl::Of(*work).Complete(absl::CancelledError("other")); });
    Work::Impl::Of(*work).Complete(absl::OkStatus());
    other.join();
    REQUIRE(calls.load() == 1);
    const absl::Status first = Work::Impl::Of(*work).status();
    REQUIRE((first.ok() || first.code() == absl::StatusCode::kCancelled));
    // The result does not change afterwards.
    REQUIRE(Work::Impl::Of(*work).Wait(absl::ZeroDuration()) == first);
    REQUIRE(Work::Impl::Of(*work).IsCompleted());
  }
}

TEST_CASE("a Work nobody completes times out its waiter naming the collective") {
  std::shared_ptr<Work> work = Work::Impl::Create();
  Work::Impl::Of(*work).set_sequence(7);
  absl::Status s = Work::Impl::Of(*work).Wait(absl::Milliseconds(20));
  REQUIRE(s.code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE(s.message().find("collective #7") != absl::string_view::npos);
  REQUIRE_FALSE(Work::Impl::Of(*work).IsCompleted());
}

}  // namespace
}  // namespace muster
