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
