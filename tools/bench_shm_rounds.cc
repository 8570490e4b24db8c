// bench-shm-rounds: the shared-memory collective layer alone, without the
// SDK, the daemon or the launcher. It creates one group segment, forks
// --world processes that each map it and run a ShmCommunicator
// (backends/shm/collectives.h) on it, and times --iters back-to-back calls
// of each --op (barrier, all_reduce of --bytes float32) per pass. Rank 0
// prints, per op and pass, the p50, p99 and mean of its per-call times in
// microseconds: each call is a round that every rank must reach, so rank
// 0's times are the group's. Subtracting these from muster-bench
// collectives at the same size gives what the SDK adds per call.
//
// Usage: bench-shm-rounds [--world 2] [--op barrier,all_reduce] [--bytes 4]
//                         [--iters 20000] [--passes 3] [--bind cores|none]
//                         [--json]
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/shm/collectives.h"
#include "backends/shm/segment.h"
#include "common/cpus.h"
#include "common/flags.h"

namespace {

int64_t NowNanos() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double Percentile(const std::vector<double>& sorted, double q) {
  size_t i = static_cast<size_t>(q * (sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

struct Options {
  int64_t world = 2;
  std::vector<std::string> ops;
  int64_t bytes = 4;
  int64_t iters = 20000;
  int64_t passes = 3;
  std::string bind = "none";
  bool json = false;
};

// One rank's whole run; returns its exit status.
int RunRank(const Options& o, const std::string& name, int rank) {
  if (o.bind == "cores") {
    const std::vector<int> cpus = muster::AllowedCpus();
    if (!cpus.empty() && cpus[rank % cpus.size()] < CPU_SETSIZE) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[rank % cpus.size()], &one);
      ::sched_setaffinity(0, sizeof(one), &one);
    }
  }
  auto segment = muster::GroupSegment::Open(name, static_cast<int>(o.world));
  if (!segment.ok()) {
    std::fprintf(stderr, "bench-shm-rounds: rank %d: %s\n", rank,
                 std::string(segment.status().message()).c_str());
    return 1;
  }
  std::vector<int> globals(o.world);
  std::iota(globals.begin(), globals.end(), 0);
  muster::ShmCommunicator comm(segment->get(), rank, "bench", globals);
  const size_t count = std::max<int64_t>(1, o.bytes / 4);
  std::vector<float> data(count, 1.0f);
  std::vector<double> times(o.iters);
  for (const std::string& op : o.ops) {
    for (int64_t pass = 0; pass < o.passes; ++pass) {
      const int64_t warmup = std::max<int64_t>(2, o.iters / 10);
      // One deadline per pass: a clock read per call would be timed too.
      const absl::Time deadline = absl::Now() + absl::Minutes(10);
      for (int64_t i = -warmup; i < o.iters; ++i) {
        const int64_t start = NowNanos();
        absl::Status s = op == "barrier"
                             ? comm.Barrier(deadline)
                             : comm.AllReduce(data.data(), count, muster::DType::kFloat32,
                                              muster::ReduceOp::kSum, 1.0, deadline);
        const int64_t end = NowNanos();
        if (!s.ok()) {
          std::fprintf(stderr, "bench-shm-rounds: rank %d: %s: %s\n", rank, op.c_str(),
                       std::string(s.message()).c_str());
          return 1;
        }
        if (i >= 0) times[i] = (end - start) / 1e3;
        // Keep the values bounded (the sum doubles every call).
        if (op != "barrier") std::fill(data.begin(), data.end(), 1.0f);
      }
      if (rank != 0) continue;
      std::vector<double> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      const double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / sorted.size();
      const int64_t bytes = op == "barrier" ? 0 : static_cast<int64_t>(count * 4);
      if (o.json) {
        std::printf(
            "{\"system\":\"muster-shm\",\"op\":\"%s\",\"world\":%lld,\"bytes\":%lld,\"pass\":%lld,"
            "\"iters\":%lld,\"p50_us\":%.3f,\"p99_us\":%.3f,\"mean_us\":%.3f}\n",
            op.c_str(), static_cast<long long>(o.world), static_cast<long long>(bytes),
            static_cast<long long>(pass + 1), static_cast<long long>(o.iters),
            Percentile(sorted, 0.5), Percentile(sorted, 0.99), mean);
      } else {
        std::printf(
            "%-11s world %lld  %6lld B  pass %lld  p50 %8.3f us  p99 %8.3f us  mean %8.3f us\n",
            op.c_str(), static_cast<long long>(o.world), static_cast<long long>(bytes),
            static_cast<long long>(pass + 1), Percentile(sorted, 0.5), Percentile(sorted, 0.99),
            mean);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string ops = "barrier,all_reduce";
  muster::FlagSet flags(
      "bench-shm-rounds",
      "bench-shm-rounds: times the shared-memory collective layer alone (no SDK, no\n"
      "daemon): --world forked processes on one group segment, --iters back-to-back\n"
      "calls per op and pass; rank 0 prints p50/p99/mean in microseconds. Compare with\n"
      "muster-bench collectives at the same size to see what the SDK adds per call.\n"
      "Exit status: 0, 1 if a rank failed, 2 for bad usage.");
  flags.AddInt("world", &o.world, "Ranks (processes), 1 to 64.");
  flags.AddString("op", &ops, "Comma-separated ops: barrier, all_reduce (float32 sum).");
  flags.AddInt("bytes", &o.bytes,
               "all_reduce buffer size in bytes (rounded down to floats, >= 4).");
  flags.AddInt("iters", &o.iters, "Timed calls per op and pass (after iters/10 untimed), <= 10^7.");
  flags.AddInt("passes", &o.passes, "Passes per op (each reported).");
  flags.AddString("bind", &o.bind, "cores: rank r on the r-th allowed CPU (modulo); none.");
  flags.AddBool("json", &o.json, "One JSON object per line instead of a table.");
  flags.ParseOrExit(argc, argv);
  o.ops = absl::StrSplit(ops, ',', absl::SkipEmpty());
  for (const std::string& op : o.ops) {
    if (op != "barrier" && op != "all_reduce") {
      std::fprintf(stderr, "bench-shm-rounds: unknown --op '%s' (barrier, all_reduce)\n",
                   op.c_str());
      return 2;
    }
  }
  if (o.world < 1 || o.world > 64 || o.iters < 1 || o.iters > 10000000 || o.passes < 1 ||
      o.bytes < 4 || o.bytes > (64 << 20) || (o.bind != "cores" && o.bind != "none") ||
      o.ops.empty()) {
    std::fprintf(stderr,
                 "bench-shm-rounds: need 1 <= --world <= 64, 1 <= --iters <= 10^7, --passes >= 1, "
                 "4 <= --bytes <= 64 MiB, --bind cores|none and at least one --op\n");
    return 2;
  }
  const std::string name = absl::StrCat("/muster-bench-rounds.", ::getpid());
  const uint64_t slot_bytes = std::max<uint64_t>(4096, static_cast<uint64_t>(o.bytes));
  auto owner = muster::GroupSegment::Create(name, static_cast<int>(o.world), slot_bytes);
  if (!owner.ok()) {
    std::fprintf(stderr, "bench-shm-rounds: cannot create the segment: %s\n",
                 std::string(owner.status().message()).c_str());
    return 1;
  }
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int r = 0; r < o.world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(RunRank(o, name, r));
    if (pid < 0) {
      std::perror("bench-shm-rounds: fork");
      break;
    }
    children.push_back(pid);
  }
  int failed = children.size() == static_cast<size_t>(o.world) ? 0 : 1;
  // A rank that fails (or a fork that did not happen) leaves the others
  // waiting in a round until their deadline: stop the ones still running.
  auto stop_running = [&children] {
    for (pid_t pid : children) ::kill(pid, SIGKILL);
  };
  if (failed) stop_running();
  while (!children.empty()) {
    int status = 0;
    pid_t pid = ::wait(&status);
    if (pid < 0) break;
    children.erase(std::remove(children.begin(), children.end(), pid), children.end());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (!failed) std::fprintf(stderr, "bench-shm-rounds: a rank failed; stopping the others\n");
      failed = 1;
      stop_running();
    }
  }
  muster::GroupSegment::Unlink(name);
  return failed;
}
