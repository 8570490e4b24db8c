// musterd: the per-node muster daemon. `musterd --help` lists every flag.
#include <malloc.h>

#include "daemon/musterd_cli.h"

int main(int argc, char** argv) {
  // After a flood (a million waited keys: hundreds of MB of small strings
  // and B-tree nodes), glibc would hand the freed heap back to the kernel in
  // one go inside some free() on the store's loop thread, stalling every
  // store client for more than 10 ms. So buffers of 1 MiB or more get their
  // own mappings (each returned when freed; the store frees long lists in
  // slices), and the heap is trimmed only when 256 MiB are free at its top.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return muster::RunMusterd(argc, argv, nullptr);
}
