// The flight recorder's ring: records as written (through another mapping,
// as musterd reads them), the last N, wrapping, a writer resuming after an
// earlier one, a disabled ring, and a reader running alongside a writer
// never seeing a torn record.
#include "backends/shm/trace.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/shm/segment.h"

namespace muster {
namespace {

struct Segment {
  std::string name;
  std::unique_ptr<GroupSegment> owner;  // musterd's mapping
  std::unique_ptr<GroupSegment> rank;   // a rank's
  explicit Segment(int n, uint64_t records) {
    static std::atomic<int> counter{0};
    name = absl::StrCat("/muster-trace-test.", ::getpid(), ".", counter++);
    owner = std::move(*GroupSegment::Create(name, n, 4096, 4096, -1, records));
    rank = std::move(*GroupSegment::Open(name, n));
  }
  ~Segment() { GroupSegment::Unlink(name); }
};

TraceCall Call(TraceOp op, uint64_t count, int root = -1) {
  TraceCall c;
  c.op = op;
  c.dtype = 7;
  c.count = count;
  c.root = root;
  return c;
}

TEST_CASE("BeginStarted writes a started record in one go; ReadTraceFrom follows a ring",
          "[trace]") {
  Segment s(1, 4);
  TraceWriter w(s.rank.get(), 0, 4);
  uint64_t a = w.BeginStarted(7, Call(TraceOp::kAllGather, 3), 100, 150);
  std::vector<TraceEntry> t = ReadTrace(*s.owner, 0);
  REQUIRE(t.size() == 1);
  CHECK(t[0].id == a);
  CHECK(t[0].seq == 7);
  CHECK(t[0].state == TraceState::kStarted);
  CHECK(t[0].submitted_ns == 100);
  CHECK(t[0].started_ns == 150);
  CHECK(t[0].completed_ns == 0);
  w.Finished(a, 0, 180);
  for (int i = 0; i < 5; ++i) w.Finished(w.Begin(8 + i, Call(TraceOp::kBarrier, 0), 200), 0, 210);
  TraceRange range;
  std::vector<TraceEntry> from = ReadTraceFrom(*s.owner, 0, 2, &range);
  CHECK(range.next == 6);
  CHECK(range.oldest == 3);  // ids 1 and 2 were overwritten
  REQUIRE(from.size() == 4);
  CHECK(from.front().id == 3);
  from = ReadTraceFrom(*s.owner, 0, 5, &range);
  REQUIRE(from.size() == 2);
  CHECK(from[0].id == 5);
  CHECK(ReadTraceFrom(*s.owner, 0, 7, &range).empty());
}

TEST_CASE("records are read back through another mapping", "[trace]") {
  Segment s(2, 16);
  TraceWriter w(s.rank.get(), 1, 2048);
  CHECK(w.capacity() == 16);
  uint64_t a = w.Begin(1, Call(TraceOp::kAllReduce, 100), 1000);
  uint64_t b = w.Begin(2, Call(TraceOp::kBroadcast, 5, 1), 2000);
  w.Started(a, 1500);
  w.Finished(a, 0, 1800);
  w.Started(b, 2500);
  uint64_t c = w.Begin(3, Call(TraceOp::kBarrier, 0), 3000);
  w.Finished(c, 4, 3500);  // failed before it started (DEADLINE_EXCEEDED)

  CHECK(ReadTrace(*s.owner, 0).empty());
  std::vector<TraceEntry> t = ReadTrace(*s.owner, 1);
  REQUIRE(t.size() == 3);
  CHECK(t[0].seq == 1);
  CHECK(t[0].op == TraceOp::kAllReduce);
  CHECK(t[0].count == 100);
  CHECK(t[0].dtype == 7);
  CHECK(t[0].state == TraceState::kCompleted);
  CHECK(t[0].submitted_ns == 1000);
  CHECK(t[0].started_ns == 1500);
  CHECK(t[0].completed_ns == 1800);
  CHECK(t[1].op == TraceOp::kBroadcast);
  CHECK(t[1].root == 1);
  CHECK(t[1].state == TraceState::kStarted);
  CHECK(t[1].completed_ns == 0);
  CHECK(t[2].state == TraceState::kFailed);
  CHECK(t[2].error == 4);
  CHECK(std::string(TraceOpName(t[2].op)) == "barrier");

  std::vector<TraceEntry> last = ReadTrace(*s.owner, 1, 2);
  REQUIRE(last.size() == 2);
  CHECK(last[0].seq == 2);
  CHECK(last[1].seq == 3);
}

TEST_CASE("the ring keeps the newest records; a new writer resumes", "[trace]") {
  Segment s(1, 8);
  {
    TraceWriter w(s.rank.get(), 0, 8);
    for (uint64_t i = 1; i <= 20; ++i)
      w.Finished(w.Begin(i, Call(TraceOp::kAllReduce, i), i), 0, i);
  }
  std::vector<TraceEntry> t = ReadTrace(*s.owner, 0);
  REQUIRE(t.size() == 8);
  for (size_t i = 0; i < t.size(); ++i) CHECK(t[i].seq == 13 + i);
  // An old id completing after the ring wrapped changes nothing.
  TraceWriter again(s.rank.get(), 0, 4);  // keeps fewer
  again.Finished(3, 13, 99);
  uint64_t id = again.Begin(21, Call(TraceOp::kGather, 1, 0), 21);
  CHECK(id == 21);
  t = ReadTrace(*s.owner, 0);
  REQUIRE(t.size() == 4);
  CHECK(t.back().seq == 21);
  CHECK(t.back().op == TraceOp::kGather);
}

TEST_CASE("a ring of any capacity (a power of two or not) wraps the same way", "[trace]") {
  // A power-of-two capacity finds a record's slot with a mask, any other
  // with a division: both keep the newest records, in order.
  for (uint64_t capacity : {1, 3, 4, 5, 8}) {
    INFO("capacity " << capacity);
    Segment s(1, 8);
    TraceWriter w(s.rank.get(), 0, capacity);
    std::vector<uint64_t> ids;
    for (uint64_t i = 1; i <= 13; ++i) {
      ids.push_back(w.BeginStarted(i, Call(TraceOp::kAllReduce, i), 10 * i, 10 * i + 1));
      if (i > 1) w.Finished(ids[i - 2], 0, 10 * i);  // the one before finishes late
    }
    std::vector<TraceEntry> t = ReadTrace(*s.owner, 0);
    REQUIRE(t.size() == capacity);
    for (size_t k = 0; k < t.size(); ++k) {
      const uint64_t seq = 13 - capacity + 1 + k;
      CHECK(t[k].id == seq);
      CHECK(t[k].seq == seq);
      CHECK(t[k].count == seq);
      CHECK(t[k].state == (seq == 13 ? TraceState::kStarted : TraceState::kCompleted));
    }
    // An id the ring no longer keeps: its late finish changes nothing.
    if (capacity < 13) w.Finished(13 - capacity, 13, 999);
    std::vector<TraceEntry> after = ReadTrace(*s.owner, 0);
    REQUIRE(after.size() == capacity);
    CHECK(after.front().id == 13 - capacity + 1);
    CHECK(after.front().error == 0);
  }
}

TEST_CASE("a segment without trace records, and a disabled writer", "[trace]") {
  Segment none(2, 0);
  TraceWriter w(none.rank.get(), 0, 2048);
  CHECK_FALSE(w.enabled());
  CHECK(w.Begin(1, Call(TraceOp::kAllReduce, 1), 1) == 0);
  CHECK(ReadTrace(*none.owner, 0).empty());
  Segment some(2, 16);
  TraceWriter off(some.rank.get(), 0, 0);
  CHECK(off.Begin(1, Call(TraceOp::kAllReduce, 1), 1) == 0);
  CHECK(ReadTrace(*some.owner, 0).empty());
}

TEST_CASE("a reader alongside a writer sees whole records only", "[trace]") {
  Segment s(1, 64);
  TraceWriter w(s.rank.get(), 0, 64);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t i = 1; i <= 200000; ++i) {
      // Every field of record i derives from i: a torn copy mixes two.
      uint64_t id = w.Begin(i, Call(TraceOp::kAllReduce, i * 3, static_cast<int>(i % 7)), i * 10);
      w.Started(id, i * 10 + 1);
      w.Finished(id, 0, i * 10 + 2);
    }
    done = true;
  });
  int64_t seen = 0;
  while (!done) {
    for (const TraceEntry& e : ReadTrace(*s.owner, 0)) {
      ++seen;
      REQUIRE(e.id == e.seq);
      REQUIRE(e.count == e.seq * 3);
      REQUIRE(e.root == static_cast<int>(e.seq % 7));
      REQUIRE(e.submitted_ns == static_cast<int64_t>(e.seq * 10));
      if (e.state == TraceState::kCompleted) REQUIRE(e.completed_ns == e.submitted_ns + 2);
    }
  }
  writer.join();
  CHECK(seen > 0);
  CHECK(ReadTrace(*s.owner, 0).back().seq == 200000);
}

}  // namespace
}  // namespace muster
