// The main job's example: a C++ program using the muster SDK. Run it with
//   muster-run --nproc-per-node 4 -- bazel-bin/examples/cpp_demo
// Every rank joins the world, forms subgroups of two, runs collectives
// (all_reduce on the world and on its subgroup, broadcast, all_gather of
// byte strings), and publishes a value through the job's store; rank 0
// prints a short summary.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "muster/world.h"

namespace {

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "%s failed: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  absl::Time start = absl::Now();
  absl::Status init = muster::InitProcessGroup();
  if (!init.ok()) return Fail("InitProcessGroup", init);
  muster::World& world = *muster::DefaultWorld();
  absl::Duration init_time = absl::Now() - start;
  int rank = world.rank();

  auto subgroups = world.NewSubgroups(world.world_size() % 2 == 0 ? 2 : 1);
  if (!subgroups.ok()) return Fail("NewSubgroups", subgroups.status());
  auto& mine = subgroups->first;
  if (absl::Status s = mine->Barrier(); !s.ok()) return Fail("subgroup barrier", s);

  auto store = world.store();
  if (!store.ok()) return Fail("store", store.status());
  std::string me =
      absl::StrCat("pid ", ::getpid(), " in ", mine->name(), " as rank ", mine->rank());
  if (absl::Status s = (*store)->Set(absl::StrCat("hello/", rank), me); !s.ok()) {
    return Fail("store set", s);
  }
  auto total = (*store)->Add("ranks_done", 1);
  if (!total.ok()) return Fail("store add", total.status());
  if (absl::Status s = world.world_group().Barrier(); !s.ok()) return Fail("world barrier", s);

  // Collectives: asynchronous Work handles, run in shared memory.
  std::vector<float> grad(1 << 20, static_cast<float>(rank + 1));
  auto summed = world.world_group().AllReduce({grad.data(), grad.size(), muster::DType::kFloat32});
  int64_t local = rank;
  auto sub_sum = mine->AllReduce({&local, 1, muster::DType::kInt64}, muster::ReduceOp::kMax);
  double seed = rank == 0 ? 42.5 : 0;
  auto broadcast = world.world_group().Broadcast({&seed, 1, muster::DType::kFloat64}, 0);
  std::vector<std::string> hosts;
  auto gathered =
      world.world_group().AllGatherBytes(absl::StrCat("r", rank, "@", ::getpid()), &hosts);
  for (auto* w : {summed.get(), sub_sum.get(), broadcast.get(), gathered.get()}) {
    if (absl::Status s = w->Wait(); !s.ok()) return Fail("collective", s);
  }
  float expected = world.world_size() * (world.world_size() + 1) / 2.0f;
  if (grad[0] != expected || grad.back() != expected || seed != 42.5) {
    std::fprintf(stderr, "rank %d: wrong collective results\n", rank);
    return 1;
  }

  std::printf(
      "rank %d of %d: joined in %lld ms; subgroup %s (ranks %s); all_reduce(1M floats)=%g, "
      "subgroup max=%lld, broadcast=%g\n",
      rank, world.world_size(), static_cast<long long>(absl::ToInt64Milliseconds(init_time)),
      mine->name().c_str(), absl::StrJoin(mine->ranks(), ",").c_str(), grad[0],
      static_cast<long long>(local), seed);
  if (rank == 0) {
    std::printf("summary: %d ranks, job '%s' generation %lld, %zu subgroups\n", world.world_size(),
                world.job_id().c_str(), static_cast<long long>(world.generation()),
                subgroups->second.size());
    for (int r = 0; r < world.world_size(); ++r) {
      auto v = (*store)->Get(absl::StrCat("hello/", r));
      if (!v.ok()) return Fail("store get", v.status());
      std::printf("  rank %d: %s\n", r, v->c_str());
    }
    auto done = (*store)->Add("ranks_done", 0);
    std::printf("  store counter ranks_done = %lld\n",
                static_cast<long long>(done.ok() ? *done : -1));
    std::printf("  all_gather of byte strings: %s\n", absl::StrJoin(hosts, " ").c_str());
  }
  if (absl::Status s = world.world_group().Barrier(); !s.ok()) return Fail("final barrier", s);
  return muster::DestroyProcessGroup().ok() ? 0 : 1;
}
