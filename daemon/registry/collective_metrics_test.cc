// CollectiveMetrics over real rings: a finished call is counted once however
// many sweeps see it; a running one holds its ring's cursor while later ones
// are counted; a ring that wrapped past the cursor counts the lost records
// as missed; a segment no longer offered is swept a last time; labels.
#include "daemon/registry/collective_metrics.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
