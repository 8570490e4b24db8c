// Rank-per-thread tests of P2PEngine: ping-pong, messages far larger than a
// mailbox in both directions at once (no deadlock), ordering, tag and size
// mismatches, self-sends and timeouts.
#include "backends/shm/p2p.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

struct Group {
  std::string name;
  std::unique_ptr<GroupSegment> owner;
  std::vector<std::unique_ptr<GroupSegment>> maps;
  std::vector<std::unique_ptr<P2PEngine>> engines;
  explicit Group(int n, uint64_t mailbox_bytes = 4096) {
    static std::atomic<int> counter{0};
    name = absl::StrCat("/muster-p2p-test.", ::getpid(), ".", counter++);
    owner = std::move(*GroupSegment::Create(name, n, 4096, mailbox_bytes));
    for (int r = 0; r < n; ++r) {
      maps.push_back(std::move(*GroupSegment::Open(name, n)));
      engines.push_back(std::make_unique<P2PEngine>(maps.back().get(), r, "g", std::vector<int>{}));
    }
  }
  ~Group() { GroupSegment::Unlink(name); }
};

P2POp Op(bool send, int peer, uint64_t tag, void* data, uint64_t bytes,
         absl::Duration timeout = absl::Seconds(20)) {
  P2POp op;
  op.send = send;
  op.peer = peer;
  op.tag = tag;
  op.data = static_cast<char*>(data);
  op.bytes = bytes;
  op.deadline = absl::Now() + timeout;
  return op;
}

TEST_CASE("simultaneous large exchanges through small mailboxes complete in order") {
  Group g(2, 4096);
  const size_t n = 1 << 20;  // 256x the mailbox
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<uint8_t> out1(n), out2(100), in1(n), in2(100);
      for (size_t i = 0; i < n; ++i) out1[i] = static_cast<uint8_t>(i * 7 + r);
      for (size_t i = 0; i < 100; ++i) out2[i] = static_cast<uint8_t>(200 + r);
      P2POp s1 = Op(true, 1 - r, 5, out1.data(), n), s2 = Op(true, 1 - r, 6, out2.data(), 100);
      P2POp r1 = Op(false, 1 - r, 5, in1.data(), n), r2 = Op(false, 1 - r, 6, in2.data(), 100);
      g.engines[r]->Run({&s1, &s2, &r1, &r2});
      for (P2POp* op : {&s1, &s2, &r1, &r2}) bad += !op->status.ok();
      for (size_t i = 0; i < n; ++i) bad += in1[i] != static_cast<uint8_t>(i * 7 + 1 - r);
      for (size_t i = 0; i < 100; ++i) bad += in2[i] != static_cast<uint8_t>(200 + 1 - r);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(bad == 0);
}

TEST_CASE("a receive naming the wrong tag or size fails and aborts the group") {
  Group g(2);
  int x = 1, y = 0;
  std::thread sender([&] {
    P2POp s = Op(true, 1, 7, &x, sizeof(x));
    g.engines[0]->Run({&s});
  });
  P2POp r = Op(false, 0, 8, &y, sizeof(y));
  g.engines[1]->Run({&r});
  sender.join();
  CHECK(r.status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(r.status.message()) ==
        "recv from rank 0 on group 'g' expected tag 8 but the next message has tag 7 (messages "
        "between two ranks arrive in order)");
  P2POp after = Op(false, 0, 7, &y, sizeof(y));
  g.engines[1]->Run({&after});
  CHECK(after.status.code() == absl::StatusCode::kAborted);

  Group h(2);
  int64_t big = 0;
  std::thread s2([&] {
    P2POp s = Op(true, 1, 1, &x, sizeof(x));
    h.engines[0]->Run({&s});
  });
  P2POp wrong = Op(false, 0, 1, &big, sizeof(big));
  h.engines[1]->Run({&wrong});
  s2.join();
  CHECK(wrong.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(wrong.status.message()).find("buffer has 8 bytes, message has 4") !=
        std::string::npos);
}

TEST_CASE("self-sends and bad peers are refused; an unanswered receive times out") {
  Group g(2);
  int x = 0;
  CHECK(g.engines[0]->Validate(Op(true, 0, 1, &x, 4)).code() == absl::StatusCode::kInvalidArgument);
  CHECK(g.engines[0]->Validate(Op(false, 2, 1, &x, 4)).code() ==
        absl::StatusCode::kInvalidArgument);
  P2POp r = Op(false, 1, 1, &x, 4, absl::Milliseconds(200));
  absl::Time start = absl::Now();
  g.engines[0]->Run({&r});
  CHECK(r.status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(3));
}

TEST_CASE("a local abort of the segment fails this process's pending receive at once") {
  Group g(2);
  int64_t x = 0;
  P2POp recv = Op(false, 1, 3, &x, sizeof(x));
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    g.maps[0]->AbortLocally(absl::UnavailableError("musterd is gone"));
  });
  absl::Time start = absl::Now();
  g.engines[0]->Run({&recv});
  aborter.join();
  CHECK(absl::Now() - start < absl::Seconds(1));
  CHECK(recv.status.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(recv.status.message()) == "recv from rank 1 on group 'g': musterd is gone");
  CHECK_FALSE(g.maps[1]->aborted());  // the peer was not told
}

}  // namespace
}  // namespace muster
