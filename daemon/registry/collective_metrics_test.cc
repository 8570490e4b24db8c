// CollectiveMetrics over real rings: a finished call is counted once however
// many sweeps see it; a running one holds its ring's cursor while later ones
// are counted; a ring that wrapped past the cursor counts the lost records
// as missed; a segment no longer offered is swept a last time; labels.
#include "daemon/registry/collective_metrics.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "backends/shm/trace.h"
#include "muster/types.h"

namespace muster {
namespace {

struct Segment {
  std::string name;
  std::shared_ptr<GroupSegment> segment;
  Segment(int n, uint64_t records) {
    static std::atomic<int> counter{0};
    name = absl::StrCat("/muster-cm-test.", ::getpid(), ".", counter++);
    segment = std::shared_ptr<GroupSegment>(
        std::move(*GroupSegment::Create(name, n, 4096, 4096, -1, records)));
  }
  ~Segment() { GroupSegment::Unlink(name); }
};

TraceCall Call(TraceOp op, uint64_t count) {
  TraceCall c;
  c.op = op;
  c.dtype = static_cast<uint8_t>(DType::kFloat32);
  c.count = count;
  return c;
}

using Key = CollectiveMetrics::OpBackend;

TEST_CASE("each finished call is counted once; a running one holds the cursor") {
  Segment s(2, 16);
  TraceWriter w0(s.segment.get(), 0, 16), w1(s.segment.get(), 1, 16);
  CollectiveMetrics m;
  std::vector<CollectiveMetrics::Source> sources = {{s.name, s.segment, "gloo"}};
  uint64_t a = w0.Begin(1, Call(TraceOp::kAllReduce, 10), 1000);
  w0.Started(a, 2000);
  w0.Finished(a, 0, 3000);
  uint64_t pending = w0.Begin(2, Call(TraceOp::kBroadcast, 4), 4000);  // runs on
  uint64_t c = w0.Begin(3, Call(TraceOp::kAllReduce, 1), 5000);
  w0.Finished(c, static_cast<int>(absl::StatusCode::kDeadlineExceeded), 6000);
  uint64_t d = w1.Begin(1, Call(TraceOp::kAllReduce, 10), 1000);
  w1.Started(d, 1000);
  w1.Finished(d, 0, 5000);
  m.Sweep(sources);
  m.Sweep(sources);
  auto snap = m.snapshot();
  CHECK(snap.calls[Key{"all_reduce", "gloo"}] == 3);
  CHECK(snap.calls.count(Key{"broadcast", "gloo"}) == 0);
  CHECK(snap.bytes[Key{"all_reduce", "gloo"}] == 2 * 10 * 4);  // the failed one moved nothing
  CHECK(snap.seconds[Key{"all_reduce", "gloo"}].count == 2);
  CHECK(snap.seconds[Key{"all_reduce", "gloo"}].sum == Approx((1000 + 4000) * 1e-9));
  CHECK(snap.failures[{"all_reduce", "gloo", "timeout"}] == 1);
  w0.Finished(pending, static_cast<int>(absl::StatusCode::kAborted), 7000);
  m.Sweep(sources);
  m.Sweep(sources);
  snap = m.snapshot();
  CHECK(snap.calls[Key{"all_reduce", "gloo"}] == 3);
  CHECK(snap.calls[Key{"broadcast", "gloo"}] == 1);
  CHECK(snap.failures[{"broadcast", "gloo", "aborted"}] == 1);
  CHECK(snap.missed["gloo"] == 0);
}

TEST_CASE("a ring that wrapped between sweeps counts what it lost as missed") {
  Segment s(1, 8);
  TraceWriter w(s.segment.get(), 0, 8);
  CollectiveMetrics m;
  std::vector<CollectiveMetrics::Source> sources = {{s.name, s.segment, "cpu:shm,cuda:nccl"}};
  for (int i = 1; i <= 3; ++i) w.Finished(w.Begin(i, Call(TraceOp::kAllGather, 1), i), 0, i + 1);
  m.Sweep(sources);
  for (int i = 4; i <= 23; ++i) w.Finished(w.Begin(i, Call(TraceOp::kAllGather, 1), i), 0, i + 1);
  m.Sweep(sources);
  auto snap = m.snapshot();
  // 3 seen, then 20 more of which the ring kept the last 8.
  CHECK(snap.calls[Key{"all_gather", "shm"}] == 3 + 8);
  CHECK(snap.missed["shm"] == 12);
  // Gone from the sources: swept once more (what came since), then dropped.
  w.Finished(w.Begin(24, Call(TraceOp::kAllGather, 1), 24), 0, 25);
  m.Sweep({});
  w.Finished(w.Begin(25, Call(TraceOp::kAllGather, 1), 25), 0, 26);
  m.Sweep({});
  CHECK(m.snapshot().calls[Key{"all_gather", "shm"}] == 3 + 8 + 1);
}

// Runs `fn` on a thread of its own; false if it did not return within
// `limit` (the thread is then left running: the process ends at the
// failure).
bool ReturnsWithin(absl::Duration limit, std::function<void()> fn) {
  auto returned = std::make_shared<absl::Notification>();
  std::thread([fn = std::move(fn), returned] {
    fn();
    returned->Notify();
  }).detach();
  if (returned->WaitForNotificationWithTimeout(limit)) return true;
  std::fprintf(stderr, "FAILED: the sweep did not return within %s\n",
               absl::FormatDuration(limit).c_str());
  std::_Exit(1);
}

TEST_CASE("a ring header a rank scribbled on cannot make a sweep loop forever") {
  Segment s(2, 16);
  TraceWriter w(s.segment.get(), 0, 16);
  w.Finished(w.Begin(1, Call(TraceOp::kAllReduce, 4), 1), 0, 2);
  CollectiveMetrics m;
  std::vector<CollectiveMetrics::Source> sources = {{s.name, s.segment, "shm"}};
  m.Sweep(sources);
  CHECK(m.snapshot().calls[Key{"all_reduce", "shm"}] == 1);
  // The last id there is (the sweep looped from its cursor up to it, and
  // wrapped), then back down, then a count that would wrap the bytes.
  for (uint64_t next : {~uint64_t{0}, uint64_t{3}, ~uint64_t{0} - 1}) {
    INFO("next = " << next);
    s.segment->trace_ring(0).next.store(next);
    CHECK(ReturnsWithin(absl::Seconds(10), [&] {
      m.Sweep(sources);
      m.Sweep(sources);
    }));
  }
  // A record claiming 2^64 - 1 elements adds at most 2^40 of them.
  s.segment->trace_ring(1).next.store(0);
  TraceWriter w1(s.segment.get(), 1, 16);
  TraceCall huge = Call(TraceOp::kBroadcast, ~uint64_t{0});
  w1.Finished(w1.Begin(1, huge, 1), 0, 2);
  m.Sweep(sources);
  auto snap = m.snapshot();
  CHECK(snap.calls[Key{"broadcast", "shm"}] == 1);
  CHECK(snap.bytes[Key{"broadcast", "shm"}] == (uint64_t{1} << 40) * 4);
}

TEST_CASE("records whose version word stays odd cost one pass, not a retry loop each") {
  // Before: 1000 yields per odd record, ~1.4 s per 2048-record ring, per
  // sweep (a 6-group job made a /metrics scrape take 21.7 s).
  constexpr int kRanks = 16;
  constexpr uint64_t kRecords = 2048;
  Segment s(kRanks, kRecords);
  for (int r = 0; r < kRanks; ++r) {
    TraceWriter w(s.segment.get(), r, kRecords);
    for (uint64_t i = 0; i < kRecords; ++i) {
      w.Finished(w.Begin(i + 1, Call(TraceOp::kAllReduce, 1), 1), 0, 2);
    }
    TraceRecord* records = s.segment->trace_records(r);
    for (uint64_t i = 0; i < kRecords; ++i) records[i].version.store(1);  // taken forever
  }
  CollectiveMetrics m;
  std::vector<CollectiveMetrics::Source> sources = {{s.name, s.segment, "shm"}};
  CHECK(ReturnsWithin(absl::Seconds(5), [&] { m.Sweep(sources); }));
  CHECK(m.snapshot().calls[Key{"all_reduce", "shm"}] == 0);
  CHECK(ReadTrace(*s.segment, 0).empty());
  // A writer meeting such a slot gives up on that record instead of
  // spinning: the collective goes on unrecorded.
  TraceWriter w(s.segment.get(), 0, kRecords);
  CHECK(ReturnsWithin(absl::Seconds(5),
                      [&] { CHECK(w.Begin(kRecords + 1, Call(TraceOp::kAllReduce, 1), 3) == 0); }));
}

TEST_CASE("labels are bounded") {
  CHECK(CollectiveBackendLabel("gloo", 0) == "gloo");
  CHECK(CollectiveBackendLabel("cpu:gloo,cuda:nccl", 1) == "nccl");
  CHECK(CollectiveBackendLabel("cpu:gloo,cuda:nccl", 0) == "gloo");
  CHECK(CollectiveBackendLabel("my-backend-xyz", 0) == "third_party");
  CHECK(CollectiveBackendLabel("cpu:mine", 0) == "third_party");
  CHECK(std::string(CollectiveFailureCause(
            static_cast<int>(absl::StatusCode::kDeadlineExceeded))) == "timeout");
  CHECK(std::string(CollectiveFailureCause(
            static_cast<int>(absl::StatusCode::kFailedPrecondition))) == "mismatch");
  CHECK(std::string(CollectiveFailureCause(static_cast<int>(absl::StatusCode::kUnavailable))) ==
        "peer_gone");
  CHECK(std::string(CollectiveFailureCause(static_cast<int>(absl::StatusCode::kDataLoss))) ==
        "other");
}

}  // namespace
}  // namespace muster
