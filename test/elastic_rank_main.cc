// muster-elastic-rank: a training-like rank for the elastic-job tests and
// benchmark. It joins the job from the environment, then runs `--steps`
// steps of one all_reduce each (rank r contributes step*(r+1) in every
// element), adding each result to its running total. When a step fails (a
// member died: ABORTED), it calls World::Reconfigure and the ranks agree on
// where to resume: every rank all-gathers how many steps it completed, the
// rank with the most broadcasts its total and step count, and the failed
// step is redone. A process that took over a rank (muster-run
// --restart-policy rank) does the same after Init.
//
// Lines it prints (one per event, wall-clock times in µs since the epoch):
//   BOOT rank=R pid=P t_us=T                            main() entered
//   START rank=R pid=P epoch=E restarts=K t_us=T        after Init
//   KILL rank=R step=S t_us=T                           before its SIGKILL
//   FAILED rank=R step=S: MESSAGE
//   RECONFIGURED rank=R epoch=E t_us=T took_ms=M        Reconfigure returned
//   RESUME rank=R step=S from=ROOT
//   FINAL rank=R total=X steps=S epoch=E pid=P world=N
//   GREW rank=R epoch=E world=N                          admitted waiting processes
// Options: --steps N (default 20), --kill-rank R and --kill-step S (rank R
// kills itself with SIGKILL after step S, in the job's first process of
// that rank only: MUSTER_RESTART_COUNT and MUSTER_GENERATION are 0),
// --elements N (default 1024), --step-ms MS (pause per step, default 0),
// --shrink 1 (reconfigure with allow_shrink: the world shrinks to the ranks
// alive; before every step the rank asks whether a process waits to join,
// and if so all reconfigure to admit it). Every step's result is checked
// against the world size of its epoch (exit 7 if wrong).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "muster/world.h"

namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

int IntFlag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    int value;
    if (std::string(argv[i]) == name && absl::SimpleAtoi(argv[i + 1], &value)) return value;
  }
  return fallback;
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int value = 0;
  return v != nullptr && absl::SimpleAtoi(v, &value) ? value : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = IntFlag(argc, argv, "--steps", 20);
  const int kill_rank = IntFlag(argc, argv, "--kill-rank", -1);
  const int kill_step = IntFlag(argc, argv, "--kill-step", -1);
  const int elements = IntFlag(argc, argv, "--elements", 1024);
  const int step_ms = IntFlag(argc, argv, "--step-ms", 0);
  const bool shrink = IntFlag(argc, argv, "--shrink", 0) != 0;
  const int restarts = EnvInt("MUSTER_RESTART_COUNT");
  const bool first_process = restarts == 0 && EnvInt("MUSTER_GENERATION") == 0;
  std::printf("BOOT rank=%d pid=%d t_us=%lld\n", EnvInt("RANK"), ::getpid(),
              static_cast<long long>(NowMicros()));
  std::fflush(stdout);

  absl::StatusOr<std::unique_ptr<muster::World>> joined = muster::World::Init({});
  if (!joined.ok()) {
    std::fprintf(stderr, "init failed: %s\n", joined.status().ToString().c_str());
    return 3;
  }
  muster::World& world = **joined;
  int rank = world.rank();
  std::printf("START rank=%d pid=%d epoch=%lld restarts=%d t_us=%lld\n", rank, ::getpid(),
              static_cast<long long>(world.epoch()), restarts, static_cast<long long>(NowMicros()));
  std::fflush(stdout);

  double total = 0;
  int done = 0;  // steps completed
  // After Init (a replacement) or Reconfigure: resume where the rank that
  // got furthest is.
  auto resynchronize = [&]() -> absl::Status {
    muster::ProcessGroup& g = world.world_group();
    std::vector<int64_t> mine = {done};
    std::vector<int64_t> all(g.size());
    muster::Tensor in{mine.data(), 1, muster::DType::kInt64};
    muster::Tensor out{all.data(), all.size(), muster::DType::kInt64};
    if (absl::Status s = g.AllGatherIntoTensor(out, in)->Wait(); !s.ok()) return s;
    int root = 0;
    for (int r = 0; r < g.size(); ++r) {
      if (all[r] > all[root]) root = r;
    }
    std::vector<double> state = {total, static_cast<double>(all[root])};
    muster::Tensor t{state.data(), state.size(), muster::DType::kFloat64};
    if (absl::Status s = g.Broadcast(t, root)->Wait(); !s.ok()) return s;
    total = state[0];
    done = static_cast<int>(state[1]);
    std::printf("RESUME rank=%d step=%d from=%d\n", rank, done + 1, root);
    std::fflush(stdout);
    return absl::OkStatus();
  };
  if (world.epoch() > 0) {
    if (absl::Status s = resynchronize(); !s.ok()) {
      std::fprintf(stderr, "rank %d: resynchronizing failed: %s\n", rank, s.ToString().c_str());
      return 4;
    }
  }

  std::vector<float> buffer(elements);
  int reconfigurations = 0;
  muster::World::ReconfigureOptions how;
  how.allow_shrink = shrink;
  while (done < steps) {
    const int step = done + 1;
    if (shrink) {
      // Admit processes waiting to join (all ranks ask at the same step, so
      // all reconfigure together: the answer is agreed by an all_reduce).
      absl::StatusOr<int> waiting = world.PendingJoins();
      std::vector<int32_t> any = {waiting.ok() ? *waiting : 0};
      muster::Tensor w{any.data(), 1, muster::DType::kInt32};
      if (world.world_group().AllReduce(w, muster::ReduceOp::kMax)->Wait().ok() && any[0] > 0) {
        absl::StatusOr<int64_t> epoch = world.Reconfigure(how);
        if (!epoch.ok()) {
          std::fprintf(stderr, "rank %d: growing failed: %s\n", rank,
                       epoch.status().ToString().c_str());
          return 6;
        }
        rank = world.rank();
        std::printf("GREW rank=%d epoch=%lld world=%d\n", rank, static_cast<long long>(*epoch),
                    world.world_size());
        std::fflush(stdout);
        if (absl::Status r = resynchronize(); !r.ok()) {
          std::fprintf(stderr, "rank %d: resynchronizing failed: %s\n", rank, r.ToString().c_str());
          return 4;
        }
        continue;
      }
    }
    for (float& x : buffer) x = static_cast<float>(step * (rank + 1));
    muster::Tensor t{buffer.data(), buffer.size(), muster::DType::kFloat32};
    absl::Status s = world.world_group().AllReduce(t)->Wait();
    if (s.ok()) {
      const int n = world.world_size();
      if (buffer[0] != static_cast<float>(step * n * (n + 1) / 2)) {
        std::fprintf(stderr, "rank %d: step %d got %g in a world of %d\n", rank, step, buffer[0],
                     n);
        return 7;
      }
      total += buffer[0];
      done = step;
      if (rank == kill_rank && step == kill_step && first_process) {
        std::printf("KILL rank=%d step=%d t_us=%lld\n", rank, step,
                    static_cast<long long>(NowMicros()));
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      if (step_ms > 0) absl::SleepFor(absl::Milliseconds(step_ms));
      continue;
    }
    std::printf("FAILED rank=%d step=%d: %s\n", rank, step, s.ToString().c_str());
    std::fflush(stdout);
    if (++reconfigurations > 3) return 5;
    absl::Time start = absl::Now();
    absl::StatusOr<int64_t> epoch = world.Reconfigure(how);
    if (!epoch.ok()) {
      std::fprintf(stderr, "rank %d: reconfigure failed: %s\n", rank,
                   epoch.status().ToString().c_str());
      return 6;
    }
    rank = world.rank();
    std::printf("RECONFIGURED rank=%d epoch=%lld t_us=%lld took_ms=%lld world=%d\n", rank,
                static_cast<long long>(*epoch), static_cast<long long>(NowMicros()),
                static_cast<long long>(absl::ToInt64Milliseconds(absl::Now() - start)),
                world.world_size());
    std::fflush(stdout);
    if (absl::Status r = resynchronize(); !r.ok()) {
      std::fprintf(stderr, "rank %d: resynchronizing failed: %s\n", rank, r.ToString().c_str());
      return 4;
    }
  }
  std::printf("FINAL rank=%d total=%.0f steps=%d epoch=%lld pid=%d world=%d\n", rank, total, done,
              static_cast<long long>(world.epoch()), ::getpid(), world.world_size());
  std::fflush(stdout);
  return 0;
}
