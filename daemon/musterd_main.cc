// musterd: the per-node muster daemon. `musterd --help` lists every flag.
#include <malloc.h>

#include "daemon/musterd_cli.h"

int main(int argc, char** argv) {
  // After a flood (a million waited keys: hundreds of MB of small strings
  // and B-tree nodes), glibc would hand the freed memory back to the kernel
  // in large pieces (a trimmed heap top, a whole 64 MiB thread heap) inside
  // some free() on the store's loop thread, stalling every store client for
  // more than 10 ms. So buffers of 1 MiB or more get their own mappings
  // (each returned when freed; the store frees long lists in slices), small
  // allocations share the main heap (no per-thread heaps to delete; musterd
  // does not allocate on a hot path from many threads), and that heap is
  // not trimmed: memory freed after a flood (bounded by the store's memory
  // budget) is kept for reuse. No fast bins either: a large allocation
  // would first coalesce every small chunk freed into them (millions after
  // a flood) in one go.
  mallopt(M_MXFAST, 0);
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return muster::RunMusterd(argc, argv, nullptr);
}
