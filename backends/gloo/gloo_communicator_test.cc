// Rank-per-thread test of GlooCommunicator over loopback: three ranks
// rendezvous through a HashStore and run every collective; results are
// checked on the test's thread.
#include "backends/gloo/gloo_communicator.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <thread>

#include "muster/hash_store.h"

namespace muster {
namespace {

TEST_CASE("every collective over Gloo on three ranks gives the expected results") {
  constexpr int kWorld = 3;
  auto store = std::make_shared<HashStore>();
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<std::string>> failures(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) { failures[r].push_back(what); };
      auto comm = GlooCommunicator::Connect(store, r, kWorld, "127.0.0.1", absl::Seconds(20));
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      GlooCommunicator& c = **comm;
      absl::Time d = absl::Now() + absl::Seconds(20);
      std::vector<int32_t> v(1001);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i + r);
      if (!c.AllReduce(v.data(), v.size(), DType::kInt32, ReduceOp::kSum, 1, d).ok()) fail("sum");
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] != static_cast<int32_t>(3 * i + 3)) {
          fail("sum value");
          break;
        }
      }
      std::vector<float> avg(7, static_cast<float>(r));
      if (!c.AllReduce(avg.data(), 7, DType::kFloat32, ReduceOp::kAvg, 1, d).ok()) fail("avg");
      if (avg[6] != 1.0f) fail("avg value");
      std::vector<double> pre(5, 1.0);
      if (!c.AllReduce(pre.data(), 5, DType::kFloat64, ReduceOp::kPremulSum, 0.5, d).ok())
        fail("premul");
      if (pre[0] != 1.5) fail("premul value");
      double b = r == 2 ? 42.0 : 0;
      if (!c.Broadcast(&b, 1, DType::kFloat64, 2, d).ok() || b != 42.0) fail("broadcast");
      int64_t mine = r * 10, all[kWorld] = {};
      if (!c.AllGather(&mine, all, 1, DType::kInt64, d).ok() || all[2] != 20) fail("all_gather");
      int64_t gathered[kWorld] = {};
      if (!c.Gather(&mine, gathered, 1, DType::kInt64, 0, d).ok()) fail("gather");
      if (r == 0 && gathered[1] != 10) fail("gather value");
      int64_t pieces[kWorld] = {7, 8, 9}, piece = -1;
      if (!c.Scatter(pieces, &piece, 1, DType::kInt64, 1, d).ok() || piece != 7 + r)
        fail("scatter");
      int32_t blocks[kWorld] = {r, r, r}, out = -1;
      if (!c.ReduceScatter(blocks, &out, 1, DType::kInt32, ReduceOp::kMax, 1, d).ok() || out != 2) {
        fail("reduce_scatter");
      }
      std::vector<size_t> send(kWorld, 2), recv(kWorld, 2);
      int16_t src[6], dst[6] = {};
      for (int j = 0; j < kWorld; ++j)
        src[2 * j] = src[2 * j + 1] = static_cast<int16_t>(r * 10 + j);
      // int16 is not a muster dtype: move it as two int8s per element.
      if (!c.AllToAll(src, {4, 4, 4}, dst, {4, 4, 4}, DType::kInt8, d).ok()) fail("all_to_all");
      for (int j = 0; j < kWorld; ++j) {
        if (dst[2 * j] != j * 10 + r) fail("all_to_all value");
      }
      if (!c.Barrier(d).ok()) fail("barrier");
      std::vector<uint16_t> none;
      if (!c.AllReduce(none.data(), 0, DType::kFloat16, ReduceOp::kSum, 1, d).ok()) fail("empty");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    CHECK(status[r].ok());
    CHECK(failures[r] == std::vector<std::string>{});
  }
}

TEST_CASE("mismatched collectives across nodes fail on every rank, naming both calls") {
  auto store = std::make_shared<HashStore>();
  std::vector<absl::Status> result(2), after(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Connect(store, r, 2, "127.0.0.1", absl::Seconds(20));
      if (!comm.ok()) {
        result[r] = comm.status();
        return;
      }
      absl::Time d = absl::Now() + absl::Seconds(20);
      float v[4] = {1, 2, 3, 4};
      result[r] = r == 0 ? (*comm)->AllReduce(v, 4, DType::kFloat32, ReduceOp::kSum, 1, d)
                         : (*comm)->Broadcast(v, 4, DType::kFloat32, 0, d);
      after[r] = (*comm)->Barrier(d);  // still usable
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO(result[r].ToString());
    CHECK(result[r].code() == absl::StatusCode::kFailedPrecondition);
    CHECK(after[r].ok());
  }
  CHECK(std::string(result[0].message()) ==
        "collectives do not match across nodes: group rank 0 called all_reduce #1(float32, count "
        "4, SUM) but group rank 1 called broadcast #1(float32, count 4, root 0)");
}

TEST_CASE("all_to_all splits that do not match fail on every rank, naming them") {
  // Without the signature exchange too: the hierarchical all_to_all runs on
  // such a mesh. Before, Gloo's I/O thread aborted the receiving process.
  bool check_signatures = GENERATE(true, false);
  auto store = std::make_shared<HashStore>();
  std::vector<absl::Status> result(2), after(2), counts(2);
  std::vector<std::vector<int8_t>> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm =
          GlooCommunicator::Connect(store, r, 2, "127.0.0.1", absl::Seconds(20), check_signatures);
      if (!comm.ok()) {
        result[r] = comm.status();
        return;
      }
      absl::Time d = absl::Now() + absl::Seconds(20);
      int8_t src[6] = {1, 2, 3, 4, 5, 6}, dst[6] = {};
      // Rank 0 sends 4 elements to rank 1, which expects 2.
      std::vector<size_t> send = r == 0 ? std::vector<size_t>{2, 4} : std::vector<size_t>{2, 2};
      result[r] = (*comm)->AllToAll(src, send, dst, {2, 2}, DType::kInt8, d);
      counts[r] = (*comm)->AllToAll(src, {2}, dst, {2}, DType::kInt8, d);
      // Still usable.
      for (int8_t& x : src) x = static_cast<int8_t>(x + 10 * r);
      after[r] = (*comm)->AllToAll(src, {2, 2}, dst, {2, 2}, DType::kInt8, d);
      got[r].assign(dst, dst + 4);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << result[r].ToString());
    CHECK(result[r].code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(result[r].message()) ==
          "all_to_all: group rank 0 sends 4 elements to group rank 1, which expects 2");
    CHECK(std::string(counts[r].message()) ==
          "all_to_all needs 2 send and receive counts (one per rank)");
    CHECK(after[r].ok());
  }
  CHECK(got[0] == std::vector<int8_t>{1, 2, 11, 12});
  CHECK(got[1] == std::vector<int8_t>{3, 4, 13, 14});
}

TEST_CASE("a bad root is refused before any data moves") {
  auto store = std::make_shared<HashStore>();
  auto comm = GlooCommunicator::Connect(store, 0, 1, "127.0.0.1", absl::Seconds(20));
  REQUIRE(comm.ok());
  double x = 1;
  absl::Time d = absl::Now() + absl::Seconds(5);
  CHECK((*comm)->Broadcast(&x, 1, DType::kFloat64, 1, d).message() ==
        "root 1 is outside the group of size 1");
  CHECK((*comm)->Gather(&x, &x, 1, DType::kFloat64, -1, d).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*comm)->Scatter(&x, &x, 1, DType::kFloat64, 5, d).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*comm)->Reduce(&x, 1, DType::kFloat64, ReduceOp::kSum, 1, 2, d).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*comm)->Barrier(d).ok());  // nothing was half-started
}

TEST_CASE("a member that never connects makes Connect fail instead of hanging") {
  auto store = std::make_shared<HashStore>();
  absl::Time start = absl::Now();
  auto comm = GlooCommunicator::Connect(store, 0, 2, "127.0.0.1", absl::Seconds(1));
  CHECK_FALSE(comm.ok());
  CHECK(absl::Now() - start < absl::Seconds(20));
}

TEST_CASE("a rank arriving after the others timed out fails that collective too") {
  // Ranks 0 and 1 give up after 300 ms; rank 2 arrives after 1 s with a far
  // deadline: no rank may complete the collective the others failed, and
  // the mesh is broken for all.
  constexpr int kWorld = 3;
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooCommunicator> comms[kWorld];
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto c = GlooCommunicator::Connect(store, r, kWorld, "127.0.0.1", absl::Seconds(20));
      if (c.ok()) comms[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (auto& c : comms) REQUIRE(c != nullptr);
  std::vector<absl::Status> results(kWorld), after(kWorld);
  std::vector<absl::Duration> took(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::vector<int32_t> v(64, r + 1);
      absl::Time deadline = absl::Now() + absl::Milliseconds(300);
      if (r == kWorld - 1) {
        absl::SleepFor(absl::Seconds(1));
        deadline = absl::Now() + absl::Seconds(10);
      }
      absl::Time start = absl::Now();
      results[r] =
          comms[r]->AllReduce(v.data(), v.size(), DType::kInt32, ReduceOp::kSum, 1, deadline);
      took[r] = absl::Now() - start;
      after[r] = comms[r]->AllReduce(v.data(), v.size(), DType::kInt32, ReduceOp::kSum, 1,
                                     absl::Now() + absl::Seconds(5));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << results[r].ToString() << " / after: " << after[r].ToString());
    CHECK_FALSE(results[r].ok());
    CHECK_FALSE(after[r].ok());
  }
  CHECK(results[0].code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took[kWorld - 1] < absl::Seconds(3));  // not its own 10 s deadline
}

TEST_CASE("Abort from another thread fails the rank's pending collective and later ones") {
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooCommunicator> comms[2];
  std::thread connect1([&] {
    auto c = GlooCommunicator::Connect(store, 1, 2, "127.0.0.1", absl::Seconds(20));
    if (c.ok()) comms[1] = std::move(*c);
  });
  auto c0 = GlooCommunicator::Connect(store, 0, 2, "127.0.0.1", absl::Seconds(20));
  connect1.join();
  REQUIRE(c0.ok());
  REQUIRE(comms[1] != nullptr);
  comms[0] = std::move(*c0);
  const absl::Status gone = absl::UnavailableError("musterd is gone");
  // Rank 1 waits in an all_reduce rank 0 never joins; rank 0 aborts.
  absl::Status waited;
  absl::Duration took;
  std::thread waiter([&] {
    int32_t v = 1;
    absl::Time start = absl::Now();
    waited = comms[1]->AllReduce(&v, 1, DType::kInt32, ReduceOp::kSum, 1,
                                 absl::Now() + absl::Seconds(20));
    took = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));
  comms[0]->Abort(gone);
  waiter.join();
  // The peer sees the connections end (ABORTED), long before its deadline.
  CHECK(waited.code() == absl::StatusCode::kAborted);
  CHECK(took < absl::Seconds(5));
  int32_t v = 1;
  CHECK(comms[0]->AllReduce(&v, 1, DType::kInt32, ReduceOp::kSum, 1,
                            absl::Now() + absl::Seconds(5)) == gone);
}

TEST_CASE("Abort does not interrupt the rank's own wait inside Gloo: it ends at its deadline") {
  // Documents a limitation of Debian's Gloo (see GlooCommunicator::Abort).
  // If this starts failing because the wait ends early, Gloo learned to
  // wake local waiters: update that comment and the SDK's.
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooCommunicator> peer;
  std::thread connect1([&] {
    auto c = GlooCommunicator::Connect(store, 1, 2, "127.0.0.1", absl::Seconds(20));
    if (c.ok()) peer = std::move(*c);
  });
  auto c0 = GlooCommunicator::Connect(store, 0, 2, "127.0.0.1", absl::Seconds(20));
  connect1.join();
  REQUIRE(c0.ok());
  REQUIRE(peer != nullptr);
  const absl::Status gone = absl::UnavailableError("musterd is gone");
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    (*c0)->Abort(gone);
  });
  int32_t v = 1;
  absl::Time start = absl::Now();
  absl::Status s =
      (*c0)->AllReduce(&v, 1, DType::kInt32, ReduceOp::kSum, 1, absl::Now() + absl::Seconds(1));
  absl::Duration took = absl::Now() - start;
  aborter.join();
  CHECK(s == gone);
  CHECK(took > absl::Milliseconds(800));
}

TEST_CASE("a collective in flight when Abort comes finishes with its peers; then the mesh closes") {
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooCommunicator> peer;
  std::thread connect1([&] {
    auto c = GlooCommunicator::Connect(store, 1, 2, "127.0.0.1", absl::Seconds(20));
    if (c.ok()) peer = std::move(*c);
  });
  auto c0 = GlooCommunicator::Connect(store, 0, 2, "127.0.0.1", absl::Seconds(20));
  connect1.join();
  REQUIRE(c0.ok());
  REQUIRE(peer != nullptr);
  const absl::Status gone = absl::UnavailableError("musterd is gone");
  absl::Status peer_first, peer_second;
  absl::Duration peer_waited;
  int32_t theirs = 2;
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));  // joins after rank 0 was aborted
    peer_first = peer->AllReduce(&theirs, 1, DType::kInt32, ReduceOp::kSum, 1,
                                 absl::Now() + absl::Seconds(20));
    absl::Time start = absl::Now();
    int32_t again = 1;
    peer_second = peer->AllReduce(&again, 1, DType::kInt32, ReduceOp::kSum, 1,
                                  absl::Now() + absl::Seconds(20));
    peer_waited = absl::Now() - start;
  });
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    (*c0)->Abort(gone);
  });
  int32_t mine = 1;
  absl::Time start = absl::Now();
  absl::Status first =
      (*c0)->AllReduce(&mine, 1, DType::kInt32, ReduceOp::kSum, 1, absl::Now() + absl::Seconds(20));
  absl::Duration took = absl::Now() - start;
  aborter.join();
  late.join();
  CHECK(first.ok());
  CHECK(mine == 3);
  CHECK(took < absl::Seconds(5));
  CHECK(peer_first.ok());
  CHECK(theirs == 3);
  // The mesh closed when the collective ended: the peer's next one fails
  // at once, this rank's is refused.
  CHECK(peer_second.code() == absl::StatusCode::kAborted);
  CHECK(peer_waited < absl::Seconds(5));
  CHECK((*c0)->Barrier(absl::Now() + absl::Seconds(5)) == gone);
}

}  // namespace
}  // namespace muster
