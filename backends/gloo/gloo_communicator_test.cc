// Rank-per-thread tests of what is particular to GlooCommunicator over
// loopback: connecting the mesh, and how Abort meets Gloo's waits (the
// peers stop waiting; this rank's own wait does not end early; a
// collective in flight finishes first). What every communicator must do is
// the conformance suite's, run by gloo_conformance_test.
#include "backends/gloo/gloo_communicator.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "muster/hash_store.h"

namespace muster {
namespace {

// What the SDK aborts a communicator with when its musterd is gone.
absl::Status Gone() { return absl::UnavailableError("musterd is gone"); }

// Ranks 0 and 1 of one mesh over loopback.
std::array<std::unique_ptr<GlooCommunicator>, 2> ConnectPair() {
  auto store = std::make_shared<HashStore>();
  std::array<std::unique_ptr<GlooCommunicator>, 2> comms;
  std::thread connect1([&] {
    auto c = GlooCommunicator::Connect(store, 1, 2, "127.0.0.1", absl::Seconds(20));
    if (c.ok()) comms[1] = std::move(*c);
  });
  auto c0 = GlooCommunicator::Connect(store, 0, 2, "127.0.0.1", absl::Seconds(20));
  connect1.join();
  REQUIRE(c0.ok());
  REQUIRE(comms[1] != nullptr);
  comms[0] = std::move(*c0);
  return comms;
}

// Runs `body` in a child process that starts with SIGPIPE at `disposition`;
// returns the child's wait status.
template <typename Body>
int InChild(void (*disposition)(int), Body body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGPIPE, disposition);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

void KeepSigpipe(int) {}

// The first case, so the child's fork happens before other cases leave
// Gloo threads behind.
TEST_CASE("a peer that goes away fails the collective instead of killing the rank with SIGPIPE") {
  int status = InChild(SIG_DFL, [] {
    auto comms = ConnectPair();
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    if (now.sa_handler != SIG_IGN) return 2;
    comms[1].reset();  // rank 1's process is gone: its sockets close
    std::vector<float> data(1 << 20, 1.0f);
    for (int i = 0; i < 50; ++i) {
      absl::Status s = comms[0]->AllReduce(data.data(), data.size(), DType::kFloat32,
                                           ReduceOp::kSum, 1, absl::Now() + absl::Seconds(5));
      if (!s.ok()) return 0;
    }
    return 3;  // never noticed the peer was gone
  });
  INFO("wait status " << status);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  // A handler the application installed is left alone.
  status = InChild(KeepSigpipe, [] {
    auto comms = ConnectPair();
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    return now.sa_handler == KeepSigpipe ? 0 : 2;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
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
  auto comms = ConnectPair();
  const absl::Status gone = Gone();
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
  auto comms = ConnectPair();
  GlooCommunicator* c0 = comms[0].get();
  const absl::Status gone = Gone();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    c0->Abort(gone);
  });
  int32_t v = 1;
  absl::Time start = absl::Now();
  absl::Status s =
      c0->AllReduce(&v, 1, DType::kInt32, ReduceOp::kSum, 1, absl::Now() + absl::Seconds(1));
  absl::Duration took = absl::Now() - start;
  aborter.join();
  CHECK(s == gone);
  CHECK(took > absl::Milliseconds(800));
}

TEST_CASE("a collective in flight when Abort comes finishes with its peers; then the mesh closes") {
  auto comms = ConnectPair();
  GlooCommunicator* c0 = comms[0].get();
  GlooCommunicator* peer = comms[1].get();
  const absl::Status gone = Gone();
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
    c0->Abort(gone);
  });
  int32_t mine = 1;
  absl::Time start = absl::Now();
  absl::Status first =
      c0->AllReduce(&mine, 1, DType::kInt32, ReduceOp::kSum, 1, absl::Now() + absl::Seconds(20));
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
  CHECK(c0->Barrier(absl::Now() + absl::Seconds(5)) == gone);
}

}  // namespace
}  // namespace muster
