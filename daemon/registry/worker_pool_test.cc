// WorkerPool: bounded threads, blocking tasks never take the threads kept
// for short ones, Drain waits for everything queued.
#include "daemon/registry/worker_pool.h"

#include <atomic>
#include <catch2/catch.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace muster {
namespace {

TEST_CASE("WorkerPool bounds its threads and runs everything queued") {
  WorkerPool pool(4, 1);
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) {
    pool.Run(WorkerPool::Kind::kShort, [&] {
      absl::SleepFor(absl::Microseconds(100));
      ++ran;
    });
  }
  pool.Drain();
  CHECK(ran == 100);
  CHECK(pool.threads() <= 4);
  CHECK(pool.pending() == 0);
}

TEST_CASE("blocking tasks leave threads for short ones") {
  WorkerPool pool(4, 2);
  absl::Notification release;
  std::atomic<int> blocked{0};
  // More blocked waits than the pool has threads.
  for (int i = 0; i < 6; ++i) {
    pool.Run(WorkerPool::Kind::kBlocking, [&] {
      ++blocked;
      release.WaitForNotification();
    });
  }
  absl::Notification short_ran;
  pool.Run(WorkerPool::Kind::kShort, [&] { short_ran.Notify(); });
  CHECK(short_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(blocked <= 2);  // 4 threads, 2 kept for short tasks
  release.Notify();
  pool.Drain();
  CHECK(blocked == 6);
  CHECK(pool.threads() <= 4);
}

}  // namespace
}  // namespace muster

namespace muster {
namespace {

TEST_CASE("idle threads end; the pool starts new ones when work comes back") {
  WorkerPool pool(4, 1, absl::Milliseconds(100));
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) {
    pool.Run(WorkerPool::Kind::kShort, [&] {
      absl::SleepFor(absl::Milliseconds(5));
      ++ran;
    });
  }
  pool.Drain();
  CHECK(pool.threads() >= 1);
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool.threads() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  CHECK(pool.threads() == 0);
  absl::Notification again;
  pool.Run(WorkerPool::Kind::kShort, [&] { again.Notify(); });
  CHECK(again.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(ran == 8);
}

}  // namespace
}  // namespace muster
