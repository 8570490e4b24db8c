// IpcCache: one open per (rank, handle), closes on release and rank exit.
#include "daemon/gpu/ipc_cache.h"

#include <catch2/catch.hpp>
#include <set>

namespace muster {
namespace {

class CountingOpener : public IpcOpener {
 public:
  absl::StatusOr<IpcResource> Open(const std::string& handle) override {
    if (handle[0] == 'x') return absl::InternalError("cudaErrorMapBufferObjectFailed");
    ++opens;
    void* p = new char(handle[0]);
    live.insert(p);
    return IpcResource{p, 1};
  }
  void Close(void* opened) override {
    ++closes;
    live.erase(opened);
    delete static_cast<char*>(opened);
  }
  int opens = 0, closes = 0;
  std::set<void*> live;
};

std::string Handle(char c) { return std::string(64, c); }

TEST_CASE("a handle is opened once per owner and reused") {
  CountingOpener opener;
  IpcCache cache(&opener, "memory", 64);
  auto a1 = cache.Get("job/0", Handle('a'));
  auto a2 = cache.Get("job/0", Handle('a'));
  REQUIRE(a1.ok());
  REQUIRE(a2.ok());
  CHECK(a1->ptr == a2->ptr);
  CHECK(a1->bytes == 1);
  CHECK(opener.opens == 1);
  // Another rank's identical bytes are its own allocation.
  auto other = cache.Get("job/1", Handle('a'));
  REQUIRE(other.ok());
  CHECK(other->ptr != a1->ptr);
  CHECK(opener.opens == 2);
  CHECK(cache.open_count("job/0") == 1);
  CHECK(cache.total_open() == 2);
  CHECK(cache.opens() == 2);
}

TEST_CASE("release closes one handle; a rank's exit closes all of its handles") {
  CountingOpener opener;
  IpcCache cache(&opener, "memory", 64);
  REQUIRE(cache.Get("j/0", Handle('a')).ok());
  REQUIRE(cache.Get("j/0", Handle('b')).ok());
  REQUIRE(cache.Get("j/0", Handle('c')).ok());
  REQUIRE(cache.Get("j/1", Handle('a')).ok());
  CHECK(cache.Release("j/0", Handle('b')));
  CHECK_FALSE(cache.Release("j/0", Handle('b')));
  CHECK(opener.closes == 1);
  CHECK(cache.ReleaseOwner("j/0") == 2);
  CHECK(opener.closes == 3);
  CHECK(cache.open_count("j/0") == 0);
  CHECK(cache.open_count("j/1") == 1);
  // Re-opening after a release opens again.
  REQUIRE(cache.Get("j/0", Handle('a')).ok());
  CHECK(opener.opens == 5);
}

TEST_CASE("bad handles are InvalidArgument; the cache closes what is left at the end") {
  CountingOpener opener;
  {
    IpcCache cache(&opener, "event", 64);
    auto short_handle = cache.Get("j/0", "abc");
    CHECK(absl::IsInvalidArgument(short_handle.status()));
    CHECK(short_handle.status().message().find("event handle has 3 bytes") != std::string::npos);
    auto failing = cache.Get("j/0", Handle('x'));
    CHECK(absl::IsInvalidArgument(failing.status()));
    CHECK(failing.status().message().find("cudaErrorMapBufferObjectFailed") != std::string::npos);
    REQUIRE(cache.Get("j/0", Handle('a')).ok());
  }
  CHECK(opener.live.empty());
}

}  // namespace
}  // namespace muster
