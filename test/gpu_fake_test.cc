// The GPU path end to end without a GPU: a real daemon (musterd-fakegpu:
// musterd with FakeGpuRuntime) and real rank processes whose "CUDA" buffers
// are shared memory (ShmCudaDriver). Covers the SDK's routing and requests,
// the Gpu gRPC service, the registry's hooks (group formation -> split,
// rank death -> abort) and the engine, across processes, and the flight
// recorder's records of CUDA collectives.
#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "test/daemon_harness.h"
#include "test/subprocess.h"

namespace muster::testing {
namespace {

std::unique_ptr<TestDaemon> StartFakeGpuDaemon() {
  TestDaemonOptions options;
  options.binary = "test/musterd-fakegpu";
  auto daemon = TestDaemon::Start(options);
  INFO(daemon.status().ToString());
  REQUIRE(daemon.ok());
  return *std::move(daemon);
}

struct Ranks {
  std::vector<std::unique_ptr<Subprocess>> processes;
  TempDir dir;
};

void StartRanks(Ranks& ranks, TestDaemon& daemon, const std::string& job,
                const std::vector<std::string>& scripts) {
  for (size_t r = 0; r < scripts.size(); ++r) {
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", std::to_string(scripts.size())},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(daemon.store_port())},
                                              {"MUSTER_SOCKET", daemon.socket_path()},
                                              {"MUSTER_JOB_ID", job}};
    auto p = Subprocess::Start({RunfilePath("test/muster-fakegpu-rank"), scripts[r]},
                               ranks.dir.path(), env);
    REQUIRE(p.ok());
    ranks.processes.push_back(std::move(*p));
  }
}

TEST_CASE("every collective on CUDA tensors runs through musterd on three real ranks") {
  auto daemon = StartFakeGpuDaemon();
  Ranks ranks;
  const std::string steps =
      "allreduce,bcast,allgather,reducescatter,alltoall,gather,p2p,subgroup,comms,mixed,cpuonly,"
      "free,allreduce";
  StartRanks(ranks, *daemon, "gpujob", {steps, steps, steps});
  std::vector<std::string> outputs;
  for (auto& p : ranks.processes) {
    auto exit = p->Wait(absl::Seconds(90));
    REQUIRE(exit.ok());
    INFO(p->Stdout() << p->Stderr());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
    outputs.push_back(p->Stdout());
  }
  for (const std::string& out : outputs) {
    for (absl::string_view step : absl::StrSplit(steps, ',')) {
      CHECK(out.find(absl::StrCat("STEP ", step, " OK")) != std::string::npos);
    }
  }
  // The subgroup's communicators were split from the healthy world ones;
  // ranks 0 and 2 own one each (rank 1 is not a member).
  const std::string& comms = outputs[0];
  INFO(comms);
  CHECK(comms.find("COMM job=gpujob group=world rank=0 origin=init state=ready") !=
        std::string::npos);
  CHECK(comms.find("COMM job=gpujob group=pair rank=0 origin=split state=ready") !=
        std::string::npos);
  CHECK(comms.find("COMM job=gpujob group=pair rank=2 origin=split state=ready") !=
        std::string::npos);
  CHECK(comms.find("COMM job=gpujob group=pair rank=1") == std::string::npos);
  // After the first request (gRPC), the world communicators were fed through
  // the shared-memory channel: launched = 1 + channel for each.
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(comms, '\n'))) {
    if (line.find("group=world") == std::string::npos) continue;
    INFO(line);
    int64_t launched = -1, channel = -1;
    for (absl::string_view word : absl::StrSplit(line, ' ')) {
      if (absl::ConsumePrefix(&word, "launched=")) CHECK(absl::SimpleAtoi(word, &launched));
      if (absl::ConsumePrefix(&word, "channel=")) CHECK(absl::SimpleAtoi(word, &channel));
    }
    CHECK(launched > 5);
    CHECK(channel == launched - 1);
  }
}

TEST_CASE("ranks that call different GPU collectives, or one that comes late, fail on every rank") {
  auto daemon = StartFakeGpuDaemon();
  Ranks ranks;
  const std::string steps = "allreduce,desync,allreduce,late";
  StartRanks(ranks, *daemon, "disagree", {steps, steps});
  for (auto& p : ranks.processes) {
    auto exit = p->Wait(absl::Seconds(60));
    REQUIRE(exit.ok());
    INFO(p->Stdout() << p->Stderr());
    CHECK(exit->code == 0);
    for (absl::string_view step : absl::StrSplit(steps, ',')) {
      CHECK(p->Stdout().find(absl::StrCat("STEP ", step, " OK")) != std::string::npos);
    }
  }
}

TEST_CASE("a rank that dies aborts the GPU communicators; the daemon serves the next job") {
  auto daemon = StartFakeGpuDaemon();
  {
    Ranks ranks;
    StartRanks(ranks, *daemon, "dies", {"allreduce,afterdeath", "allreduce,crash"});
    auto survivor = ranks.processes[0]->Wait(absl::Seconds(60));
    REQUIRE(survivor.ok());
    INFO(ranks.processes[0]->Stdout() << ranks.processes[0]->Stderr());
    CHECK(survivor->code == 0);
    CHECK(ranks.processes[0]->Stdout().find("STEP afterdeath OK") != std::string::npos);
    CHECK(ranks.processes[0]->Stdout().find("ABORTED") != std::string::npos);
    auto dead = ranks.processes[1]->Wait(absl::Seconds(10));
    REQUIRE(dead.ok());
    CHECK(dead->code == 9);
  }
  CHECK(daemon->process().Running());
  Ranks next;
  // Rank 1 cannot leave before rank 0 listed the communicators: both run a
  // second all_reduce after it.
  StartRanks(next, *daemon, "after", {"allreduce,comms,allreduce", "allreduce,allreduce"});
  for (auto& p : next.processes) {
    auto exit = p->Wait(absl::Seconds(60));
    REQUIRE(exit.ok());
    INFO(p->Stdout() << p->Stderr());
    CHECK(exit->code == 0);
  }
  // The dead job's communicators are gone; the new job's are listed.
  const std::string out = next.processes[0]->Stdout();
  INFO(out);
  CHECK(out.find("COMM job=after group=world rank=0 origin=init state=ready") != std::string::npos);
  CHECK(out.find("COMM job=after group=world rank=1") != std::string::npos);
  CHECK(out.find("job=dies") == std::string::npos);
}

TEST_CASE("the flight recorder keeps CUDA collectives (musterctl trace)") {
  auto daemon = StartFakeGpuDaemon();
  Ranks ranks;
  StartRanks(ranks, *daemon, "gputrace", {"allreduce,bcast,pause", "allreduce,bcast,pause"});
  // all_reduce float32x1000 (synchronized: completed), then broadcast
  // int64x7 from group rank 1 (waited for: enqueued, "started").
  std::string json;
  absl::Time until = absl::Now() + absl::Seconds(60);
  auto complete = [&] {
    return absl::StrContains(json, "\"rank\":0,") && absl::StrContains(json, "\"rank\":1,") &&
           json.find("broadcast") != std::string::npos &&
           json.find("broadcast", json.find("broadcast") + 1) != std::string::npos;
  };
  while (absl::Now() < until) {
    auto r = Run({RunfilePath("tools/musterctl"), daemon->SocketFlag(), "trace", "gputrace",
                  "world", "--json"});
    REQUIRE(r.ok());
    json = r->out + r->err;
    if (complete()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  INFO(json);
  REQUIRE(complete());
  for (int rank = 0; rank < 2; ++rank) {
    std::string prefix = absl::StrCat("\"rank\":", rank, ",\"group_rank\":", rank);
    bool reduce = false, bcast = false;
    for (absl::string_view line : absl::StrSplit(json, '\n')) {
      if (!absl::StrContains(line, prefix)) continue;
      if (absl::StrContains(line,
                            "\"op\":\"all_reduce\",\"dtype\":\"float32\",\"device\":"
                            "\"cuda\",\"count\":1000") &&
          absl::StrContains(line, "\"state\":\"completed\"")) {
        reduce = true;
      }
      if (absl::StrContains(line,
                            "\"op\":\"broadcast\",\"dtype\":\"int64\",\"device\":"
                            "\"cuda\",\"count\":7,\"root\":1")) {
        bcast = true;
      }
    }
    CHECK(reduce);
    CHECK(bcast);
  }
  for (auto& p : ranks.processes) (void)p->Wait(absl::Seconds(30));
}

}  // namespace
}  // namespace muster::testing
