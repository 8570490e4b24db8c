// Rank-per-thread tests of P2PEngine: ping-pong, messages far larger than a
// mailbox in both directions at once (no deadlock), matching by (peer, tag)
// in any tag order, receives from any source, size mismatches, self-sends
// and timeouts.
#include "backends/shm/p2p.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

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

TEST_CASE("receives posted in another tag order than the sends match by tag; same tags in order") {
  // Rank 0 sends tags 1, 2, 1, 3 (the second tag-1 message far larger than
  // the mailbox); rank 1 receives 3, 1, 2, 1 one at a time, then both run
  // another exchange: the group still works.
  Group g(2, 4096);
  const size_t big = 100000;
  std::vector<uint8_t> b0(big), b1(big, 0);
  for (size_t i = 0; i < big; ++i) b0[i] = static_cast<uint8_t>(i * 13);
  int64_t a = 11, b = 22, c = 33, ra = 0, rb = 0, rc = 0;
  std::atomic<int> failed_sends{0};  // checked after the join: Catch is not thread-safe
  std::thread sender([&] {
    P2POp s1 = Op(true, 1, 1, &a, 8), s2 = Op(true, 1, 2, &b, 8);
    P2POp s3 = Op(true, 1, 1, b0.data(), big), s4 = Op(true, 1, 3, &c, 8);
    g.engines[0]->Run({&s1, &s2, &s3, &s4});
    for (P2POp* op : {&s1, &s2, &s3, &s4}) failed_sends += !op->status.ok();
    int64_t x = 44;
    P2POp again = Op(true, 1, 1, &x, 8);
    g.engines[0]->Run({&again});
    failed_sends += !again.status.ok();
  });
  P2POp r3 = Op(false, 0, 3, &rc, 8);
  g.engines[1]->Run({&r3});
  P2POp r1 = Op(false, 0, 1, &ra, 8);
  g.engines[1]->Run({&r1});
  P2POp r2 = Op(false, 0, 2, &rb, 8);
  g.engines[1]->Run({&r2});
  P2POp r1b = Op(false, 0, 1, b1.data(), big);
  g.engines[1]->Run({&r1b});
  for (P2POp* op : {&r3, &r1, &r2, &r1b}) {
    INFO(op->status.ToString());
    CHECK(op->status.ok());
    CHECK(op->source == 0);
  }
  CHECK(ra == 11);
  CHECK(rb == 22);
  CHECK(rc == 33);
  CHECK(b1 == b0);
  int64_t y = 0;
  P2POp again = Op(false, 0, 1, &y, 8);
  g.engines[1]->Run({&again});
  sender.join();
  CHECK(failed_sends == 0);
  CHECK(again.status.ok());
  CHECK(y == 44);
  CHECK_FALSE(g.maps[1]->aborted());
  CHECK(g.engines[1]->stashed_bytes() == 0);
}

TEST_CASE("a receive from any source takes the first message with its tag and names the sender") {
  Group g(3);
  int64_t from1 = 100, from2 = 200, other = 7;
  std::thread s2([&] {
    P2POp s = Op(true, 0, 5, &from2, 8);
    g.engines[2]->Run({&s});
  });
  s2.join();  // rank 2's message is in the ring first
  std::thread s1([&] {
    P2POp t = Op(true, 0, 6, &other, 8), s = Op(true, 0, 5, &from1, 8);
    g.engines[1]->Run({&t, &s});
  });
  s1.join();
  int64_t x = 0, y = 0, z = 0;
  P2POp any1 = Op(false, P2POp::kAnySource, 5, &x, 8);
  P2POp any2 = Op(false, P2POp::kAnySource, 5, &y, 8);
  P2POp tagged = Op(false, 1, 6, &z, 8);
  CHECK(g.engines[0]->Validate(any1).ok());
  g.engines[0]->Run({&any1, &any2, &tagged});
  CHECK(any1.status.ok());
  CHECK(any2.status.ok());
  CHECK(tagged.status.ok());
  CHECK(z == 7);
  CHECK(tagged.source == 1);
  // Both tag-5 messages arrived; each receive names its sender.
  CHECK(((any1.source == 1 && x == 100 && any2.source == 2 && y == 200) ||
         (any1.source == 2 && x == 200 && any2.source == 1 && y == 100)));
  CHECK(g.engines[0]->stashed_bytes() == 0);
  // Sends to any source are not a thing.
  P2POp bad = Op(true, P2POp::kAnySource, 5, &x, 8);
  CHECK(g.engines[0]->Validate(bad).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a receive of the wrong size fails naming both sizes; the message is dropped") {
  Group h(2);
  int x = 1, z = 5, w = 0;
  int64_t big = 0;
  std::thread s2([&] {
    P2POp s = Op(true, 1, 1, &x, sizeof(x)), t = Op(true, 1, 1, &z, sizeof(z));
    h.engines[0]->Run({&s, &t});
  });
  P2POp wrong = Op(false, 0, 1, &big, sizeof(big));
  h.engines[1]->Run({&wrong});
  CHECK(wrong.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(wrong.status.message()) ==
        "recv from rank 0 on group 'g' with tag 1: buffer has 8 bytes, message has 4");
  P2POp next = Op(false, 0, 1, &w, sizeof(w));
  h.engines[1]->Run({&next});
  s2.join();
  CHECK(next.status.ok());
  CHECK(w == 5);
  CHECK_FALSE(h.maps[1]->aborted());
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

TEST_CASE("a mailbox counter a peer scribbled on never makes a copy leave the ring") {
  // Before: the sender trusted `read`; with read past written, w - r
  // wrapped and a 64 MiB send was copied over the 4 KiB ring and past the
  // segment's end.
  Group g(2);
  g.maps[1]->mailbox(0, 1).read.store(uint64_t{1} << 40);
  std::vector<char> big(64 << 20, 'x');
  P2POp send = Op(true, 1, 5, big.data(), big.size(), absl::Milliseconds(300));
  g.engines[0]->Run({&send});
  CHECK(send.status.code() == absl::StatusCode::kDeadlineExceeded);
  // And a receiver whose peer claims to have written 2^40 bytes reads at
  // most a ring's worth at a time.
  Group h(2);
  h.maps[1]->mailbox(1, 0).written.store(uint64_t{1} << 40);
  P2POp recv = Op(false, 1, 5, big.data(), big.size(), absl::Milliseconds(300));
  h.engines[0]->Run({&recv});
  CHECK_FALSE(recv.status.ok());
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
