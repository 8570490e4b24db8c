// FastRealtimeNanos against clock_gettime(CLOCK_REALTIME): close to it on
// every read, past the calibration and across anchors, never decreasing
// within a thread, on several threads at once.
#include "common/fast_clock.h"

#include <time.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace muster {
namespace {

int64_t Realtime() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Reads for `millis` of wall time; returns what went wrong, or "".
std::string Check(int millis) {
  const int64_t end = Realtime() + int64_t{millis} * 1000000;
  int64_t last = 0, reads = 0, worst = 0;
  for (int64_t before = Realtime(); before < end; before = Realtime()) {
    int64_t fast = FastRealtimeNanos();
    int64_t after = Realtime();
    if (fast < last) return "decreased: " + std::to_string(last) + " then " + std::to_string(fast);
    last = fast;
    // Between the exact reads around it, give or take 20 us (a loaded
    // machine may preempt between the reads; the mapping's own error is
    // about a microsecond).
    int64_t off = fast < before ? before - fast : fast > after ? fast - after : 0;
    if (off > worst) worst = off;
    if (off > 20000) {
      return "read " + std::to_string(reads) + " off by " + std::to_string(off) + " ns";
    }
    ++reads;
  }
  return reads > 1000 ? "" : "only " + std::to_string(reads) + " reads";
}

TEST_CASE("the fast clock follows the realtime clock through calibration and anchors") {
  INFO("time-stamp counter in use: " << FastClockUsesTsc());
  // 120 ms: the exact reads of the first 10 ms, then several 20 ms anchors.
  std::string problem = Check(120);
  INFO(problem);
  CHECK(problem.empty());
}

TEST_CASE("each thread keeps its own mapping: four threads read at once") {
  std::vector<std::string> problems(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { problems[i] = Check(60); });
  for (auto& t : threads) t.join();
  for (const std::string& p : problems) {
    INFO(p);
    CHECK(p.empty());
  }
}

}  // namespace
}  // namespace muster
