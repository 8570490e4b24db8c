// Rank-per-thread tests of GlooP2P over loopback meshes: large exchanges in
// both directions, per-tag ordering, tags matched out of order, empty
// messages, validation, cancellation. Results are checked on the test's
// thread.
#include "backends/gloo/gloo_p2p.h"

#include <catch2/catch.hpp>
#include <future>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/gloo/gloo_communicator.h"
#include "muster/hash_store.h"

namespace muster {
namespace {

// Runs body(rank, p2p) on `world` threads over one mesh; returns each
// rank's list of failures.
template <typename F>
std::vector<std::vector<std::string>> RunRanks(int world, F body) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::vector<std::string>> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Connect(store, r, world, "127.0.0.1", absl::Seconds(20));
      if (!comm.ok()) {
        failures[r].push_back(comm.status().ToString());
        return;
      }
      std::vector<int> global(world);
      for (int i = 0; i < world; ++i) global[i] = 10 + i;
      GlooP2P p2p((*comm)->context(), "g", global);
      body(r, p2p, failures[r]);
      // Everyone is done before the meshes go away.
      if (!(*comm)->Barrier(absl::Now() + absl::Seconds(20)).ok()) failures[r].push_back("barrier");
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

// Posts and blocks until done.
absl::Status Blocking(GlooP2P& p2p, bool send, int peer, uint64_t tag, void* data, size_t bytes) {
  std::promise<absl::Status> result;
  p2p.Post(send, peer, tag, data, bytes, absl::Now() + absl::Seconds(20),
           [&](absl::Status s) { result.set_value(std::move(s)); });
  return result.get_future().get();
}

struct Async {
  std::promise<absl::Status> promise;
  std::future<absl::Status> future = promise.get_future();
  void Post(GlooP2P& p2p, bool send, int peer, uint64_t tag, void* data, size_t bytes) {
    p2p.Post(send, peer, tag, data, bytes, absl::Now() + absl::Seconds(20),
             [this](absl::Status s) { promise.set_value(std::move(s)); });
  }
  absl::Status Get() { return future.get(); }
};

TEST_CASE("two ranks exchanging 16 MiB each way, both sending first, do not deadlock") {
  constexpr size_t kBytes = 16 << 20;
  auto failures = RunRanks(2, [&](int r, GlooP2P& p2p, std::vector<std::string>& fail) {
    std::vector<uint8_t> out(kBytes), in(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) out[i] = static_cast<uint8_t>(i * 7 + r);
    Async send, recv;
    send.Post(p2p, true, 1 - r, 3, out.data(), kBytes);
    recv.Post(p2p, false, 1 - r, 3, in.data(), kBytes);
    if (!send.Get().ok()) fail.push_back("send");
    if (!recv.Get().ok()) fail.push_back("recv");
    for (size_t i = 0; i < kBytes; ++i) {
      if (in[i] != static_cast<uint8_t>(i * 7 + (1 - r))) {
        fail.push_back("data");
        break;
      }
    }
  });
  CHECK(failures[0] == std::vector<std::string>{});
  CHECK(failures[1] == std::vector<std::string>{});
}

TEST_CASE("a receive from any source takes the first sender's message and names it") {
  // Rank 0 receives two tag-5 messages from any source, then a tag-5
  // message from rank 2 posted behind them, while ranks 1 and 2 send: rank
  // 1 one message, rank 2 two (in order; its second once rank 1's was
  // received, so that the receives from any source get one each).
  std::promise<void> rank1_sent;
  std::shared_future<void> rank1_done = rank1_sent.get_future().share();
  auto failures = RunRanks(3, [&](int r, GlooP2P& p2p, std::vector<std::string>& fail) {
    if (r == 0) {
      int64_t got[3] = {-1, -1, -1};
      int sources[2] = {-2, -2};
      std::promise<absl::Status> done[2];
      for (int i = 0; i < 2; ++i) {
        p2p.PostRecvAnySource(5, &got[i], 8, absl::Now() + absl::Seconds(20),
                              [&, i](absl::Status s, int source) {
                                sources[i] = source;
                                done[i].set_value(std::move(s));
                              });
      }
      Async last;
      last.Post(p2p, false, 2, 5, &got[2], 8);
      for (auto& d : done) {
        if (!d.get_future().get().ok()) fail.push_back("any");
      }
      if (!last.Get().ok()) fail.push_back("last");
      // Rank 2's messages arrive in order: its second is the last receive's.
      if (got[2] != 202) fail.push_back(absl::StrCat("last got ", got[2]));
      std::set<int64_t> firsts = {got[0], got[1]};
      if (firsts != std::set<int64_t>{101, 201}) fail.push_back("any values");
      for (int i = 0; i < 2; ++i) {
        if (got[i] != 100 * sources[i] + 1) {
          fail.push_back(absl::StrCat("receive ", i, " got ", got[i], " from ", sources[i]));
        }
      }
    } else {
      int64_t first = 100 * r + 1, second = 100 * r + 2;
      if (!Blocking(p2p, true, 0, 5, &first, 8).ok()) fail.push_back("send 1");
      if (r == 1) rank1_sent.set_value();
      if (r == 2) {
        rank1_done.wait();
        if (!Blocking(p2p, true, 0, 5, &second, 8).ok()) fail.push_back("send 2");
      }
    }
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(failures[r] == std::vector<std::string>{});
  }
}

TEST_CASE("messages with one tag arrive in order; tags are matched independently") {
  auto failures = RunRanks(3, [&](int r, GlooP2P& p2p, std::vector<std::string>& fail) {
    if (r == 0) {
      // Posted together (a send completes once its receive matched it).
      int64_t values[4] = {1, 2, 3, 100};
      Async sends[5];
      for (int i = 0; i < 3; ++i) sends[i].Post(p2p, true, 2, 5, &values[i], sizeof(int64_t));
      sends[3].Post(p2p, true, 2, 6, &values[3], sizeof(int64_t));
      sends[4].Post(p2p, true, 2, 7, nullptr, 0);
      for (auto& a : sends) {
        if (absl::Status s = a.Get(); !s.ok()) fail.push_back(s.ToString());
      }
    } else if (r == 2) {
      // Tag 6 first although it was sent last: matched by tag.
      int64_t a = 0;
      if (!Blocking(p2p, false, 0, 6, &a, sizeof(a)).ok() || a != 100) fail.push_back("tag 6");
      for (int64_t want : {1, 2, 3}) {
        int64_t v = 0;
        if (!Blocking(p2p, false, 0, 5, &v, sizeof(v)).ok() || v != want) {
          fail.push_back("order");
        }
      }
      if (!Blocking(p2p, false, 0, 7, nullptr, 0).ok()) fail.push_back("recv empty");
    }
  });
  for (auto& f : failures) CHECK(f == std::vector<std::string>{});
}

TEST_CASE("a completed operation is reported while an earlier one is still pending") {
  auto failures = RunRanks(2, [&](int r, GlooP2P& p2p, std::vector<std::string>& fail) {
    int32_t late = 0, x = 42;
    if (r == 0) {
      Async pending;  // completes only after rank 1 saw our send complete
      pending.Post(p2p, false, 1, 1, &late, sizeof(late));
      if (!Blocking(p2p, true, 1, 2, &x, sizeof(x)).ok()) fail.push_back("send");
      int32_t go = 1;
      if (!Blocking(p2p, true, 1, 3, &go, sizeof(go)).ok()) fail.push_back("go");
      if (!pending.Get().ok() || late != 7) fail.push_back("late recv");
    } else {
      int32_t got = 0, go = 0, seven = 7;
      if (!Blocking(p2p, false, 0, 2, &got, sizeof(got)).ok() || got != 42) fail.push_back("recv");
      if (!Blocking(p2p, false, 0, 3, &go, sizeof(go)).ok()) fail.push_back("go");
      if (!Blocking(p2p, true, 0, 1, &seven, sizeof(seven)).ok()) fail.push_back("send late");
    }
  });
  CHECK(failures[0] == std::vector<std::string>{});
  CHECK(failures[1] == std::vector<std::string>{});
}

TEST_CASE("a receive of another size than its message fails on both sides, naming both sizes") {
  auto failures = RunRanks(2, [&](int r, GlooP2P& p2p, std::vector<std::string>& fail) {
    int64_t big[2] = {5, 6}, small = 0, ok = 0, more[2] = {0, 0};
    auto expect = [&](absl::Status s, const std::string& what) {
      if (s.code() != absl::StatusCode::kInvalidArgument ||
          s.message().find(what) == absl::string_view::npos) {
        fail.push_back(s.ToString());
      }
    };
    if (r == 0) {
      // 16 bytes into an 8-byte receive (Gloo itself would abort the
      // receiving process), then 8 into 16, then a good one on the same tag.
      Async a, b;
      a.Post(p2p, true, 1, 4, big, sizeof(big));
      b.Post(p2p, false, 1, 4, more, sizeof(more));
      expect(a.Get(), "send to rank 11 (tag 4, 16 bytes) on group 'g': the matching receive is 8");
      expect(b.Get(), "recv from rank 11 (tag 4, 16 bytes) on group 'g': the matching send is 8");
      int64_t seven = 7;
      if (!Blocking(p2p, true, 1, 4, &seven, sizeof(seven)).ok()) fail.push_back("send after");
    } else {
      expect(Blocking(p2p, false, 0, 4, &small, sizeof(small)),
             "recv from rank 10 (tag 4, 8 bytes) on group 'g': the matching send is 16 bytes");
      int64_t eight = 8;
      expect(Blocking(p2p, true, 0, 4, &eight, sizeof(eight)), "the matching receive is 16 bytes");
      if (small != 0) fail.push_back("data moved");
      if (!Blocking(p2p, false, 0, 4, &ok, sizeof(ok)).ok() || ok != 7)
        fail.push_back("recv after");
    }
    if (more[0] != 0 || more[1] != 0) fail.push_back("data moved");
  });
  CHECK(failures[0] == std::vector<std::string>{});
  CHECK(failures[1] == std::vector<std::string>{});
}

TEST_CASE("bad peers and tags are refused; destroying cancels pending operations") {
  auto store = std::make_shared<HashStore>();
  auto comm = GlooCommunicator::Connect(store, 0, 1, "127.0.0.1", absl::Seconds(20));
  REQUIRE(comm.ok());
  GlooP2P p2p((*comm)->context(), "solo", {4});
  CHECK(p2p.Validate(0, 1).message() == "point-to-point with oneself");
  CHECK(p2p.Validate(1, 1).message() == "peer 1 is outside group 'solo'");
  CHECK(p2p.Validate(-1, 1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(p2p.Validate(0, GlooP2P::kMaxTag + 1).code() == absl::StatusCode::kInvalidArgument);
  int x = 0;
  CHECK(Blocking(p2p, true, 3, 0, &x, sizeof(x)).code() == absl::StatusCode::kInvalidArgument);

  // Two ranks: rank 1 posts a receive nobody sends and is destroyed.
  auto store2 = std::make_shared<HashStore>();
  absl::Status cancelled;
  std::thread peer([&] {
    auto c = GlooCommunicator::Connect(store2, 0, 2, "127.0.0.1", absl::Seconds(20));
    if (c.ok()) (void)(*c)->Barrier(absl::Now() + absl::Seconds(20));
    if (c.ok()) (void)(*c)->Barrier(absl::Now() + absl::Seconds(20));
  });
  {
    auto c = GlooCommunicator::Connect(store2, 1, 2, "127.0.0.1", absl::Seconds(20));
    REQUIRE(c.ok());
    (void)(*c)->Barrier(absl::Now() + absl::Seconds(20));
    int y = 0;
    std::promise<absl::Status> result;
    {
      GlooP2P two((*c)->context(), "pair", {0, 1});
      two.Post(false, 0, 9, &y, sizeof(y), absl::Now() + absl::Seconds(60),
               [&](absl::Status s) { result.set_value(s); });
      absl::SleepFor(absl::Milliseconds(50));
    }
    cancelled = result.get_future().get();
    (void)(*c)->Barrier(absl::Now() + absl::Seconds(20));
  }
  peer.join();
  INFO(cancelled.ToString());
  CHECK(cancelled.code() == absl::StatusCode::kCancelled);
}

TEST_CASE("Abort cancels a pending receive at once and every later operation") {
  auto failures = RunRanks(2, [&](int r, GlooP2P& p2p, std::vector<std::string>& fail) {
    if (r != 0) return;  // rank 1 never sends
    int64_t x = 0;
    Async recv;
    absl::Time start = absl::Now();
    recv.Post(p2p, false, 1, 4, &x, sizeof(x));
    absl::SleepFor(absl::Milliseconds(100));
    p2p.Abort();
    absl::Status s = recv.Get();
    if (s.code() != absl::StatusCode::kCancelled) fail.push_back("pending: " + s.ToString());
    if (absl::Now() - start > absl::Seconds(2)) fail.push_back("pending: not at once");
    absl::Status later = Blocking(p2p, true, 1, 5, &x, sizeof(x));
    if (later.code() != absl::StatusCode::kCancelled) fail.push_back("later: " + later.ToString());
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(failures[r].empty());
  }
}

}  // namespace
}  // namespace muster
