// Rank-per-thread tests of what is particular to HierarchicalCommunicator,
// its ranks split across FakeNodes: the topology, failures of a node-local
// stage or of connecting the leaders' mesh, Abort in a node's stage. What
// every communicator must do (every collective x dtype x op in several node
// layouts, desync across and within nodes, timeout, abort, member death)
// is the conformance suite's, run by hier_conformance_test. Results are
// recorded per thread and checked on the test's thread.
#include "backends/hier/hierarchical_communicator.h"

#include <catch2/catch.hpp>
#include <thread>

#include "backends/hier/fake_nodes.h"
#include "backends/shm/collectives.h"
#include "muster/hash_store.h"

namespace muster {
namespace {

// One fake job (FakeNodes) whose ranks run as threads.
struct FakeJob : FakeNodes {
  using FakeNodes::FakeNodes;
  // Runs body(rank, comm, failures) on one thread per rank.
  template <typename F>
  std::vector<std::vector<std::string>> Run(F body) {
    int n = static_cast<int>(ids.size());
    std::vector<std::vector<std::string>> failures(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        auto comm = Connect(r);
        if (!comm.ok()) {
          failures[r].push_back(comm.status().ToString());
          return;
        }
        body(r, **comm, failures[r]);
      });
    }
    for (auto& t : threads) t.join();
    return failures;
  }
};

absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

TEST_CASE("topology: nodes in order of their lowest rank, leaders first") {
  NodeTopology t = NodeTopology::FromNodeIds({"x", "y", "x", "z", "y"});
  CHECK(t.nodes() == 3);
  CHECK(t.members == std::vector<std::vector<int>>{{0, 2}, {1, 4}, {3}});
  CHECK(t.node_of == std::vector<int>{0, 1, 0, 2, 1});
  CHECK(t.local_index == std::vector<int>{0, 0, 1, 0, 1});
  CHECK(t.leader(1) == 1);
}

TEST_CASE("a member arriving after the others timed out fails that collective too") {
  // Nodes a = {0, 1}, b = {2, 3}: rank 3 (not a leader) and rank 1 arrive
  // after everyone else gave up. No member may complete the collective.
  for (int late : {1, 2}) {
    FakeJob job({"a", "a", "b", "b"});
    std::vector<absl::Status> result(4), again(4);
    std::vector<absl::Duration> took(4);
    job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>&) {
      std::vector<int32_t> v(16, r + 1);
      absl::Time deadline = absl::Now() + absl::Milliseconds(300);
      if (r == late || r == 3) {
        absl::SleepFor(absl::Seconds(1));
        deadline = absl::Now() + absl::Seconds(10);
      }
      absl::Time start = absl::Now();
      result[r] = c.AllReduce(v.data(), v.size(), DType::kInt32, ReduceOp::kSum, 1, deadline);
      took[r] = absl::Now() - start;
      again[r] = c.Barrier(Deadline());
    });
    for (int r = 0; r < 4; ++r) {
      INFO("late " << late << ", rank " << r << ": " << result[r].ToString() << " after " << took[r]
                   << "; then " << again[r].ToString());
      CHECK_FALSE(result[r].ok());
      CHECK_FALSE(again[r].ok());
      CHECK(took[r] < absl::Seconds(5));
    }
  }
}

TEST_CASE("a local stage failing after the signature exchange fails the other nodes at once") {
  // The root's node disagrees on the shared-memory direct path (thresholds
  // differ between its ranks): its local broadcast fails after every node
  // passed the signature exchange. The other node's leader must not wait
  // for the leaders' broadcast until its deadline.
  FakeJob job({"a", "a", "b"});
  job.configure = [](int r, ShmCommunicator& local) {
    if (r == 1) {
      DirectOptions o = local.direct_options();
      o.mapped_min_bytes = 8192;  // the broadcast, not the signature exchange
      local.set_direct_options(o);
    }
  };
  std::vector<absl::Status> result(3), again(3);
  std::vector<absl::Duration> took(3);
  job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>&) {
    std::vector<float> v(4096, static_cast<float>(r));
    absl::Time start = absl::Now();
    result[r] =
        c.Broadcast(v.data(), v.size(), DType::kFloat32, 0, absl::Now() + absl::Seconds(20));
    took[r] = absl::Now() - start;
    again[r] = c.Barrier(Deadline());
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << result[r].ToString() << " after " << took[r]);
    CHECK(!result[r].ok());
    CHECK(took[r] < absl::Seconds(5));
    CHECK(again[r].code() == result[r].code());  // broken
    if (r < 2) {
      CHECK(std::string(result[r].message()).find("direct path") != std::string::npos);
    } else {
      CHECK(result[r].code() == absl::StatusCode::kAborted);
    }
  }
}

TEST_CASE("a leader that cannot connect the leaders' mesh fails its node's members at once") {
  // Node a = ranks 0 (leader) and 1. Rank 1 connects no leaders' mesh and
  // is already in a collective when rank 0's leaders' mesh fails.
  FakeJob job({"a", "a", "b"});
  auto solo = [] {
    return GlooCommunicator::Connect(std::make_shared<HashStore>(), 0, 1, "127.0.0.1",
                                     absl::Seconds(20), false);
  };
  absl::Status connected, barrier;
  absl::Duration took;
  std::thread member([&] {
    auto flat = solo();
    if (!flat.ok()) return;
    HierarchicalCommunicator c(1, job.topology,
                               std::make_unique<ShmCommunicator>(job.segments[0].get(), 1, "g",
                                                                 std::vector<int>{100, 101}),
                               job.segments[0].get(), nullptr, std::move(*flat), "g",
                               {100, 101, 102});
    absl::Time start = absl::Now();
    barrier = c.Barrier(absl::Now() + absl::Seconds(20));
    took = absl::Now() - start;
  });
  std::unique_ptr<GlooCommunicator> flat, leaders;
  connected = ConnectSpanningMeshes(
      *job.segments[0], true, "rank 100 could not connect group 'g' across nodes",
      [&] { return solo(); },
      [&]() -> absl::StatusOr<std::unique_ptr<GlooCommunicator>> {
        absl::SleepFor(absl::Milliseconds(200));
        return absl::DeadlineExceededError("connecting the leaders' mesh timed out");
      },
      &flat, &leaders);
  member.join();
  CHECK(connected.code() == absl::StatusCode::kDeadlineExceeded);
  INFO(barrier.ToString() << " after " << took);
  CHECK(barrier.code() == absl::StatusCode::kAborted);
  CHECK(std::string(barrier.message())
            .find("rank 100 could not connect group 'g' across nodes: "
                  "connecting the leaders' mesh timed out") != std::string::npos);
  CHECK(took < absl::Seconds(5));
}

TEST_CASE("Abort wakes a member waiting in its node's stage and tells its node-mates nothing") {
  // Rank 1 waits in an all_reduce nobody else calls; its musterd goes away
  // (Abort from another thread): it fails at once with that reason, its
  // node's segment is aborted only for it (rank 0 shares the musterd and
  // learns on its own), and the group stays broken.
  FakeJob job({"a", "a", "b", "b"});
  const absl::Status gone = absl::UnavailableError("musterd (pid 9, unix:/m.sock) is gone");
  absl::Status result, again;
  absl::Duration took;
  job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>& fail) {
    std::vector<float> v(100, 1.0f);
    if (!c.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1, Deadline()).ok()) {
      fail.push_back("first all_reduce failed");
      return;
    }
    if (r != 1) return;
    std::thread reader([&] {
      absl::SleepFor(absl::Milliseconds(200));
      c.Abort(gone);
    });
    absl::Time start = absl::Now();
    result = c.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1, Deadline());
    took = absl::Now() - start;
    reader.join();
    again = c.Barrier(Deadline());
  });
  INFO(result.ToString() << " after " << took);
  CHECK(result == gone);
  CHECK(took < absl::Seconds(1));
  CHECK(again == gone);
  CHECK_FALSE(job.segments[0]->aborted());
}

}  // namespace
}  // namespace muster
