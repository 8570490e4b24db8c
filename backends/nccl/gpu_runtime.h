// GpuRuntime: the CUDA and NCCL calls musterd's GPU engine makes, behind an
// interface. CudaNcclRuntime (cuda_nccl_runtime.h) is the real one; tests
// plug in an in-process fake that moves host memory, so the engine's
// bookkeeping (rendezvous, caching, ordering, aborts, timeouts) is tested
// on machines without a GPU.
//
// Handles (streams, events, communicators) are opaque pointers owned by the
// runtime. Every method may be called from any thread; a communicator and
// its stream are driven by one thread at a time (the engine's worker for
// that communicator), except Abort, which may come from any thread.
#ifndef MUSTER_BACKENDS_NCCL_GPU_RUNTIME_H_
#define MUSTER_BACKENDS_NCCL_GPU_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/shm/reduce.h"

namespace muster {

// One NCCL primitive of a launch (a launch is one ncclGroupStart/End).
struct NcclPrimitive {
  enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv };
  Kind kind = kAllReduce;
  const void* send = nullptr;  // device pointers
  void* recv = nullptr;
  // Elements of `type`. For all_gather/reduce_scatter: the per-rank block.
  size_t count = 0;
  // NCCL's element type as an integer (ncclDataType_t): the fake runtime
  // does not see nccl.h. kBytes marks pure data movement.
  int type = 0;
  int op = 0;               // ncclRedOp_t (reductions)
  bool premul_sum = false;  // op created per launch from `scale`
  double scale = 1.0;
  int root = 0;  // group rank: broadcast/reduce root, send/recv peer
  // For the fake runtime and for tests: the muster dtype and op behind it.
  DType dtype = DType::kUInt8;
  ReduceOp reduce_op = ReduceOp::kSum;
};

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;

  // Why GPUs cannot be used at all ("" if they can): no driver, no device.
  virtual std::string Unavailable() = 0;

  // Devices and streams.
  virtual absl::StatusOr<int> DeviceByPciBusId(const std::string& bus_id) = 0;
  virtual absl::Status SetDevice(int device) = 0;
  virtual absl::StatusOr<void*> CreateStream() = 0;
  virtual void DestroyStream(void* stream) = 0;
  virtual absl::Status StreamSynchronize(void* stream) = 0;
  // Device memory the daemon owns (the barrier's scratch word).
  virtual absl::StatusOr<void*> DeviceAlloc(size_t bytes) = 0;
  virtual void DeviceFree(void* ptr) = 0;

  // CUDA IPC (64-byte handles).
  virtual absl::StatusOr<void*> OpenMemHandle(const std::string& handle) = 0;
  virtual void CloseMemHandle(void* base) = 0;
  // Bytes of the allocation opened at `base` (what a request's offset and
  // size are checked against: a rank must not make NCCL write outside its
  // own memory).
  virtual absl::StatusOr<size_t> AllocationSize(void* base) = 0;
  virtual absl::StatusOr<void*> OpenEventHandle(const std::string& handle) = 0;
  // Local events (the watchdog's completion markers).
  virtual absl::StatusOr<void*> CreateEvent() = 0;
  virtual void DestroyEvent(void* event) = 0;
  virtual absl::Status RecordEvent(void* event, void* stream) = 0;
  virtual absl::Status StreamWaitEvent(void* stream, void* event) = 0;
  // OK(true) once the work before the event's last record finished.
  virtual absl::StatusOr<bool> EventDone(void* event) = 0;

  // NCCL. Communicators are created non-blocking: Init/Split return at
  // once, and PollComm reports InProgress (Unavailable), OK, or the error.
  virtual size_t UniqueIdBytes() = 0;
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;
  virtual absl::StatusOr<void*> CommInit(int nranks, const std::string& unique_id, int rank) = 0;
  // `color` < 0: this rank takes part but joins no new communicator
  // (returns nullptr).
  virtual absl::StatusOr<void*> CommSplit(void* parent, int color, int key) = 0;
  // OK when idle, UnavailableError while an operation is in progress,
  // the asynchronous error otherwise.
  virtual absl::Status PollComm(void* comm) = 0;
  virtual void AbortComm(void* comm) = 0;
  virtual void DestroyComm(void* comm) = 0;
  // Enqueues `primitives` as one group on `stream`; may return while in
  // progress (poll with PollComm).
  virtual absl::Status Launch(void* comm, const std::vector<NcclPrimitive>& primitives,
                              void* stream) = 0;
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_NCCL_GPU_RUNTIME_H_
