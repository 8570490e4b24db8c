// mapping_guard: lets a process survive the truncation of a shared file it
// maps. musterd maps files that other users can resize (the groups' shared
// memory, the GPU request channels, given to the jobs' users): reading or
// writing a page past the end of such a file raises SIGBUS, which would
// stop the daemon of every job on the node. Once Install() ran, a page of a
// guarded mapping past its file's end is replaced by an anonymous page (it
// reads as zeros and takes writes in this process only), and the mapping
// is marked; any other SIGBUS does what it did before.
//
// Thread-safety: Install once, before the first Guard (musterd at start);
// Guard, Unguard and Replaced from any thread. The handler reads a fixed
// table of atomics (async-signal-safe).
#ifndef MUSTER_COMMON_MAPPING_GUARD_H_
#define MUSTER_COMMON_MAPPING_GUARD_H_

#include <cstddef>

namespace muster::mapping_guard {

// Installs the SIGBUS handler. Returns false if it could not.
bool Install();
// Whether Install ran (then a mapping Guard cannot take must not be used
// for a file another user can resize).
bool Installed();
// Guards [base, base + bytes), to call right after the mmap, before the
// first access: the handle to pass to Unguard and Replaced, or -1 (Install
// did not run, or 16384 mappings are guarded already).
int Guard(void* base, size_t bytes);
// Guard, for a file another user can resize: false where Install ran but
// the mapping could not be guarded (it must not be used then); true
// otherwise, with *handle from Guard (-1 where Install did not run).
bool TryGuard(void* base, size_t bytes, int* handle);
// Before the mapping is unmapped. -1: nothing.
void Unguard(int handle);
// Whether a page of the mapping was replaced (its file was truncated).
bool Replaced(int handle);

}  // namespace muster::mapping_guard

#endif  // MUSTER_COMMON_MAPPING_GUARD_H_
