// Rank-per-thread tests of HierarchicalCommunicator: the ranks of one
// process are split across fake "nodes", each node with its own
// shared-memory segment (what musterd creates for a node's members of a
// spanning group), leaders and the flat mesh over Gloo on loopback. Every
// collective is checked against a reference computed here, at world sizes
// 2, 3 and 4 with several node layouts (odd sizes, nodes whose ranks are
// not consecutive, one-rank nodes). Results are recorded per thread and
// checked on the test's thread.
#include "backends/hier/hierarchical_communicator.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/shm/collectives.h"
#include "muster/hash_store.h"
#include "muster/prefix_store.h"

namespace muster {
namespace {

std::atomic<int> segment_counter{0};

// One fake job: node_ids[i] is group rank i's node.
struct FakeJob {
  explicit FakeJob(std::vector<std::string> node_ids, uint64_t slot_bytes = 64 << 10)
      : ids(std::move(node_ids)), topology(NodeTopology::FromNodeIds(ids)) {
    for (int k = 0; k < topology.nodes(); ++k) {
      std::string name = absl::StrCat("/muster-hier-test.", ::getpid(), ".", segment_counter++);
      auto s = GroupSegment::Create(name, static_cast<int>(topology.members[k].size()), slot_bytes);
      REQUIRE(s.ok());
      GroupSegment::Unlink(name);
      segments.push_back(std::move(*s));
    }
  }
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
  absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> Connect(int r) {
    int n = static_cast<int>(ids.size());
    int node = topology.node_of[r];
    absl::Duration timeout = absl::Seconds(30);
    auto flat = GlooCommunicator::Connect(std::make_shared<PrefixStore>("flat", store), r, n,
                                          "127.0.0.1", timeout, false);
    if (!flat.ok()) return flat.status();
    std::unique_ptr<GlooCommunicator> leaders;
    if (topology.local_index[r] == 0 && topology.nodes() > 1) {
      auto l = GlooCommunicator::Connect(std::make_shared<PrefixStore>("leaders", store), node,
                                         topology.nodes(), "127.0.0.1", timeout, false);
      if (!l.ok()) return l.status();
      leaders = std::move(*l);
    }
    std::vector<int> global(n);
    for (int i = 0; i < n; ++i) global[i] = 100 + i;
    std::vector<int> local_global;
    for (int m : topology.members[node]) local_global.push_back(100 + m);
    auto local = std::make_unique<ShmCommunicator>(segments[node].get(), topology.local_index[r],
                                                   "g", local_global);
    if (configure) configure(r, *local);
    return std::make_unique<HierarchicalCommunicator>(r, topology, std::move(local),
                                                      segments[node].get(), std::move(leaders),
                                                      std::move(*flat), "g", global);
  }

  std::vector<std::string> ids;
  NodeTopology topology;
  std::vector<std::unique_ptr<GroupSegment>> segments;
  // Called on each rank's ShmCommunicator before use.
  std::function<void(int, ShmCommunicator&)> configure;
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
};

absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

// Every collective, checked against references; `large` elements for the
// all_reduce that needs several slot-sized chunks.
void EveryOp(int r, HierarchicalCommunicator& c, std::vector<std::string>& fail) {
  int n = c.size();
  auto check = [&](const absl::Status& s, bool right, const std::string& what) {
    if (!s.ok()) {
      fail.push_back(absl::StrCat(what, ": ", s.ToString()));
    } else if (!right) {
      fail.push_back(absl::StrCat(what, ": wrong result"));
    }
  };
  // all_reduce, integer ops.
  struct IntCase {
    ReduceOp op;
    int64_t (*ref)(int n);
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    std::vector<int64_t> v(37);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((r + 2) * (i % 5 + 1));
    absl::Status s = c.AllReduce(v.data(), v.size(), DType::kInt64, op, 1.0, Deadline());
    bool right = true;
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t want = (2) * static_cast<int64_t>(i % 5 + 1);
      for (int j = 1; j < n; ++j) {
        int64_t x = static_cast<int64_t>((j + 2) * (i % 5 + 1));
        switch (op) {
          case ReduceOp::kSum:
            want += x;
            break;
          case ReduceOp::kProduct:
            want *= x;
            break;
          case ReduceOp::kMin:
            want = std::min(want, x);
            break;
          case ReduceOp::kMax:
            want = std::max(want, x);
            break;
          case ReduceOp::kBand:
            want &= x;
            break;
          case ReduceOp::kBor:
            want |= x;
            break;
          case ReduceOp::kBxor:
            want ^= x;
            break;
          default:
            break;
        }
      }
      right &= v[i] == want;
    }
    check(s, right, absl::StrCat("all_reduce int64 ", ReduceOpName(op)));
  }
  // all_reduce, floating ops, and a buffer larger than a slot.
  {
    std::vector<float> v(100003);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r + 1) + (i % 7);
    absl::Status s =
        c.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kAvg, 1, Deadline());
    bool right = true;
    for (size_t i = 0; i < v.size(); ++i) {
      right &= std::fabs(v[i] - ((n + 1) / 2.0f + (i % 7))) < 1e-4;
    }
    check(s, right, "all_reduce float32 AVG (several chunks)");
    std::vector<double> p(9, r + 1.0);
    s = c.AllReduce(p.data(), p.size(), DType::kFloat64, ReduceOp::kPremulSum, 0.5, Deadline());
    check(s, p[8] == 0.5 * n * (n + 1) / 2, "all_reduce float64 PREMUL_SUM");
    std::vector<double> m(5, r == n - 1 ? -3.0 : r * 1.5);
    s = c.AllReduce(m.data(), m.size(), DType::kFloat64, ReduceOp::kMin, 1, Deadline());
    check(s, m[4] == -3.0, "all_reduce float64 MIN");
    uint8_t b[3] = {static_cast<uint8_t>(r == 1), 0, 1};
    s = c.AllReduce(b, 3, DType::kBool, ReduceOp::kSum, 1, Deadline());
    check(s, b[0] == 1 && b[1] == 0 && b[2] == 1, "all_reduce bool SUM");
    s = c.AllReduce(nullptr, 0, DType::kFloat16, ReduceOp::kSum, 1, Deadline());
    check(s, true, "empty all_reduce");
  }
  // broadcast and reduce from every root.
  for (int root = 0; root < n; ++root) {
    std::vector<int32_t> v(1000, r == root ? 7 * root + 1 : -1);
    absl::Status s = c.Broadcast(v.data(), v.size(), DType::kInt32, root, Deadline());
    check(s, v[0] == 7 * root + 1 && v[999] == 7 * root + 1, absl::StrCat("broadcast root ", root));
    std::vector<int32_t> w(11, r + 1);
    s = c.Reduce(w.data(), w.size(), DType::kInt32, ReduceOp::kSum, 1, root, Deadline());
    check(s, r == root ? w[10] == n * (n + 1) / 2 : w[10] == r + 1,
          absl::StrCat("reduce root ", root));
  }
  // all_gather.
  {
    int16_t mine[3] = {static_cast<int16_t>(r), static_cast<int16_t>(10 * r), -1};
    std::vector<int16_t> all(3 * n, 0);
    absl::Status s = c.AllGather(mine, all.data(), 6, DType::kUInt8, Deadline());
    bool right = true;
    for (int j = 0; j < n; ++j) right &= all[3 * j] == j && all[3 * j + 1] == 10 * j;
    check(s, right, "all_gather");
  }
  // gather and scatter to/from every root.
  for (int root = 0; root < n; ++root) {
    int64_t mine = 1000 * root + r;
    std::vector<int64_t> all(n, -1);
    absl::Status s = c.Gather(&mine, all.data(), 1, DType::kInt64, root, Deadline());
    bool right = true;
    for (int j = 0; r == root && j < n; ++j) right &= all[j] == 1000 * root + j;
    check(s, right, absl::StrCat("gather root ", root));
    std::vector<int64_t> pieces(2 * n);
    for (int j = 0; j < 2 * n; ++j) pieces[j] = root * 100 + j;
    int64_t got[2] = {-1, -1};
    s = c.Scatter(pieces.data(), got, 2, DType::kInt64, root, Deadline());
    check(s, got[0] == root * 100 + 2 * r && got[1] == root * 100 + 2 * r + 1,
          absl::StrCat("scatter root ", root));
  }
  // reduce_scatter.
  {
    std::vector<int32_t> in(2 * n);
    for (int j = 0; j < 2 * n; ++j) in[j] = (r + 1) * (j + 1);
    int32_t out[2] = {-1, -1};
    absl::Status s =
        c.ReduceScatter(in.data(), out, 2, DType::kInt32, ReduceOp::kSum, 1, Deadline());
    int sum = n * (n + 1) / 2;
    check(s, out[0] == sum * (2 * r + 1) && out[1] == sum * (2 * r + 2), "reduce_scatter");
  }
  // all_to_all with uneven counts: rank i sends j+1 elements to rank j.
  {
    std::vector<size_t> send(n), recv(n);
    std::vector<int32_t> in;
    for (int j = 0; j < n; ++j) {
      send[j] = r + 1;
      recv[j] = j + 1;
      for (int k = 0; k <= r; ++k) in.push_back(r * 100 + j);
    }
    std::vector<int32_t> out(n * (n + 1) / 2, -1);
    absl::Status s = c.AllToAll(in.data(), send, out.data(), recv, DType::kInt32, Deadline());
    bool right = true;
    size_t off = 0;
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k <= j; ++k) right &= out[off++] == j * 100 + r;
    }
    check(s, right, "all_to_all");
  }
  check(c.Barrier(Deadline()), true, "barrier");
}

TEST_CASE("every collective across fake nodes, world 2, 3 and 4") {
  std::vector<std::vector<std::string>> layouts = {
      {"a", "b"},            // world 2: one rank per node
      {"a", "b", "a"},       // world 3: node a holds ranks 0 and 2
      {"a", "a", "b"},       // world 3: leaders 0 and 2
      {"a", "a", "b", "b"},  // world 4: two per node
      {"a", "b", "c", "a"},  // world 4: three nodes, ranks 0 and 3 together
  };
  for (const auto& layout : layouts) {
    DYNAMIC_SECTION("nodes " << absl::StrJoin(layout, ",")) {
      FakeJob job(layout);
      auto failures = job.Run(EveryOp);
      for (size_t r = 0; r < failures.size(); ++r) {
        INFO("rank " << r);
        CHECK(failures[r] == std::vector<std::string>{});
      }
    }
  }
}

TEST_CASE("topology: nodes in order of their lowest rank, leaders first") {
  NodeTopology t = NodeTopology::FromNodeIds({"x", "y", "x", "z", "y"});
  CHECK(t.nodes() == 3);
  CHECK(t.members == std::vector<std::vector<int>>{{0, 2}, {1, 4}, {3}});
  CHECK(t.node_of == std::vector<int>{0, 1, 0, 2, 1});
  CHECK(t.local_index == std::vector<int>{0, 0, 1, 0, 1});
  CHECK(t.leader(1) == 1);
}

TEST_CASE("mismatched collectives fail on every rank naming both calls; the group stays usable") {
  SECTION("across nodes") {
    FakeJob job({"a", "a", "b", "b"});
    std::vector<absl::Status> result(4), after(4);
    job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>&) {
      float v[4] = {1, 2, 3, 4};
      result[r] = r < 2 ? c.AllReduce(v, 4, DType::kFloat32, ReduceOp::kSum, 1, Deadline())
                        : c.Broadcast(v, 4, DType::kFloat32, 0, Deadline());
      after[r] = c.Barrier(Deadline());
    });
    for (int r = 0; r < 4; ++r) {
      INFO(result[r].ToString());
      CHECK(result[r].code() == absl::StatusCode::kFailedPrecondition);
      CHECK(result[r].message() ==
            "collectives do not match across nodes: group rank 0 called all_reduce #1(float32, "
            "count 4, SUM) but group rank 2 called broadcast #1(float32, count 4, root 0)");
      CHECK(after[r].ok());
    }
  }
  SECTION("within a node, seen on the other node too") {
    FakeJob job({"a", "b", "b"});
    std::vector<absl::Status> result(3), after(3);
    job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>&) {
      int32_t v[2] = {1, 2};
      result[r] = c.AllReduce(v, r == 2 ? 1 : 2, DType::kInt32, ReduceOp::kMax, 1, Deadline());
      after[r] = c.AllReduce(v, 2, DType::kInt32, ReduceOp::kMax, 1, Deadline());
    });
    for (int r = 0; r < 3; ++r) {
      INFO(result[r].ToString());
      CHECK(result[r].message() ==
            "collectives do not match across nodes: group rank 1 called all_reduce #1(int32, "
            "count 2, MAX) but group rank 2 called all_reduce #1(int32, count 1, MAX)");
      CHECK(after[r].ok());
    }
  }
}

TEST_CASE("bad arguments are refused before any data moves") {
  FakeJob job({"a", "b"});
  std::vector<std::vector<absl::Status>> got(2);
  job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>&) {
    double x = 1;
    got[r].push_back(c.Broadcast(&x, 1, DType::kFloat64, 2, Deadline()));
    got[r].push_back(c.AllReduce(&x, 1, DType::kFloat64, ReduceOp::kBxor, 1, Deadline()));
    got[r].push_back(c.Reduce(&x, 1, DType::kFloat64, ReduceOp::kSum, 1, -1, Deadline()));
    got[r].push_back(c.Barrier(Deadline()));
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(got[r][0].message() == "root 2 is outside the group of size 2");
    CHECK(got[r][1].code() == absl::StatusCode::kInvalidArgument);
    CHECK(got[r][2].code() == absl::StatusCode::kInvalidArgument);
    CHECK(got[r][3].ok());
  }
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

TEST_CASE("a member that dies fails every other member within 2 s, naming it") {
  // Node b's leader (rank 2) "dies" during an all_reduce: its connections
  // close, and "musterd" aborts every node's segment naming it 300 ms
  // later (a remote daemon learns of a failure through the job's store).
  FakeJob job({"a", "a", "b", "b"});
  std::vector<absl::Status> result(4);
  std::vector<absl::Duration> took(4);
  std::string reason = "rank 102 (host b, pid 1) failed: killed by signal 9";
  std::thread remote_daemon;  // node a's "musterd", joined below
  job.Run([&](int r, HierarchicalCommunicator& c, std::vector<std::string>&) {
    std::vector<float> v(1000, 1.0f);
    if (!c.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1, Deadline()).ok()) {
      result[r] = absl::InternalError("first all_reduce failed");
      return;
    }
    absl::Time start = absl::Now();
    if (r == 2) {
      absl::SleepFor(absl::Milliseconds(200));
      job.segments[1]->Abort(reason);  // its own daemon notices at once
      return;                          // the communicator goes away: connections close
    }
    if (r == 0) {
      remote_daemon = std::thread([&] {
        absl::SleepFor(absl::Milliseconds(500));
        job.segments[0]->Abort(reason);
      });
    }
    result[r] = c.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1,
                            absl::Now() + absl::Seconds(60));
    took[r] = absl::Now() - start;
    // Broken for good.
    absl::Status again = c.Barrier(Deadline());
    if (again.code() != result[r].code()) result[r] = absl::InternalError("not broken");
  });
  remote_daemon.join();
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << result[r].ToString() << " after " << took[r]);
    CHECK(result[r].code() == absl::StatusCode::kAborted);
    CHECK(std::string(result[r].message()).find(reason) != std::string::npos);
    CHECK(took[r] < absl::Seconds(2));
  }
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
