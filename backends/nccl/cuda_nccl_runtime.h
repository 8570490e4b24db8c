// CudaNcclRuntime: GpuRuntime on the CUDA runtime API and NCCL. The only
// implementation that touches a GPU; nothing is initialised until first
// use, so a musterd on a machine without GPUs starts and serves CPU work
// (GPU requests then fail with the reason from Unavailable()).
//
// Thread-safe as GpuRuntime requires. Communicators are created
// non-blocking (ncclConfig_t.blocking = 0).
#ifndef MUSTER_BACKENDS_NCCL_CUDA_NCCL_RUNTIME_H_
#define MUSTER_BACKENDS_NCCL_CUDA_NCCL_RUNTIME_H_

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/nccl/gpu_runtime.h"

namespace muster {

class CudaNcclRuntime : public GpuRuntime {
 public:
  std::string Unavailable() override;
  absl::StatusOr<int> DeviceByPciBusId(const std::string& bus_id) override;
  absl::Status SetDevice(int device) override;
  absl::StatusOr<void*> CreateStream() override;
  void DestroyStream(void* stream) override;
  absl::Status StreamSynchronize(void* stream) override;
  absl::StatusOr<void*> DeviceAlloc(size_t bytes) override;
  void DeviceFree(void* ptr) override;
  absl::StatusOr<void*> OpenMemHandle(const std::string& handle) override;
  void CloseMemHandle(void* base) override;
  // Through the driver (cuMemGetAddressRange), which cudart has loaded.
  absl::StatusOr<size_t> AllocationSize(void* base) override;
  absl::StatusOr<void*> OpenEventHandle(const std::string& handle) override;
  absl::StatusOr<void*> CreateEvent() override;
  void DestroyEvent(void* event) override;
  absl::Status RecordEvent(void* event, void* stream) override;
  absl::Status StreamWaitEvent(void* stream, void* event) override;
  absl::StatusOr<bool> EventDone(void* event) override;
  size_t UniqueIdBytes() override;
  absl::StatusOr<std::string> NewUniqueId() override;
  absl::StatusOr<void*> CommInit(int nranks, const std::string& unique_id, int rank) override;
  absl::StatusOr<void*> CommSplit(void* parent, int color, int key) override;
  absl::Status PollComm(void* comm) override;
  void AbortComm(void* comm) override;
  void DestroyComm(void* comm) override;
  absl::Status Launch(void* comm, const std::vector<NcclPrimitive>& primitives,
                      void* stream) override;

 private:
  // PreMulSum ops of a launch whose ncclGroupEnd returned ncclInProgress:
  // NCCL allows no other call on the communicator (ncclRedOpDestroy
  // included) until its state is ncclSuccess, so they are destroyed by the
  // PollComm that sees it (or dropped with the communicator).
  void DestroyDeferredOps(void* comm);
  void DropDeferredOps(void* comm);

  std::mutex mu_;
  std::optional<std::string> unavailable_;
  std::map<void*, std::vector<int>> deferred_ops_;  // comm -> ncclRedOp_t
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_NCCL_CUDA_NCCL_RUNTIME_H_
