// Shared allocations: memory a rank allocates so that the other ranks of
// its node-local groups can map it and read or write it directly (the
// zero-copy path of ShmCommunicator), and the cache through which a rank
// maps its peers' allocations.
//
// An allocation is a memfd (anonymous tmpfs file): one header page, then
// the user's bytes. Nothing is named in /dev/shm, so nothing can be left
// behind: the kernel frees the memory when the owner and every peer that
// mapped it have unmapped it or exited (a rank or daemon killed with
// SIGKILL leaks nothing). Peers open it through /proc/<owner pid>/fd/<fd>
// (same user; the inode is checked, so a reused pid or fd number is
// detected) while the owner holds it.
//
// When the owner frees an allocation it sets the header's `freed` flag;
// peers drop such mappings at their next direct collective (PeerMappings::
// Sweep), so a freed allocation's memory lives on in peers at most until
// then (or until the group is destroyed).
//
// Thread-safety: SharedAllocation::Create, the destructor and
// FindSharedAllocation are thread-safe (a process-wide registry under a
// mutex). A PeerMappings object is thread-compatible (one per
// communicator, driven by one thread).
#ifndef MUSTER_BACKENDS_SHM_SHARED_MEMORY_H_
#define MUSTER_BACKENDS_SHM_SHARED_MEMORY_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"

namespace muster {

// The first page of every shared allocation.
struct SharedAllocationHeader {
  uint64_t magic;
  uint64_t bytes;  // user bytes after the header page
  std::atomic<uint32_t> freed;
};

class SharedAllocation {
 public:
  static constexpr uint64_t kMagic = 0x4d55535445524142ull;  // "MUSTERAB"
  static constexpr size_t kHeaderBytes = 4096;
  // A zero-filled allocation of `bytes` (0 is allowed), registered so that
  // collectives find it by address.
  static absl::StatusOr<std::unique_ptr<SharedAllocation>> Create(size_t bytes);
  // Marks the allocation freed, unregisters and unmaps it.
  ~SharedAllocation();
  SharedAllocation(const SharedAllocation&) = delete;
  SharedAllocation& operator=(const SharedAllocation&) = delete;

  char* data() const { return data_; }
  size_t size() const { return bytes_; }
  int fd() const { return fd_; }
  uint64_t inode() const { return inode_; }

 private:
  SharedAllocation(int fd, uint64_t inode, char* base, size_t bytes);
  int fd_;
  uint64_t inode_;
  char* base_;  // the header page
  char* data_;
  size_t bytes_;
};

// Where a peer finds bytes of a shared allocation.
struct SharedRef {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t inode = 0;
  uint64_t offset = 0;  // from the start of the memfd (header page included)
};

// If [p, p + bytes) lies inside one live shared allocation of this process,
// fills `ref` and returns true.
bool FindSharedAllocation(const void* p, size_t bytes, SharedRef* ref);

// A rank's mappings of its peers' allocations, by (pid, inode).
class PeerMappings {
 public:
  PeerMappings() = default;
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // The address in this process of `bytes` bytes at `ref`, mapping the
  // allocation on first use. Errors name the peer's pid and fd (gone,
  // not accessible, not a muster allocation, too small, freed).
  absl::StatusOr<char*> Resolve(const SharedRef& ref, size_t bytes);
  // Unmaps allocations their owners freed; keeps at most `keep` others
  // (the least recently used go first).
  void Sweep(size_t keep = 64);
  size_t size() const { return maps_.size(); }

 private:
  struct Mapping {
    char* base = nullptr;
    size_t bytes = 0;
    uint64_t last_use = 0;
  };
  std::map<std::pair<int32_t, uint64_t>, Mapping> maps_;
  uint64_t uses_ = 0;
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_SHARED_MEMORY_H_
