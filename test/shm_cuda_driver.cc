#include "test/shm_cuda_driver.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/fake_gpu_runtime.h"

namespace muster::testing {

ShmCudaDriver::~ShmCudaDriver() {
  for (auto& [base, block] : blocks_) {
    ::munmap(reinterpret_cast<void*>(base), block.size);
    ::close(block.fd);
  }
}

absl::StatusOr<void*> ShmCudaDriver::Allocate(size_t bytes) {
  int fd = ::memfd_create("muster-fake-device", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("ftruncate: ", std::strerror(errno)));
  }
  void* ptr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (ptr == MAP_FAILED) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  blocks_[reinterpret_cast<uintptr_t>(ptr)] = Block{bytes, fd, ++generation_};
  return ptr;
}

void ShmCudaDriver::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end()) return;
  ::munmap(ptr, it->second.size);
  ::close(it->second.fd);
  blocks_.erase(it);
}

absl::StatusOr<CudaDriver::Allocation> ShmCudaDriver::FindAllocation(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin() || p >= std::prev(it)->first + std::prev(it)->second.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer at 0x", absl::Hex(p), " is not CUDA device memory"));
  }
  --it;
  Allocation a;
  a.base = it->first;
  a.size = it->second.size;
  a.pci_bus_id = "fake:0";
  a.context = this;
  return a;
}

absl::StatusOr<std::string> ShmCudaDriver::ExportAllocation(const Allocation& allocation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(allocation.base);
  if (it == blocks_.end()) return absl::InvalidArgumentError("unknown allocation");
  return FakeShmHandle(::getpid(), it->second.fd, it->second.size, it->second.generation);
}

absl::StatusOr<void*> ShmCudaDriver::CreateIpcEvent(void*, std::string* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_event_++;
  *handle = FakeShmEventHandle(id);
  return reinterpret_cast<void*>(id);
}

absl::StatusOr<void*> ShmCudaDriver::CreateEvent(void*) {
  std::lock_guard<std::mutex> lock(mu_);
  return reinterpret_cast<void*>(next_event_++);
}

void ShmCudaDriver::DestroyEvent(void*) {}

}  // namespace muster::testing
