// NcclEngine across job epochs (elastic jobs): after a member died and was
// replaced, the group is formed again under the next epoch; the survivors'
// old communicators go and every member -- survivors, which made one
// communicator for the group before, and the replacement, which made none --
// creates its new one under the same unique-id key, so they meet.
#include <catch2/catch.hpp>
#include <future>
#include <thread>

#include "daemon/gpu/fake_directory.h"
#include "daemon/gpu/fake_gpu_runtime.h"
#include "daemon/gpu/nccl_engine.h"

namespace muster {
namespace {

struct FakeRank {
  explicit FakeRank(int r, const std::string& incarnation)
      : rank(r), ready{"ready" + incarnation}, done{"done" + incarnation} {}
  int rank;
  FakeEvent ready, done;
  uint64_t sequence = 0;
};

// A one-float all_reduce on "world" from rank `r`, on `value`.
absl::Status AllReduce(NcclEngine& engine, FakeRank& rank, float* value) {
  v1::GpuCollectiveRequest r;
  r.mutable_caller()->set_job_id("job");
  r.mutable_caller()->set_global_rank(rank.rank);
  r.set_group("world");
  r.set_sequence(++rank.sequence);
  r.set_op(v1::GPU_ALL_REDUCE);
  r.set_dtype(static_cast<int>(DType::kFloat32));
  r.set_count(1);
  r.set_pci_bus_id("fake:0");
  r.set_ready_event(FakeIpcHandle(&rank.ready));
  r.set_done_event(FakeIpcHandle(&rank.done));
  v1::GpuBuffer* b = r.add_inputs();
  b->set_ipc_handle(FakeIpcHandle(value));
  b->set_bytes(4);
  std::promise<absl::Status> promise;
  auto future = promise.get_future();
  engine.Collective(std::move(r),
                    [&promise](absl::StatusOr<uint64_t> s) { promise.set_value(s.status()); });
  absl::Status launched = future.get();
  if (!launched.ok()) return launched;
  // The fake runs a collective once every member launched it; wait for it.
  for (int i = 0; i < 500; ++i) {
    bool finished = false;
    absl::Status s = engine.CollectiveStatus("job", "world", rank.rank, rank.sequence, &finished);
    if (!s.ok() || finished) return s;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("the all_reduce did not finish");
}

std::vector<absl::Status> OnRanks(std::vector<FakeRank*> ranks, std::vector<float>& values,
                                  NcclEngine& engine) {
  std::vector<absl::Status> status(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] { status[i] = AllReduce(engine, *ranks[i], &values[i]); });
  }
  for (auto& t : threads) t.join();
  return status;
}

TEST_CASE("a group formed again under the next job epoch gets new communicators that meet") {
  FakeGpuRuntime runtime;
  FakeDirectory directory;
  // A short timeout: communicators that never meet fail fast.
  directory.AddGroup("world", {0, 1, 2}, absl::Seconds(2));
  NcclEngineOptions options;
  options.watchdog_interval = absl::Milliseconds(5);
  NcclEngine engine(&runtime, &directory, options);
  FakeRank a(0, "a"), b(1, "b"), c(2, "c");
  std::vector<float> values = {1, 2, 3};
  for (const absl::Status& s : OnRanks({&a, &b, &c}, values, engine)) REQUIRE(s.ok());
  CHECK(values == std::vector<float>{6, 6, 6});

  // Rank 2 dies: the registry breaks the group and drops the rank.
  directory.BreakGroup("job", "world", "rank 2 failed");
  engine.GroupBroken("job", "world", "rank 2 failed");
  engine.RankGone("job", 2);
  // Its replacement joins epoch 1; the registry starts the group afresh
  // (the survivors' handles of the old epoch go) and forms it again.
  engine.GroupDestroyed("job", "world", 0);
  engine.GroupDestroyed("job", "world", 1);
  directory.AddGroup("world", {0, 1, 2}, absl::Seconds(2), "cpu:gloo,cuda:nccl", /*job_epoch=*/1);
  FakeRank replacement(2, "c2");
  values = {10, 20, 30};
  std::vector<absl::Status> status = OnRanks({&a, &b, &replacement}, values, engine);
  for (size_t i = 0; i < status.size(); ++i) {
    INFO("rank " << i << ": " << status[i]);
    CHECK(status[i].ok());
  }
  CHECK(values == std::vector<float>{60, 60, 60});
  // One unique id for the new epoch's communicators, under the epoch.
  auto present = directory.store().Check({"muster/job/0/nccl/e1/world/0/uid"});
  REQUIRE(present.ok());
  CHECK(*present);
}

}  // namespace
}  // namespace muster
