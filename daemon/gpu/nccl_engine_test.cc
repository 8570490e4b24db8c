// NcclEngine on FakeGpuRuntime: ranks are threads calling Collective() the
// way the daemon's gRPC service does. Covers creation through the store,
// the request forms only the GPU path has (every collective x dtype x op is
// gpu_conformance_test's), ordering of the rank's events, the IPC handle
// cache, splits, and every failure path (timeouts, async errors, registry
// aborts, hangs).
#include "daemon/gpu/nccl_engine.h"

#include <catch2/catch.hpp>
#include <future>
#include <numeric>
#include <thread>

#include "absl/strings/match.h"
#include "daemon/gpu/fake_directory.h"
#include "daemon/gpu/fake_gpu_runtime.h"
#include "muster/hash_store.h"

namespace muster {
namespace {

// What one fake rank owns: its events (sent as IPC handles).
struct FakeRank {
  explicit FakeRank(int r)
      : rank(r), ready{"ready" + std::to_string(r)}, done{"done" + std::to_string(r)} {}
  int rank;
  FakeEvent ready, done;
  uint64_t sequence = 0;
};

v1::GpuBuffer Buffer(const void* p, size_t bytes) {
  v1::GpuBuffer b;
  b.set_ipc_handle(FakeIpcHandle(p));
  b.set_bytes(bytes);
  return b;
}

v1::GpuCollectiveRequest Request(FakeRank& rank, const std::string& group, v1::GpuOp op,
                                 DType dtype, uint64_t count) {
  v1::GpuCollectiveRequest r;
  r.mutable_caller()->set_job_id("job");
  r.mutable_caller()->set_global_rank(rank.rank);
  r.set_group(group);
  r.set_sequence(++rank.sequence);
  r.set_op(op);
  r.set_dtype(static_cast<int>(dtype));
  r.set_count(count);
  r.set_pci_bus_id("fake:0");
  r.set_ready_event(FakeIpcHandle(&rank.ready));
  r.set_done_event(FakeIpcHandle(&rank.done));
  return r;
}

absl::StatusOr<uint64_t> Call(NcclEngine& engine, v1::GpuCollectiveRequest request) {
  std::promise<absl::StatusOr<uint64_t>> promise;
  auto future = promise.get_future();
  engine.Collective(std::move(request),
                    [&promise](absl::StatusOr<uint64_t> s) { promise.set_value(std::move(s)); });
  return future.get();
}

// Runs `body(rank)` on one thread per rank; returns each rank's status.
std::vector<absl::Status> OnRanks(const std::vector<int>& ranks,
                                  const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> status(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] { status[i] = body(ranks[i]); });
  }
  for (auto& t : threads) t.join();
  return status;
}

// A one-float all_reduce on "world" from each of `ids` (rank per thread),
// on data[r].
std::vector<absl::Status> WorldAllReduce(NcclEngine& engine, std::vector<FakeRank>& ranks,
                                         std::vector<std::vector<float>>& data,
                                         const std::vector<int>& ids) {
  return OnRanks(ids, [&](int r) -> absl::Status {
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    *req.add_inputs() = Buffer(data[r].data(), 4);
    return Call(engine, req).status();
  });
}

bool Eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 400; ++i) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST_CASE("a first all_reduce creates the communicators through the store and reduces") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  std::vector<std::vector<float>> data(3);
  for (int r = 0; r < 3; ++r) data[r] = {1.0f * r, 10.0f + r, -2.5f};
  auto status = OnRanks({0, 1, 2}, [&](int r) -> absl::Status {
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 3);
    *req.add_inputs() = Buffer(data[r].data(), 12);
    return Call(engine, req).status();
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(status[r].ok());
    CHECK(data[r] == std::vector<float>{3.0f, 33.0f, -7.5f});
  }
  // The daemon's stream waited on the rank's ready event before launching
  // and recorded its done event after.
  std::vector<std::string> log = runtime.log();
  for (int r = 0; r < 3; ++r) {
    auto wait = std::find(log.begin(), log.end(), "wait ready" + std::to_string(r));
    auto record = std::find(log.begin(), log.end(), "record done" + std::to_string(r));
    REQUIRE(wait != log.end());
    REQUIRE(record != log.end());
    CHECK(std::find(wait, record, "launch") != record);
  }
  auto list = engine.List("job");
  REQUIRE(list.communicators_size() == 3);
  for (const auto& c : list.communicators()) {
    CHECK(c.state() == "ready");
    CHECK(c.origin() == "init");
    CHECK(c.launched() == 1);
    CHECK(c.pci_bus_id() == "fake:0");
    CHECK(c.open_buffers() == 1);
  }
  CHECK(Eventually([&] {
    auto l = engine.List("job");
    for (const auto& c : l.communicators()) {
      if (c.completed() != 1) return false;
    }
    return true;
  }));
  bool finished = false;
  CHECK(engine.CollectiveStatus("job", "world", 2, 1, &finished).ok());
  CHECK(finished);
  CHECK(absl::IsNotFound(engine.CollectiveStatus("job", "nope", 0, 1, &finished)));
}

// Every collective x dtype x op against the reference is the conformance
// suite's (gpu_conformance_test); here the request forms only the GPU path
// has: all_gather into one buffer per rank, and a batch of sends/receives.
TEST_CASE("all_gather into a list of outputs and a send/recv ring on three ranks") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  constexpr int n = 3;
  struct Buffers {
    std::vector<int64_t> gather_in{0, 0};
    std::vector<std::vector<int64_t>> gather_list = std::vector<std::vector<int64_t>>(3, {0, 0});
    std::vector<float> sendbuf{0}, recvbuf{-1};
  };
  std::vector<Buffers> b(n);
  for (int r = 0; r < n; ++r) {
    b[r].gather_in = {10 * r, 10 * r + 1};
    b[r].sendbuf = {static_cast<float>(r)};
  }
  auto status = OnRanks({0, 1, 2}, [&](int r) -> absl::Status {
    FakeRank& me = ranks[r];
    Buffers& x = b[r];
    auto agl = Request(me, "world", v1::GPU_ALL_GATHER, DType::kInt64, 2);
    *agl.add_inputs() = Buffer(x.gather_in.data(), 16);
    for (auto& out : x.gather_list) *agl.add_outputs() = Buffer(out.data(), 16);
    if (auto s = Call(engine, agl); !s.ok()) return s.status();

    // A ring: send to the next rank, receive from the previous, as one batch.
    auto ring = Request(me, "world", v1::GPU_SEND_RECV, DType::kFloat32, 0);
    auto* send = ring.add_p2p();
    send->set_send(true);
    send->set_peer((r + 1) % n);
    *send->mutable_buffer() = Buffer(x.sendbuf.data(), 4);
    auto* recv = ring.add_p2p();
    recv->set_send(false);
    recv->set_peer((r + n - 1) % n);
    *recv->mutable_buffer() = Buffer(x.recvbuf.data(), 4);
    return Call(engine, ring).status();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(status[r].ok());
    for (int i = 0; i < n; ++i)
      CHECK(b[r].gather_list[i] == std::vector<int64_t>{10 * i, 10 * i + 1});
    CHECK(b[r].recvbuf[0] == static_cast<float>((r + n - 1) % n));
  }
}

TEST_CASE("IPC handles are opened once per rank, closed on release and when the rank goes") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> other(2, std::vector<float>(4, 1.0f));
  auto status = OnRanks({0, 1}, [&](int r) -> absl::Status {
    for (int i = 0; i < 5; ++i) {
      auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 4);
      *req.add_inputs() = Buffer(data[r].data(), 16);
      if (auto s = Call(engine, req); !s.ok()) return s.status();
    }
    // The rank freed `data` and now uses `other`.
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 4);
    req.add_released_handles(FakeIpcHandle(data[r].data()));
    *req.add_inputs() = Buffer(other[r].data(), 16);
    return Call(engine, req).status();
  });
  CHECK(status[0].ok());
  CHECK(status[1].ok());
  CHECK(data[0] == std::vector<float>(4, 32.0f));
  CHECK(other[1] == std::vector<float>(4, 2.0f));
  CHECK(runtime.mem_opens() == 4);         // two allocations per rank, once each
  CHECK(runtime.open_mem_handles() == 2);  // the freed ones were closed
  engine.RankGone("job", 0);
  CHECK(Eventually([&] { return runtime.open_mem_handles() == 1; }));
  CHECK(engine.List("job").communicators_size() == 1);
}

TEST_CASE("a rank that never joins: creation times out and the group breaks") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1}, absl::Milliseconds(400));
  // Rank 0 is on another node, so nothing here waits for it before the
  // communicator's creation (node-local members: see the next cases).
  directory.SetNodes("world", {{0}, {1}});
  NcclEngine engine(&runtime, &directory);
  FakeRank rank1(1);
  std::vector<float> data(2);
  auto req = Request(rank1, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 2);
  *req.add_inputs() = Buffer(data.data(), 8);
  auto result = Call(engine, req);
  CHECK(absl::IsDeadlineExceeded(result.status()));
  CHECK(result.status().message().find("never published the NCCL unique id") != std::string::npos);
  REQUIRE(directory.breaks().size() == 1);
  CHECK(std::string(directory.breaks().at(0)).find("world: ") == 0);
  // Later calls fail at once with the reason.
  auto again = Request(rank1, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 2);
  *again.add_inputs() = Buffer(data.data(), 8);
  CHECK(absl::IsAborted(Call(engine, again).status()));
}

// Launches recorded by the fake runtime so far.
int Launches(FakeGpuRuntime& runtime) {
  int n = 0;
  for (const std::string& e : runtime.log()) n += e == "launch";
  return n;
}

TEST_CASE("members on the node that call different collectives all fail before launch") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  std::vector<std::vector<float>> data(3, std::vector<float>(4, 1.0f));
  // Rank 2 broadcasts while the others all_reduce: collective #1 of all.
  auto desync = OnRanks({0, 1, 2}, [&](int r) -> absl::Status {
    auto req = r == 2 ? Request(ranks[r], "world", v1::GPU_BROADCAST, DType::kFloat32, 4)
                      : Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 4);
    *req.add_inputs() = Buffer(data[r].data(), 16);
    return Call(engine, req).status();
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << desync[r]);
    CHECK(absl::IsFailedPrecondition(desync[r]));
    CHECK(absl::StrContains(desync[r].message(), "all_reduce #1(float32, count 4, SUM)"));
    CHECK(absl::StrContains(desync[r].message(), "broadcast #1(float32, count 4, root 0)"));
  }
  CHECK(Launches(runtime) == 0);
  // The group stays usable: the next collective is #2 on every member.
  auto after = WorldAllReduce(engine, ranks, data, {0, 1, 2});
  for (int r = 0; r < 3; ++r) CHECK(after[r].ok());
  CHECK(data[0][0] == 3.0f);
  CHECK(directory.breaks().empty());
}

TEST_CASE("barriers agree whatever dtype and count their requests carry") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  auto barrier = OnRanks({0, 1}, [&](int r) -> absl::Status {
    auto req = r == 0 ? Request(ranks[r], "world", v1::GPU_BARRIER, DType::kFloat32, 0)
                      : Request(ranks[r], "world", v1::GPU_BARRIER, DType::kUInt8, 1);
    return Call(engine, req).status();
  });
  CHECK(barrier[0].ok());
  CHECK(barrier[1].ok());
}

TEST_CASE("one member's bad request fails the collective on every member of the node") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(4, 1.0f));
  auto bad = OnRanks({0, 1}, [&](int r) -> absl::Status {
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 4);
    *req.add_inputs() = Buffer(data[r].data(), r == 1 ? 8 : 16);  // rank 1's is too small
    return Call(engine, req).status();
  });
  CHECK(absl::IsInvalidArgument(bad[0]));
  CHECK(absl::StrContains(bad[0].message(), "failed on group rank 1"));
  CHECK(absl::IsInvalidArgument(bad[1]));
  CHECK(Launches(runtime) == 0);
  auto after = WorldAllReduce(engine, ranks, data, {0, 1});
  CHECK(after[0].ok());
  CHECK(after[1].ok());
  CHECK(directory.breaks().empty());
}

TEST_CASE("a member on the node that does not issue a collective in time fails it for all") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2}, absl::Seconds(20));
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  std::vector<std::vector<float>> data(3, std::vector<float>(1, 1.0f));
  std::vector<absl::Duration> took(3);
  auto late = OnRanks({0, 1, 2}, [&](int r) -> absl::Status {
    if (r == 2) absl::SleepFor(absl::Milliseconds(700));
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    req.set_timeout_millis(r == 0 ? 200 : 5000);  // rank 0 gives up first
    *req.add_inputs() = Buffer(data[r].data(), 4);
    const absl::Time start = absl::Now();
    absl::Status s = Call(engine, req).status();
    took[r] = absl::Now() - start;
    return s;
  });
  for (int r = 0; r < 3; ++r) INFO("rank " << r << ": " << late[r] << " after " << took[r]);
  // The waiters: DEADLINE_EXCEEDED at rank 0's deadline, naming rank 2.
  for (int r : {0, 1}) {
    CHECK(absl::IsDeadlineExceeded(late[r]));
    CHECK(absl::StrContains(late[r].message(), "timed out waiting for ranks 2"));
    CHECK(took[r] < absl::Milliseconds(600));
  }
  // The late member: ABORTED with that reason, not OK.
  CHECK(absl::IsAborted(late[2]));
  CHECK(absl::StrContains(late[2].message(), "timed out waiting for ranks 2"));
  CHECK(Launches(runtime) == 0);
  REQUIRE(directory.breaks().size() == 1);
  CHECK(absl::StartsWith(directory.breaks()[0], "world: rank 0: all_reduce #1"));
}

TEST_CASE("a member that destroys the group or leaves ends the others' wait at once") {
  for (bool leaves : {false, true}) {
    FakeGpuRuntime runtime;
    FakeDirectory directory;
    directory.AddGroup("world", {0, 1}, absl::Seconds(20));
    NcclEngine engine(&runtime, &directory);
    FakeRank rank0(0);
    std::vector<float> data(1, 1.0f);
    auto req = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    *req.add_inputs() = Buffer(data.data(), 4);
    std::thread gone([&] {
      absl::SleepFor(absl::Milliseconds(200));  // rank 0 waits for rank 1 by now
      if (leaves) {
        engine.RankGone("job", 1);
      } else {
        engine.GroupDestroyed("job", "world", 1);
      }
    });
    const absl::Time start = absl::Now();
    absl::Status s = Call(engine, req).status();
    gone.join();
    INFO((leaves ? "leaves: " : "destroys: ") << s);
    CHECK(absl::IsAborted(s));
    CHECK(absl::StrContains(s.message(),
                            leaves ? "rank 1 left the job" : "rank 1 destroyed group 'world'"));
    CHECK(absl::Now() - start < absl::Seconds(5));
  }
}

TEST_CASE(
    "a collective launches once every member on the node issued it; other nodes' are not "
    "waited for") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2});
  directory.SetNodes("world", {{0, 1}, {2}});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  std::vector<std::vector<float>> data(3, std::vector<float>(1, 1.0f));
  // The communicators first (their creation waits for every member).
  auto warm = WorldAllReduce(engine, ranks, data, {0, 1, 2});
  REQUIRE(warm[2].ok());
  const int warm_launches = Launches(runtime);
  int launched_before_2 = -1;
  absl::Time issued1, answered0;
  auto run = OnRanks({0, 1, 2}, [&](int r) -> absl::Status {
    // Rank 1 (rank 0's node) and rank 2 (another node) come late.
    if (r == 1) absl::SleepFor(absl::Milliseconds(300));
    if (r == 2) {
      absl::SleepFor(absl::Milliseconds(700));
      launched_before_2 = Launches(runtime) - warm_launches;
    }
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    *req.add_inputs() = Buffer(data[r].data(), 4);
    if (r == 1) issued1 = absl::Now();
    absl::Status s = Call(engine, req).status();
    if (r == 0) answered0 = absl::Now();
    return s;
  });
  for (int r = 0; r < 3; ++r) CHECK(run[r].ok());
  CHECK(answered0 >= issued1);
  // Ranks 0 and 1 launched once both issued it, without waiting for rank 2
  // (whose node's musterd would compare its own members).
  CHECK(launched_before_2 == 2);
}

TEST_CASE("an asynchronous NCCL error aborts the communicator and breaks the group") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(1, 1.0f));
  auto first = WorldAllReduce(engine, ranks, data, {0, 1});
  REQUIRE(first[0].ok());
  REQUIRE(first[1].ok());
  runtime.InjectAsyncError(2, 1, "NVLink error on GPU 3");
  REQUIRE(Eventually([&] { return !directory.breaks().empty(); }));
  CHECK(std::string(directory.breaks().at(0)).find("NVLink error on GPU 3") != std::string::npos);
  CHECK(runtime.aborts() >= 1);
  auto req = Request(ranks[0], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  *req.add_inputs() = Buffer(data[0].data(), 4);
  auto after = Call(engine, req);
  CHECK(absl::IsAborted(after.status()));
  CHECK(after.status().message().find("NVLink error on GPU 3") != std::string::npos);
}

TEST_CASE("a registry abort (a member died) aborts the communicators with its reason") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(1, 1.0f));
  auto first = WorldAllReduce(engine, ranks, data, {0, 1});
  REQUIRE(first[0].ok());
  engine.GroupBroken("job", "world", "rank 1 (host n1, pid 77) killed by signal 9");
  REQUIRE(Eventually([&] { return runtime.aborts() == 2; }));
  auto req = Request(ranks[0], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  *req.add_inputs() = Buffer(data[0].data(), 4);
  auto after = Call(engine, req);
  CHECK(absl::IsAborted(after.status()));
  CHECK(after.status().message() == "rank 1 (host n1, pid 77) killed by signal 9");
  CHECK(directory.breaks().empty());  // the registry already knew
  auto list = engine.List("job");
  for (const auto& c : list.communicators()) CHECK(c.state() == "aborted");
}

TEST_CASE("a collective that never finishes on the GPU times out and aborts") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1}, absl::Milliseconds(300));
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(1, 1.0f));
  runtime.HangCollectives(true);
  auto launched = WorldAllReduce(engine, ranks, data, {0, 1});
  CHECK(launched[0].ok());  // enqueued; the GPU never finishes it
  REQUIRE(Eventually([&] { return !directory.breaks().empty(); }));
  CHECK(std::string(directory.breaks().at(0))
            .find("collective #1 (ALL_REDUCE float32 x 1) on group world "
                  "did not finish on the GPU") != std::string::npos);
  CHECK(runtime.aborts() >= 1);
  // The collective was enqueued but never finished: its status is the abort.
  bool finished = true;
  absl::Status status = engine.CollectiveStatus("job", "world", 0, 1, &finished);
  CHECK(absl::IsAborted(status));
  CHECK_FALSE(finished);
  CHECK(status.message().find("did not finish on the GPU") != std::string::npos);
}

TEST_CASE("a subgroup is split from a healthy world communicator") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2});
  directory.AddGroup("pair", {0, 2});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  std::vector<std::vector<float>> data(3, std::vector<float>(1, 1.0f));
  auto first = WorldAllReduce(engine, ranks, data, {0, 1, 2});
  REQUIRE(first[2].ok());
  engine.GroupFormed("job", "pair", {0, 2}, false, "cpu:gloo,cuda:nccl", {0, 1, 2});
  std::vector<std::vector<float>> pair = {{1.0f}, {0.0f}, {5.0f}};
  auto status = OnRanks({0, 2}, [&](int r) -> absl::Status {
    auto req = Request(ranks[r], "pair", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    req.set_reduce_op(static_cast<int>(ReduceOp::kMax));
    *req.add_inputs() = Buffer(pair[r].data(), 4);
    return Call(engine, req).status();
  });
  CHECK(status[0].ok());
  CHECK(status[1].ok());
  CHECK(pair[0][0] == 5.0f);
  CHECK(pair[2][0] == 5.0f);
  int split = 0;
  v1::ListCommunicatorsResponse list = engine.List("job");
  for (const auto& c : list.communicators()) {
    if (c.group() == "pair") {
      CHECK(c.origin() == "split");
      CHECK(c.state() == "ready");
      ++split;
    }
  }
  CHECK(split == 2);
  // The world communicator still works after the split.
  auto again = WorldAllReduce(engine, ranks, data, {0, 1, 2});
  CHECK(again[1].ok());
  CHECK(data[1][0] == 9.0f);
}

TEST_CASE("a destroyed group's name can be used again: a fresh unique id, a new communicator") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(1, 1.0f));
  auto round = [&] { return WorldAllReduce(engine, ranks, data, {0, 1}); };
  auto first = round();
  REQUIRE(first[0].ok());
  REQUIRE(first[1].ok());
  engine.GroupDestroyed("job", "world", 0);
  engine.GroupDestroyed("job", "world", 1);
  REQUIRE(Eventually([&] { return runtime.destroys() == 2; }));
  auto second = round();
  CHECK(second[0].ok());
  CHECK(second[1].ok());
  CHECK(data[0][0] == 4.0f);
  CHECK(runtime.live_comms() == 2);
}

TEST_CASE("a buffer reaching past its allocation is refused before NCCL sees it") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0});
  NcclEngine engine(&runtime, &directory);
  FakeRank rank0(0);
  std::vector<float> data(4, 1.0f);
  runtime.SetAllocationSize(data.data(), 16);
  auto past = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 4);
  v1::GpuBuffer* b = past.add_inputs();
  *b = Buffer(data.data(), 16);
  b->set_offset(8);  // 16 bytes from offset 8 of a 16-byte allocation
  auto refused = Call(engine, past);
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK(refused.status().message().find(
            "a buffer of 16 bytes at offset 8 runs past the end of its 16-byte allocation") !=
        std::string::npos);
  auto huge = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  v1::GpuBuffer* h = huge.add_inputs();
  *h = Buffer(data.data(), 4);
  h->set_offset(~uint64_t{0});  // would wrap around
  CHECK(absl::IsInvalidArgument(Call(engine, huge).status()));
  auto fine = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 2);
  v1::GpuBuffer* f = fine.add_inputs();
  *f = Buffer(data.data(), 8);
  f->set_offset(8);
  CHECK(Call(engine, fine).ok());
  CHECK(directory.breaks().empty());
}

TEST_CASE("a member's death aborts the communicators, also those already retired") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(1, 1.0f));
  auto first = WorldAllReduce(engine, ranks, data, {0, 1});
  REQUIRE(first[1].ok());
  // What the registry does when rank 1 dies: break its groups, then forget it.
  engine.GroupBroken("job", "world", "rank 1 (host h, pid 5) failed");
  engine.RankGone("job", 1);
  REQUIRE(Eventually([&] { return runtime.aborts() == 2; }));
  CHECK(runtime.destroys() == 0);  // nothing was finalized with a dead peer
}

TEST_CASE("bad requests are clear errors and break nothing") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0});
  directory.AddGroup("cpu_only", {0}, absl::Seconds(5), "cpu:gloo");
  NcclEngine engine(&runtime, &directory);
  FakeRank rank0(0);
  std::vector<float> data(1, 1.0f);
  auto wrong_backend = Request(rank0, "cpu_only", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  *wrong_backend.add_inputs() = Buffer(data.data(), 4);
  auto s1 = Call(engine, wrong_backend);
  CHECK(absl::IsInvalidArgument(s1.status()));
  CHECK(s1.status().message().find("no NCCL backend") != std::string::npos);

  auto unknown = Request(rank0, "nope", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  CHECK(absl::IsNotFound(Call(engine, unknown).status()));

  auto ok = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  *ok.add_inputs() = Buffer(data.data(), 4);
  REQUIRE(Call(engine, ok).ok());
  auto other_gpu = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  other_gpu.set_pci_bus_id("fake:1");
  *other_gpu.add_inputs() = Buffer(data.data(), 4);
  auto s2 = Call(engine, other_gpu);
  CHECK(absl::IsInvalidArgument(s2.status()));
  CHECK(s2.status().message().find("fake:1") != std::string::npos);
  auto too_small = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 2);
  *too_small.add_inputs() = Buffer(data.data(), 4);
  CHECK(absl::IsInvalidArgument(Call(engine, too_small).status()));
  // Still healthy.
  auto fine = Request(rank0, "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  *fine.add_inputs() = Buffer(data.data(), 4);
  CHECK(Call(engine, fine).ok());
  CHECK(directory.breaks().empty());

  runtime.SetUnavailable("no CUDA device");
  auto s3 = Call(engine, fine);
  CHECK(absl::IsFailedPrecondition(s3.status()));
  CHECK(s3.status().message().find("no CUDA device") != std::string::npos);
}

TEST_CASE("the watchdog never polls a communicator while its worker drives an operation on it") {
  // NCCL allows one thread at a time on a communicator: while the worker
  // waits for a launch (a peer is late), the watchdog must leave it alone.
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1});
  NcclEngineOptions options;
  options.watchdog_interval = absl::Milliseconds(1);
  // On different nodes: rank 0's worker launches without waiting for rank
  // 1 to issue the collective (members on one node agree first).
  directory.SetNodes("world", {{0}, {1}});
  NcclEngine engine(&runtime, &directory, options);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1)};
  std::vector<std::vector<float>> data(2, std::vector<float>(1, 1.0f));
  auto all_reduce = [&](int r) -> absl::Status {
    auto req = Request(ranks[r], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    *req.add_inputs() = Buffer(data[r].data(), 4);
    return Call(engine, req).status();
  };
  auto first = OnRanks({0, 1}, all_reduce);
  REQUIRE(first[0].ok());
  REQUIRE(first[1].ok());
  // Rank 1 arrives late: rank 0's worker polls its launch meanwhile.
  auto late = OnRanks({0, 1}, [&](int r) {
    if (r == 1) absl::SleepFor(absl::Milliseconds(200));
    return all_reduce(r);
  });
  CHECK(late[0].ok());
  CHECK(late[1].ok());
  CHECK(runtime.foreign_polls() == 0);
  CHECK(directory.breaks().empty());
}

TEST_CASE("a collective racing its group's destruction is always answered") {
  // Destroying the group may retire the slot, and its worker may drain and
  // exit, between the engine finding the slot and queueing the request:
  // the caller must still get an answer (never a gRPC call left hanging).
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("solo", {0});
  NcclEngine engine(&runtime, &directory);
  FakeRank rank(0);
  std::vector<float> data(1, 1.0f);
  int answered = 0, aborted = 0;
  for (int i = 0; i < 300; ++i) {
    auto req = Request(rank, "solo", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
    *req.add_inputs() = Buffer(data.data(), 4);
    auto promise = std::make_shared<std::promise<absl::Status>>();
    auto future = promise->get_future();
    std::thread destroyer([&] { engine.GroupDestroyed("job", "solo", 0); });
    engine.Collective(req,
                      [promise](absl::StatusOr<uint64_t> s) { promise->set_value(s.status()); });
    destroyer.join();
    engine.GroupDestroyed("job", "solo", 0);
    REQUIRE(future.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    absl::Status s = future.get();
    ++answered;
    if (!s.ok()) {
      CHECK(absl::IsAborted(s));
      ++aborted;
    }
  }
  CHECK(answered == 300);
  INFO("aborted " << aborted);
}

TEST_CASE("a split that never completes aborts the world communicator it is stuck on") {
  // Only ranks 0 and 1 split (rank 2's daemon never does): their world
  // communicators are left with a split in progress, which no later world
  // collective may follow, so they are aborted and the world group breaks.
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  directory.AddGroup("world", {0, 1, 2}, absl::Milliseconds(300));
  directory.AddGroup("pair", {0, 1}, absl::Milliseconds(300));
  NcclEngine engine(&runtime, &directory);
  std::vector<FakeRank> ranks = {FakeRank(0), FakeRank(1), FakeRank(2)};
  std::vector<std::vector<float>> data(3, std::vector<float>(1, 1.0f));
  auto first = WorldAllReduce(engine, ranks, data, {0, 1, 2});
  REQUIRE(first[0].ok());
  engine.GroupFormed("job", "pair", {0, 1}, false, "cpu:gloo,cuda:nccl", {0, 1});
  REQUIRE(Eventually([&] {
    for (const std::string& b : directory.breaks()) {
      if (absl::StartsWith(b, "world: ")) return true;
    }
    return false;
  }));
  bool named = false;
  for (const std::string& b : directory.breaks()) {
    named = named ||
            (absl::StartsWith(b, "world: ") && b.find("splitting group pair") != std::string::npos);
  }
  CHECK(named);
  int aborted = 0;
  v1::ListCommunicatorsResponse list = engine.List("job");
  for (const auto& c : list.communicators()) {
    if (c.group() == "world" && c.global_rank() != 2) aborted += c.state() == "aborted";
  }
  CHECK(aborted == 2);
  auto req = Request(ranks[0], "world", v1::GPU_ALL_REDUCE, DType::kFloat32, 1);
  *req.add_inputs() = Buffer(data[0].data(), 4);
  CHECK(absl::IsAborted(Call(engine, req).status()));
}

}  // namespace
}  // namespace muster
