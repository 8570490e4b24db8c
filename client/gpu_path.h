// The SDK's GPU path: how a rank hands a collective on CUDA tensors to
// musterd, which runs it on the NCCL communicator it owns (see
// proto/gpu.proto). Internal to the SDK.
//
//  - DeviceBufferExporter turns a device pointer into (IPC handle of its
//    allocation, offset), remembering allocations so that one freed and
//    replaced at the same address is reported to the daemon as released.
//  - TensorsDevice says which device a call's tensors are on (mixing is
//    an error); ProcessGroup::Impl::Route sends it to that device's
//    backend.
//  - GpuPath, one per group: records an interprocess "ready" event on the
//    tensors' stream, sends the request, and makes the stream wait on the
//    "done" event the daemon recorded after the NCCL launch. The daemon
//    launches once every member on its node issued the collective (it
//    compares their signatures first), so a call returns when the node's
//    members all made it; the CPU does not wait for the GPU unless
//    Work::Synchronize() asks. The first request
//    goes through gRPC; later ones through the communicator's shared-memory
//    channel (GpuChannel) that the first reply names, falling back to gRPC
//    if the channel closes.
//
// DeviceBufferExporter is thread-compatible; GpuPath is thread-safe (one
// collective at a time per group, in call order).
#ifndef MUSTER_CLIENT_GPU_PATH_H_
#define MUSTER_CLIENT_GPU_PATH_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cuda_driver.h"
#include "common/gpu_channel.h"
#include "muster/world.h"
#include "proto/gpu.pb.h"

namespace muster {

class DeviceBufferExporter {
 public:
  explicit DeviceBufferExporter(CudaDriver* driver) : driver_(driver) {}
  struct Exported {
    v1::GpuBuffer buffer;
    std::string pci_bus_id;
    void* context = nullptr;
  };
  // InvalidArgument if `ptr` is not device memory or `bytes` run past the
  // end of its allocation.
  absl::StatusOr<Exported> Export(const void* ptr, size_t bytes);
  // Handles of allocations freed since the last call (to tell the daemon).
  std::vector<std::string> TakeReleased();

 private:
  CudaDriver* const driver_;
  struct Known {
    size_t size;
    std::string handle;
  };
  std::map<uintptr_t, Known> known_;  // by allocation base
  std::vector<std::string> released_;
};

// The device of a call's `tensors` (null entries are skipped; none: CPU).
// InvalidArgument for mixed devices.
absl::StatusOr<Device> TensorsDevice(absl::Span<const Tensor* const> tensors, const char* what);

// One GPU collective as the SDK describes it.
struct GpuCall {
  v1::GpuOp op = v1::GPU_OP_UNSPECIFIED;
  DType dtype = DType::kFloat32;
  size_t count = 0;
  int root = 0;
  ReduceOp reduce_op = ReduceOp::kSum;
  double scale = 1.0;
  std::vector<Tensor> inputs, outputs;
  std::vector<size_t> send_counts, recv_counts;
  struct PointToPoint {
    bool send = true;
    int peer = 0;  // group rank
    Tensor tensor;
  };
  std::vector<PointToPoint> p2p;
};

// Sends one request to musterd; what the gRPC stub does in production.
using GpuTransport =
    std::function<absl::StatusOr<v1::GpuCollectiveResponse>(const v1::GpuCollectiveRequest&)>;

// Asks musterd whether collective `sequence` of this rank's communicator
// failed after it was enqueued (Gpu.CollectiveStatus).
using GpuStatusCheck = std::function<absl::Status(uint64_t sequence)>;

class GpuPath {
 public:
  // `status_check` may be empty (no check after Synchronize).
  // `call_timeout` bounds a request on the shared-memory channel (as the
  // transport's deadline bounds a gRPC one): a daemon that died never
  // answers there. A channel call that times out retires the channel (the
  // daemon may still read that request), so later requests use gRPC.
  // `group_timeout` goes with every request (timeout_millis): how long
  // musterd waits for the group's other members on the node to issue the
  // collective before it fails it for all (DEADLINE_EXCEEDED here, ABORTED
  // for a member that issues it later); zero: musterd uses the group's.
  // Both deadlines must leave musterd time to answer past it.
  GpuPath(CudaDriver* driver, GpuTransport transport, std::string job_id, int global_rank,
          std::string group, GpuStatusCheck status_check = nullptr,
          absl::Duration call_timeout = absl::Hours(1),
          absl::Duration group_timeout = absl::ZeroDuration());
  ~GpuPath();

  struct Launched {
    uint64_t sequence = 0;  // this group's GPU collectives, from 1
    // An event recorded on the tensors' stream after the collective, owned
    // by the caller (pass it to Synchronize, then Release).
    void* marker = nullptr;
  };
  // Enqueues `call` through musterd.
  absl::StatusOr<Launched> Run(const GpuCall& call);
  // Blocks until the GPU passed `event` (DEADLINE_EXCEEDED at `deadline`),
  // then reports whether collective `sequence` failed asynchronously (the
  // communicator was aborted before it finished: ABORTED with the reason).
  absl::Status Synchronize(void* event, uint64_t sequence, absl::Time deadline);
  void Release(void* event);

 private:
  absl::Status EnsureEvents(void* context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CudaDriver* const driver_;
  const GpuTransport transport_;
  const GpuStatusCheck status_check_;
  const std::string job_id_;
  const int global_rank_;
  const std::string group_;
  const absl::Duration call_timeout_;
  const absl::Duration group_timeout_;
  absl::Mutex mu_;
  DeviceBufferExporter exporter_ ABSL_GUARDED_BY(mu_);
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  void* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  void* ready_ ABSL_GUARDED_BY(mu_) = nullptr;
  void* done_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string ready_handle_ ABSL_GUARDED_BY(mu_);
  std::string done_handle_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GpuChannel> channel_ ABSL_GUARDED_BY(mu_);
  uint64_t channel_calls_ ABSL_GUARDED_BY(mu_) = 0;

 public:
  // Requests answered through the shared-memory channel (for tests).
  uint64_t channel_calls() {
    absl::MutexLock lock(&mu_);
    return channel_calls_;
  }
};

}  // namespace muster

#endif  // MUSTER_CLIENT_GPU_PATH_H_
