// mapping_guard: a truncated file's page reads as zeros in a guarded
// mapping; a full table refuses (TryGuard) rather than leaving one bare.
#include "common/mapping_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

namespace muster {
namespace {

TEST_CASE("a guarded mapping of a truncated file reads zeros; a full table refuses") {
  int handle = 0;
  REQUIRE(mapping_guard::TryGuard(nullptr, 0, &handle));  // before Install: nothing to guard
  CHECK(handle == -1);
  REQUIRE(mapping_guard::Install());
  REQUIRE(mapping_guard::Installed());

  const int fd = ::memfd_create("mapping-guard-test", 0);
  REQUIRE(fd >= 0);
  const long page = ::sysconf(_SC_PAGESIZE);
  REQUIRE(::ftruncate(fd, 2 * page) == 0);
  void* base = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(base != MAP_FAILED);
  REQUIRE(mapping_guard::TryGuard(base, 2 * page, &handle));
  REQUIRE(handle >= 0);
  auto* bytes = static_cast<volatile char*>(base);
  bytes[page] = 7;
  REQUIRE(::ftruncate(fd, page) == 0);  // the second page is past the end now
  CHECK(bytes[page] == 0);              // no SIGBUS: a page of zeros
  bytes[page] = 9;                      // and it takes writes
  CHECK(bytes[page] == 9);
  CHECK(mapping_guard::Replaced(handle));

  // Fill the table with ranges nobody touches: the next mapping is refused.
  std::vector<int> taken;
  int h = 0;
  while ((h = mapping_guard::Guard(reinterpret_cast<void*>(0x1000), 1)) >= 0) taken.push_back(h);
  int refused = 0;
  CHECK_FALSE(mapping_guard::TryGuard(base, 2 * page, &refused));
  CHECK(refused == -1);
  for (int t : taken) mapping_guard::Unguard(t);
  REQUIRE(mapping_guard::TryGuard(base, 2 * page, &refused));
  CHECK(refused >= 0);
  mapping_guard::Unguard(refused);
  mapping_guard::Unguard(handle);
  ::munmap(base, 2 * page);
  ::close(fd);
}

}  // namespace
}  // namespace muster
