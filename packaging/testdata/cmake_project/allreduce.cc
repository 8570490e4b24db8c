// A rank of a job, in C++17 over an installed muster's C API (muster.h is
// also a C++ header): joins the world from the environment muster-run gives
// it, all-reduces (SUM) an int64 vector of its rank + 1 and (MAX) its rank,
// with the handles owned by unique_ptrs. Prints "RANK r OK sum=S max=M" and
// exits 0 when both results are right.
#include <muster/muster.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

struct WorldDeleter {
  void operator()(muster_world* w) const { muster_world_release(w); }
};
struct GroupDeleter {
  void operator()(muster_group* g) const { muster_group_release(g); }
};
using World = std::unique_ptr<muster_world, WorldDeleter>;
using Group = std::unique_ptr<muster_group, GroupDeleter>;

bool Check(int code, const std::string& what) {
  if (code == MUSTER_OK) return true;
  std::fprintf(stderr, "allreduce_cxx: %s: %s: %s\n", what.c_str(), muster_code_name(code),
               muster_last_error());
  return false;
}

// All-reduces `values` in place and waits for the result.
bool AllReduce(muster_group* group, std::vector<int64_t>& values, int op) {
  muster_tensor tensor{};
  tensor.data = values.data();
  tensor.count = values.size();
  tensor.dtype = MUSTER_INT64;
  tensor.device = MUSTER_DEVICE_CPU;
  muster_work* work = nullptr;
  if (!Check(muster_all_reduce(group, &tensor, op, 1.0, &work), "muster_all_reduce")) return false;
  int code = muster_work_wait(work, 60.0);
  muster_work_release(work);
  return Check(code, "muster_work_wait");
}

}  // namespace

int main() {
  muster_world* raw = nullptr;
  if (!Check(muster_world_init(nullptr, &raw), "muster_world_init")) return 1;
  World world(raw);
  Group group(muster_world_group(world.get()));
  const int rank = muster_world_rank(world.get());
  const int size = muster_world_size(world.get());

  std::vector<int64_t> sum(1000, rank + 1);
  if (!AllReduce(group.get(), sum, MUSTER_SUM)) return 1;
  std::vector<int64_t> max{rank};
  if (!AllReduce(group.get(), max, MUSTER_MAX)) return 1;

  const int64_t want = static_cast<int64_t>(size) * (size + 1) / 2;
  for (size_t i = 0; i < sum.size(); ++i) {
    if (sum[i] != want) {
      std::fprintf(stderr, "allreduce_cxx: sum[%zu] is %lld, want %lld\n", i,
                   static_cast<long long>(sum[i]), static_cast<long long>(want));
      return 1;
    }
  }
  if (max[0] != size - 1) {
    std::fprintf(stderr, "allreduce_cxx: max is %lld, want %d\n", static_cast<long long>(max[0]),
                 size - 1);
    return 1;
  }
  std::printf("RANK %d OK sum=%lld max=%lld lang=c++\n", rank, static_cast<long long>(sum[0]),
              static_cast<long long>(max[0]));
  return 0;
}
