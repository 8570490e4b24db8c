#include "backends/shm/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <mutex>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muster {
namespace {

struct Live {
  size_t bytes;
  int fd;
  uint64_t inode;
};

// Live allocations of this process by the address of their user bytes.
struct Registry {
  // std::mutex, not absl::Mutex: Debian's Abseil is not instrumented for
  // TSan, and ranks-as-threads tests allocate concurrently.
  std::mutex mu;
  std::map<uintptr_t, Live> live;  // guarded by mu
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed (used at exit)
  return *registry;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedAllocation>> SharedAllocation::Create(size_t bytes) {
  // The header page plus `bytes` must fit in a file size (else the sum wraps
  // around and the mapping would be smaller than size() claims).
  constexpr uint64_t kLargest =
      static_cast<uint64_t>(std::numeric_limits<off_t>::max()) - kHeaderBytes;
  if (static_cast<uint64_t>(bytes) > kLargest) {
    return absl::ResourceExhaustedError(absl::StrCat("a shared allocation of ", bytes,
                                                     " bytes is larger than the largest memfd (",
                                                     kLargest, " bytes)"));
  }
  int fd = ::memfd_create(absl::StrCat("muster.", ::getpid()).c_str(), MFD_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "memfd_create for a shared allocation");
  size_t total = kHeaderBytes + bytes;
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("sizing a shared allocation to ", bytes, " bytes"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "fstat of a shared allocation");
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("mmap of a shared allocation of ", bytes, " bytes"));
  }
  auto* h = new (base) SharedAllocationHeader();
  h->magic = kMagic;
  h->bytes = bytes;
  h->freed.store(0, std::memory_order_release);
  auto alloc = std::unique_ptr<SharedAllocation>(
      new SharedAllocation(fd, static_cast<uint64_t>(st.st_ino), static_cast<char*>(base), bytes));
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.live[reinterpret_cast<uintptr_t>(alloc->data())] = Live{bytes, fd, alloc->inode()};
  return alloc;
}

SharedAllocation::SharedAllocation(int fd, uint64_t inode, char* base, size_t bytes)
    : fd_(fd), inode_(inode), base_(base), data_(base + kHeaderBytes), bytes_(bytes) {}

SharedAllocation::~SharedAllocation() {
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.live.erase(reinterpret_cast<uintptr_t>(data_));
  }
  reinterpret_cast<SharedAllocationHeader*>(base_)->freed.store(1, std::memory_order_release);
  ::munmap(base_, kHeaderBytes + bytes_);
  ::close(fd_);
}

bool FindSharedAllocation(const void* p, size_t bytes, SharedRef* ref) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(addr);
  if (it == r.live.begin()) return false;
  --it;
  if (addr + bytes > it->first + it->second.bytes) return false;
  ref->pid = static_cast<int32_t>(::getpid());
  ref->fd = it->second.fd;
  ref->inode = it->second.inode;
  ref->offset = SharedAllocation::kHeaderBytes + (addr - it->first);
  return true;
}

PeerMappings::~PeerMappings() { Sweep(0); }

absl::StatusOr<char*> PeerMappings::Resolve(const SharedRef& ref, size_t bytes) {
  auto key = std::make_pair(ref.pid, ref.inode);
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    std::string path = absl::StrCat("/proc/", ref.pid, "/fd/", ref.fd);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      return ErrnoToStatus(errno, absl::StrCat("opening a peer's shared allocation ", path));
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != ref.inode ||
        st.st_size < static_cast<off_t>(SharedAllocation::kHeaderBytes)) {
      ::close(fd);
      return absl::NotFoundError(absl::StrCat(path, " is no longer the shared allocation (inode ",
                                              ref.inode, ") the peer published"));
    }
    void* base = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    if (base == MAP_FAILED) {
      return ErrnoToStatus(err, absl::StrCat("mmap of a peer's shared allocation ", path));
    }
    auto* h = static_cast<SharedAllocationHeader*>(base);
    if (h->magic != SharedAllocation::kMagic) {
      ::munmap(base, st.st_size);
      return absl::DataLossError(absl::StrCat(path, " is not a muster shared allocation"));
    }
    it = maps_.emplace(key, Mapping{static_cast<char*>(base), static_cast<size_t>(st.st_size), 0})
             .first;
  }
  Mapping& m = it->second;
  auto* h = reinterpret_cast<SharedAllocationHeader*>(m.base);
  if (h->freed.load(std::memory_order_acquire) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("the shared allocation of pid ", ref.pid,
                                                      " (inode ", ref.inode, ") was freed"));
  }
  if (ref.offset + bytes > m.bytes) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", ref.offset, ", ", ref.offset + bytes,
                                              ") are outside the shared allocation of pid ",
                                              ref.pid, " (", m.bytes, " bytes)"));
  }
  m.last_use = ++uses_;
  return m.base + ref.offset;
}

void PeerMappings::Sweep(size_t keep) {
  for (auto it = maps_.begin(); it != maps_.end();) {
    auto* h = reinterpret_cast<SharedAllocationHeader*>(it->second.base);
    if (keep == 0 || h->freed.load(std::memory_order_acquire) != 0) {
      ::munmap(it->second.base, it->second.bytes);
      it = maps_.erase(it);
    } else {
      ++it;
    }
  }
  while (maps_.size() > keep) {
    auto oldest = maps_.begin();
    for (auto it = maps_.begin(); it != maps_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    ::munmap(oldest->second.base, oldest->second.bytes);
    maps_.erase(oldest);
  }
}

}  // namespace muster
