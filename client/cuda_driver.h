// CudaDriver: the few CUDA driver calls a rank needs to hand CUDA buffers
// to musterd (IPC handles for allocations, interprocess events, stream
// ordering). The SDK never links CUDA: SystemCudaDriver() loads the
// driver (libcuda.so.1) with dlopen the first time a CUDA tensor is used,
// so CPU-only programs and machines never need it. Tests substitute a fake.
//
// Thread-safe (the driver API is).
#ifndef MUSTER_CLIENT_CUDA_DRIVER_H_
#define MUSTER_CLIENT_CUDA_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

class CudaDriver {
 public:
  virtual ~CudaDriver() = default;

  // The device allocation containing `ptr`.
  struct Allocation {
    uintptr_t base = 0;
    size_t size = 0;
    std::string pci_bus_id;   // of its device, e.g. "0000:3b:00.0"
    void* context = nullptr;  // CUcontext it belongs to
  };
  // InvalidArgument if `ptr` is not device memory.
  virtual absl::StatusOr<Allocation> FindAllocation(const void* ptr) = 0;
  // The 64-byte IPC handle exporting the allocation at `base` (a new
  // allocation at the same address gets a different handle).
  virtual absl::StatusOr<std::string> ExportAllocation(const Allocation& allocation) = 0;

  // An interprocess event in `context`; `handle` receives its 64-byte IPC
  // handle.
  virtual absl::StatusOr<void*> CreateIpcEvent(void* context, std::string* handle) = 0;
  // A plain event (for Work::Synchronize).
  virtual absl::StatusOr<void*> CreateEvent(void* context) = 0;
  virtual void DestroyEvent(void* event) = 0;
  virtual absl::Status RecordEvent(void* event, void* stream, void* context) = 0;
  virtual absl::Status StreamWaitEvent(void* stream, void* event, void* context) = 0;
  // OK(true) when the work before the event's last record finished.
  virtual absl::StatusOr<bool> EventDone(void* event) = 0;
};

// The process's driver, loaded on first use. FailedPrecondition (with the
// loader's message) where there is no CUDA driver.
absl::StatusOr<CudaDriver*> SystemCudaDriver();

// Tests without a GPU: makes SystemCudaDriver() return `driver` (not owned;
// null restores the real one). Call before the first CUDA collective.
void SetCudaDriverForTesting(CudaDriver* driver);

}  // namespace muster

#endif  // MUSTER_CLIENT_CUDA_DRIVER_H_
