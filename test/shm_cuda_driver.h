// ShmCudaDriver: a CudaDriver for rank processes in tests without a GPU.
// "Device memory" is a memfd mapped shared; its handle (FakeShmHandle)
// lets a musterd running FakeGpuRuntime map the same pages, so real rank
// processes exercise the whole GPU path (SDK, gRPC, engine) with host
// memory. Events are inert: the fake runtime finishes a collective before
// the daemon answers.
//
// Thread-safe.
#ifndef MUSTER_TEST_SHM_CUDA_DRIVER_H_
#define MUSTER_TEST_SHM_CUDA_DRIVER_H_

#include <map>
#include <mutex>

#include "client/cuda_driver.h"

namespace muster::testing {

class ShmCudaDriver : public CudaDriver {
 public:
  ~ShmCudaDriver() override;
  // A zero-filled "device" allocation of `bytes`.
  absl::StatusOr<void*> Allocate(size_t bytes);
  void Free(void* ptr);

  absl::StatusOr<Allocation> FindAllocation(const void* ptr) override;
  absl::StatusOr<std::string> ExportAllocation(const Allocation& allocation) override;
  absl::StatusOr<void*> CreateIpcEvent(void* context, std::string* handle) override;
  absl::StatusOr<void*> CreateEvent(void* context) override;
  void DestroyEvent(void* event) override;
  absl::Status RecordEvent(void*, void*, void*) override { return absl::OkStatus(); }
  absl::Status StreamWaitEvent(void*, void*, void*) override { return absl::OkStatus(); }
  absl::StatusOr<bool> EventDone(void*) override { return true; }

 private:
  struct Block {
    size_t size;
    int fd;
    uint32_t generation;
  };
  std::mutex mu_;
  std::map<uintptr_t, Block> blocks_;
  uint32_t generation_ = 0;
  uint64_t next_event_ = 1;
};

}  // namespace muster::testing

#endif  // MUSTER_TEST_SHM_CUDA_DRIVER_H_
