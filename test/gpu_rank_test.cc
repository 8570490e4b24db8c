// GPU end-to-end tests (Bazel tag "gpu"): a real musterd and real rank
// processes (muster-gpu-rank), one per visible GPU (world = device count,
// at least 1). The first argument picks the test:
//
//   collectives  every rank runs every step of muster-gpu-rank's "all" mode;
//                each must print PASS (or SKIP where the world is too small)
//                and exit 0.
//   abort        the ranks keep all_reducing on group "victim" until it is
//                aborted from outside (`musterctl abort JOB victim`); each
//                must see ABORTED with the reason, then a new group works
//                and the daemon is still healthy. With two or more GPUs a
//                second job kills one rank instead, and the survivors must
//                fail ABORTED naming it.
//
// Without a CUDA device it prints "MUSTER_TEST_SKIPPED: no CUDA device
// (<cuda error>)" and exits 0 (tools/test_summary.py counts a skip). Not a
// Catch2 test: a Catch2 summary would count the skip as a pass.
//
// Single-threaded.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "backends/nccl/nccl_info.h"
#include "test/daemon_harness.h"

namespace muster::testing {
namespace {

int failures = 0;

void Check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

// Rank processes of one job on one daemon, all started before any is waited
// for.
class Job {
 public:
  Job(TestDaemon& daemon, std::string job_id, int world)
      : daemon_(daemon), job_id_(std::move(job_id)), world_(world) {}
  const std::string& job_id() const { return job_id_; }

  bool StartAll(const std::string& mode, std::map<std::string, std::string> extra = {}) {
    for (int r = 0; r < world_; ++r) {
      std::map<std::string, std::string> env = extra;
      env["RANK"] = std::to_string(r);
      env["LOCAL_RANK"] = std::to_string(r);
      env["WORLD_SIZE"] = std::to_string(world_);
      env["LOCAL_WORLD_SIZE"] = std::to_string(world_);
      env["MASTER_ADDR"] = "127.0.0.1";
      env["MASTER_PORT"] = std::to_string(daemon_.store_port());
      env["MUSTER_SOCKET"] = daemon_.socket_path();
      env["MUSTER_JOB_ID"] = job_id_;
      auto p = Subprocess::Start({RunfilePath("test/muster-gpu-rank"), mode}, dir_.path(), env);
      if (!p.ok()) {
        Check(false, absl::StrCat("start rank ", r, ": ", p.status().ToString()));
        return false;
      }
      ranks_.push_back(std::move(*p));
    }
    return true;
  }

  // Waits until every rank printed `line` (or one exited); false on timeout.
  bool AwaitLine(const std::string& line, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int seen = 0;
      for (auto& p : ranks_) {
        if (absl::StrContains(p->Stdout(), line)) {
          ++seen;
        } else if (!p->Running()) {
          return false;
        }
      }
      if (seen == static_cast<int>(ranks_.size())) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  // Waits for every rank; returns the exit of each (killed after `timeout`).
  std::vector<ExitInfo> WaitAll(absl::Duration timeout) {
    std::vector<ExitInfo> exits;
    const absl::Time deadline = absl::Now() + timeout;
    for (auto& p : ranks_) {
      auto e = p->Wait(std::max(absl::Seconds(1), deadline - absl::Now()));
      if (!e.ok()) {
        (void)p->Signal(9);
        e = p->Wait(absl::Seconds(10));
      }
      exits.push_back(e.ok() ? *e : ExitInfo{});
    }
    return exits;
  }

  void Dump() {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      std::printf("----- rank %zu stdout -----\n%s----- rank %zu stderr -----\n%s", r,
                  ranks_[r]->Stdout().c_str(), r, ranks_[r]->Stderr().c_str());
    }
    std::fflush(stdout);
  }

  std::string Stdout(int r) { return ranks_[r]->Stdout(); }

 private:
  TestDaemon& daemon_;
  std::string job_id_;
  int world_;
  TempDir dir_;
  std::vector<std::unique_ptr<Subprocess>> ranks_;
};

// Lines of `out` containing " FAIL".
std::vector<std::string> FailLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(out, '\n')) {
    if (absl::StrContains(l, " FAIL")) lines.emplace_back(l);
  }
  return lines;
}

bool Passed(const std::string& out, int rank, const std::string& step) {
  return absl::StrContains(out, absl::StrCat("rank ", rank, ": ", step, " PASS")) ||
         absl::StrContains(out, absl::StrCat("rank ", rank, ": ", step, " SKIP"));
}

void CheckDaemonHealthy(TestDaemon& daemon) {
  Check(daemon.process().Running(), "musterd is still running");
  auto r = Run({RunfilePath("tools/musterctl"), daemon.SocketFlag(), "status"});
  Check(
      r.ok() && r->exit.exited && r->exit.code == 0,
      absl::StrCat("musterctl status answers: ", r.ok() ? r->out + r->err : r.status().ToString()));
}

void TestCollectives(TestDaemon& daemon, int world) {
  Job job(daemon, "gpu_collectives", world);
  if (!job.StartAll("all")) return;
  std::vector<ExitInfo> exits = job.WaitAll(absl::Seconds(240));
  job.Dump();
  const char* steps[] = {"all_reduce_sum_float32",
                         "all_reduce_sum_float64",
                         "all_reduce_sum_int32",
                         "all_reduce_sum_int64",
                         "all_reduce_sum_float16",
                         "all_reduce_sum_bfloat16",
                         "all_reduce_avg_float32",
                         "all_reduce_avg_bfloat16",
                         "all_reduce_premul_sum_float32",
                         "all_reduce_premul_sum_float16",
                         "all_reduce_max_int32",
                         "all_reduce_max_bfloat16",
                         "all_reduce_min_float32",
                         "all_reduce_sum_float32_8MiB",
                         "all_reduce_offset_in_allocation",
                         "all_reduce_default_stream",
                         "broadcast",
                         "reduce",
                         "all_gather_into_tensor",
                         "all_gather",
                         "reduce_scatter_tensor",
                         "reduce_scatter",
                         "all_to_all_single",
                         "all_to_all_single_splits",
                         "all_to_all",
                         "gather",
                         "scatter",
                         "batch_isend_irecv_ring",
                         "send_recv",
                         "all_reduce_coalesced",
                         "stream_ordering",
                         "work_synchronize",
                         "subgroup_all",
                         "subgroup_even",
                         "world_after_subgroups",
                         "error_cuda_tensor_on_cpu_group",
                         "error_mixed_cpu_cuda",
                         "error_host_memory_as_cuda",
                         "world_after_errors"};
  for (int r = 0; r < world; ++r) {
    const std::string out = job.Stdout(r);
    Check(exits[r].exited && exits[r].code == 0,
          absl::StrCat("rank ", r, " exits 0 (", exits[r].Describe(), ")"));
    for (const std::string& l : FailLines(out)) Check(false, l);
    for (const char* step : steps) {
      Check(Passed(out, r, step), absl::StrCat("rank ", r, " ", step));
    }
  }
  CheckDaemonHealthy(daemon);
}

void TestAbort(TestDaemon& daemon, int world) {
  const std::string reason = "gpu_abort_test aborts the victim group";
  {
    Job job(daemon, "gpu_abort", world);
    if (!job.StartAll("abort", {{"MUSTER_GPU_EXPECT", reason}})) return;
    bool ready = job.AwaitLine("victim_ready PASS", absl::Seconds(120));
    Check(ready, "every rank ran a GPU all_reduce on group 'victim'");
    if (ready) {
      auto r = Run({RunfilePath("tools/musterctl"), daemon.SocketFlag(), "abort", job.job_id(),
                    "victim", "--reason", reason});
      Check(r.ok() && r->exit.exited && r->exit.code == 0,
            absl::StrCat("musterctl abort gpu_abort victim: ",
                         r.ok() ? r->out + r->err : r.status().ToString()));
    }
    std::vector<ExitInfo> exits = job.WaitAll(absl::Seconds(180));
    job.Dump();
    for (int r = 0; r < world; ++r) {
      const std::string out = job.Stdout(r);
      Check(exits[r].exited && exits[r].code == 0,
            absl::StrCat("rank ", r, " exits 0 (", exits[r].Describe(), ")"));
      for (const std::string& l : FailLines(out)) Check(false, l);
      Check(Passed(out, r, "victim_aborted"),
            absl::StrCat("rank ", r, ": the next GPU all_reduce failed ABORTED with the reason"));
      Check(Passed(out, r, "fresh_group"), absl::StrCat("rank ", r, ": a new group works"));
    }
    CheckDaemonHealthy(daemon);
  }
  if (world < 2) {
    std::printf("note: one GPU, so the rank-killed case (needs world >= 2) does not run\n");
    return;
  }
  Job job(daemon, "gpu_kill", world);
  if (!job.StartAll("kill")) return;
  std::vector<ExitInfo> exits = job.WaitAll(absl::Seconds(180));
  job.Dump();
  const int victim = world - 1;
  Check(!exits[victim].exited && exits[victim].signal == 9,
        absl::StrCat("rank ", victim, " killed itself (", exits[victim].Describe(), ")"));
  for (int r = 0; r < victim; ++r) {
    const std::string out = job.Stdout(r);
    Check(exits[r].exited && exits[r].code == 0,
          absl::StrCat("rank ", r, " exits 0 (", exits[r].Describe(), ")"));
    for (const std::string& l : FailLines(out)) Check(false, l);
    Check(Passed(out, r, "victim_aborted"),
          absl::StrCat("rank ", r, ": GPU all_reduce failed ABORTED naming rank ", victim));
  }
  CheckDaemonHealthy(daemon);
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string which = argc > 1 ? argv[1] : "";
  if (which != "collectives" && which != "abort") {
    std::fprintf(stderr, "usage: gpu_rank_test collectives|abort\n");
    return 2;
  }
  GpuStackInfo info = QueryGpuStack();
  if (info.device_count == 0) {
    std::printf("MUSTER_TEST_SKIPPED: no CUDA device (%s)\n",
                info.device_error.empty() ? "none visible" : info.device_error.c_str());
    return 0;
  }
  int world = info.device_count;
  if (const char* cap = std::getenv("MUSTER_GPU_TEST_MAX_RANKS")) {
    world = std::max(1, std::min(world, std::atoi(cap)));
  }
  std::printf("%d CUDA device(s), NCCL %s: world %d\n", info.device_count,
              FormatNcclVersion(info.nccl_version).c_str(), world);
  auto daemon = TestDaemon::Start();
  if (!daemon.ok()) {
    std::printf("FAIL: start musterd: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  if (which == "collectives") {
    TestCollectives(**daemon, world);
  } else {
    TestAbort(**daemon, world);
  }
  auto stop = (*daemon)->Stop();
  Check(stop.ok() && stop->exited && stop->code == 0,
        absl::StrCat("musterd stops cleanly (",
                     stop.ok() ? stop->Describe() : stop.status().ToString(), ")"));
  if (failures > 0) {
    std::printf("FAILED: %d check(s)\n", failures);
    std::printf("----- musterd stderr -----\n%s\n", (*daemon)->process().Stderr().c_str());
    return 1;
  }
  std::printf("PASSED\n");
  return 0;
}

}  // namespace
}  // namespace muster::testing

int main(int argc, char** argv) { return muster::testing::Main(argc, argv); }
