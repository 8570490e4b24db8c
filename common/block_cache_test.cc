// BlockCache: a freed block is the next one its thread allocates, a block
// may be freed on another thread, and a thread's cached blocks go back to
// the heap when it ends.
#include "common/block_cache.h"

#include <malloc.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace muster {
namespace {

using Cache = BlockCache<96, 16>;

TEST_CASE("a block freed on a thread is that thread's next allocation") {
  void* a = Cache::Allocate();
  std::memset(a, 0xab, 96);  // the whole block is usable
  Cache::Free(a);
  void* b = Cache::Allocate();
  CHECK(b == a);
  CHECK(reinterpret_cast<uintptr_t>(b) % 16 == 0);
  Cache::Free(b);
}

TEST_CASE("a block allocated on one thread may be freed and reused on another") {
  void* a = Cache::Allocate();
  void* reused = nullptr;
  std::thread([&] {
    Cache::Free(a);
    reused = Cache::Allocate();
    Cache::Free(reused);
  }).join();
  CHECK(reused == a);
}

TEST_CASE("many blocks freed at once are all usable again") {
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(Cache::Allocate());
  for (void* b : blocks) Cache::Free(b);
  // The cache's last 16 come back first; the rest come from the heap.
  std::set<void*> again;
  for (int i = 0; i < 40; ++i) again.insert(Cache::Allocate());
  int reused = 0;
  for (void* b : blocks) reused += static_cast<int>(again.count(b));
  CHECK(again.size() == 40);
  CHECK(reused >= 16);
  for (void* b : again) Cache::Free(b);
}

TEST_CASE("a thread's cached blocks are returned to the heap when it ends") {
  // 200 threads each leaving 16 blocks of 64 KiB cached: 200 MiB in use
  // afterwards if the blocks stayed with the ended threads.
  using Large = BlockCache<64 << 10>;
  const size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
  for (int t = 0; t < 200; ++t) {
    std::thread([] {
      std::vector<void*> blocks;
      for (int i = 0; i < 16; ++i) blocks.push_back(Large::Allocate());
      for (void* b : blocks) Large::Free(b);
    }).join();
  }
  const size_t after = mallinfo2().uordblks + mallinfo2().hblkhd;
  INFO("heap in use before " << before << " B, after " << after << " B");
  CHECK(after < before + (16 << 20));
}

}  // namespace
}  // namespace muster
