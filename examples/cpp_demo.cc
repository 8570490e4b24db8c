// The main job's example: a C++ program using the muster SDK. Run it with
//   muster-run --nproc-per-node 4 -- bazel-bin/examples/cpp_demo
// Every rank joins the world, forms subgroups of two, meets the others at
// barriers, and publishes a value through the job's store; rank 0 prints a
// short summary.
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

  std::printf("rank %d of %d: joined in %lld ms; subgroup %s (ranks %s), group rank %d\n", rank,
              world.world_size(), static_cast<long long>(absl::ToInt64Milliseconds(init_time)),
              mine->name().c_str(), absl::StrJoin(mine->ranks(), ",").c_str(), mine->rank());
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
  }
  if (absl::Status s = world.world_group().Barrier(); !s.ok()) return Fail("final barrier", s);
  return muster::DestroyProcessGroup().ok() ? 0 : 1;
}
