// GpuChannel: a rank thread and a daemon thread exchanging requests through
// the shared-memory channel; closing, oversized requests, bad segments.
#include "common/gpu_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/mapping_guard.h"

namespace muster {
namespace {

std::string Name(const char* what) {
  static int n = 0;
  return absl::StrCat("/muster.", ::getpid(), ".gputest.", what, ++n);
}

TEST_CASE("requests and replies go through the channel in order, with statuses") {
  auto daemon = GpuChannel::Create(Name("rr"));
  REQUIRE(daemon.ok());
  auto rank = GpuChannel::Open((*daemon)->name());
  REQUIRE(rank.ok());
  std::vector<std::string> served;
  std::thread server([&] {
    std::string request;
    for (int i = 0; i < 1000;) {
      const uint32_t bell = (*daemon)->doorbell();
      if (!(*daemon)->Poll(&request, absl::Microseconds(100))) {
        (*daemon)->WaitForRequest(bell, absl::Milliseconds(20));
        continue;
      }
      served.push_back(request);
      if (request == "fail") {
        (*daemon)->Complete(absl::AbortedError("rank 2 died"), 0);
      } else {
        (*daemon)->Complete(absl::OkStatus(), 1000 + i);
      }
      ++i;
    }
  });
  std::vector<absl::StatusOr<uint64_t>> replies;
  for (int i = 0; i < 1000; ++i) {
    // Some requests find the daemon asleep on the futex.
    if (i % 100 == 0) absl::SleepFor(absl::Milliseconds(30));
    replies.push_back(
        (*rank)->Call(i == 500 ? "fail" : absl::StrCat("req", i), absl::Now() + absl::Seconds(10)));
  }
  server.join();
  REQUIRE(served.size() == 1000);
  for (int i = 0; i < 1000; ++i) {
    INFO(i);
    if (i == 500) {
      CHECK(served[i] == "fail");
      CHECK(absl::IsAborted(replies[i].status()));
      CHECK(replies[i].status().message() == "rank 2 died");
    } else {
      CHECK(served[i] == absl::StrCat("req", i));
      REQUIRE(replies[i].ok());
      CHECK(*replies[i] == static_cast<uint64_t>(1000 + i));
    }
  }
}

TEST_CASE("a Wake between looking for work and sleeping is not lost") {
  auto daemon = GpuChannel::Create(Name("wake"));
  REQUIRE(daemon.ok());
  const uint32_t bell = (*daemon)->doorbell();
  (*daemon)->Wake();  // e.g. a task posted after the worker found none
  absl::Time start = absl::Now();
  (*daemon)->WaitForRequest(bell, absl::Seconds(5));
  CHECK(absl::Now() - start < absl::Seconds(1));
  // With nothing rung since, it does sleep (until the timeout here).
  start = absl::Now();
  (*daemon)->WaitForRequest((*daemon)->doorbell(), absl::Milliseconds(100));
  CHECK(absl::Now() - start >= absl::Milliseconds(90));
}

TEST_CASE("a closed channel answers Unavailable, also to a caller already waiting") {
  auto daemon = GpuChannel::Create(Name("close"));
  REQUIRE(daemon.ok());
  auto rank = GpuChannel::Open((*daemon)->name());
  REQUIRE(rank.ok());
  absl::Status waiting;
  std::thread caller(
      [&] { waiting = (*rank)->Call("never answered", absl::Now() + absl::Seconds(30)).status(); });
  absl::SleepFor(absl::Milliseconds(100));
  (*daemon)->Close();
  caller.join();
  CHECK(absl::IsUnavailable(waiting));
  CHECK((*rank)->closed());
  CHECK(absl::IsUnavailable((*rank)->Call("later", absl::Now() + absl::Seconds(1)).status()));
}

TEST_CASE("bad input: oversized requests, missing or foreign segments, no answer in time") {
  auto daemon = GpuChannel::Create(Name("bad"));
  REQUIRE(daemon.ok());
  auto rank = GpuChannel::Open((*daemon)->name());
  REQUIRE(rank.ok());
  std::string huge(GpuChannel::kMaxRequestBytes + 1, 'x');
  CHECK(absl::IsResourceExhausted((*rank)->Call(huge, absl::Now() + absl::Seconds(1)).status()));
  auto late = (*rank)->Call("nobody serves", absl::Now() + absl::Milliseconds(50));
  CHECK(absl::IsDeadlineExceeded(late.status()));
  CHECK(absl::IsUnavailable(GpuChannel::Open("/muster.no.such.channel").status()));
  // Creating over an existing name is refused (no hijacking).
  CHECK_FALSE(GpuChannel::Create((*daemon)->name()).ok());
}

TEST_CASE("in musterd (mapping_guard), a channel whose user truncated its file reads as empty") {
  REQUIRE(mapping_guard::Install());
  auto daemon = GpuChannel::Create(Name("trunc"));
  REQUIRE(daemon.ok());
  const int fd = ::shm_open((*daemon)->name().c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 0) == 0);
  ::close(fd);
  std::string request;
  CHECK_FALSE((*daemon)->Poll(&request, absl::Microseconds(10)));  // zeros: nothing submitted
  CHECK_FALSE((*daemon)->closed());
  (*daemon)->Complete(absl::OkStatus(), 0);  // writes: into this process's page only
  (*daemon)->Close();
  CHECK((*daemon)->closed());
}

TEST_CASE("a channel for another user's rank belongs to that user, mode 0600") {
  if (::geteuid() != 0) {
    WARN("SKIPPED: giving a channel to another user needs root");
    return;
  }
  auto daemon = GpuChannel::Create(Name("owner"), 65534);
  REQUIRE(daemon.ok());
  struct stat st;
  REQUIRE(::stat(("/dev/shm" + (*daemon)->name()).c_str(), &st) == 0);
  CHECK(st.st_uid == 65534);
  CHECK((st.st_mode & 0777) == 0600);
}

}  // namespace
}  // namespace muster
