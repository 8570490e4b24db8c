#include "backends/nccl/cuda_nccl_runtime.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_errors.h"
#include "backends/nccl/nccl_mapping.h"

namespace muster {
namespace {

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

absl::Status Nccl(ncclResult_t result, absl::string_view what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result == ncclInProgress) return absl::UnavailableError(absl::StrCat(what, ": in progress"));
  const char* detail = ncclGetLastError(comm);
  return NcclStatus(result, what, detail != nullptr ? detail : "");
}

}  // namespace

std::string CudaNcclRuntime::Unavailable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!unavailable_.has_value()) {
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess) {
      unavailable_ = absl::StrCat("no usable CUDA device: ", cudaGetErrorName(err), " (",
                                  cudaGetErrorString(err), ")");
    } else if (devices == 0) {
      unavailable_ = "no CUDA device";
    } else {
      unavailable_ = "";
    }
  }
  return *unavailable_;
}

absl::StatusOr<int> CudaNcclRuntime::DeviceByPciBusId(const std::string& bus_id) {
  int device = -1;
  if (absl::Status s =
          CudaStatus(cudaDeviceGetByPCIBusId(&device, bus_id.c_str()), "cudaDeviceGetByPCIBusId");
      !s.ok()) {
    return s;
  }
  return device;
}

absl::Status CudaNcclRuntime::SetDevice(int device) {
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

absl::StatusOr<void*> CudaNcclRuntime::CreateStream() {
  cudaStream_t stream = nullptr;
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  return static_cast<void*>(stream);
}

void CudaNcclRuntime::DestroyStream(void* stream) {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

absl::Status CudaNcclRuntime::StreamSynchronize(void* stream) {
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                    "cudaStreamSynchronize");
}

absl::StatusOr<void*> CudaNcclRuntime::DeviceAlloc(size_t bytes) {
  void* ptr = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&ptr, bytes), "cudaMalloc"); !s.ok()) return s;
  return ptr;
}

void CudaNcclRuntime::DeviceFree(void* ptr) { cudaFree(ptr); }

absl::StatusOr<void*> CudaNcclRuntime::OpenMemHandle(const std::string& handle) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) return absl::InvalidArgumentError("bad IPC memory handle size");
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  if (absl::Status s = CudaStatus(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
                                  "cudaIpcOpenMemHandle");
      !s.ok()) {
    return s;
  }
  return base;
}

void CudaNcclRuntime::CloseMemHandle(void* base) { cudaIpcCloseMemHandle(base); }

absl::StatusOr<size_t> CudaNcclRuntime::AllocationSize(void* base) {
  using AddressRange = int (*)(unsigned long long*, size_t*, unsigned long long);  // NOLINT
  static AddressRange address_range = [] {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = ::dlopen("libcuda.so.1", RTLD_NOW);
    return lib == nullptr ? nullptr
                          : reinterpret_cast<AddressRange>(::dlsym(lib, "cuMemGetAddressRange_v2"));
  }();
  if (address_range == nullptr) {
    return absl::FailedPreconditionError("the CUDA driver has no cuMemGetAddressRange_v2");
  }
  unsigned long long start = 0;  // NOLINT: the driver's CUdeviceptr
  size_t size = 0;
  int r = address_range(&start, &size, reinterpret_cast<unsigned long long>(base));  // NOLINT
  if (r != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuMemGetAddressRange on an opened IPC allocation failed (CUresult ", r, ")"));
  }
  // `base` is where the opened allocation starts; what lies before it is
  // not the rank's.
  return size - (reinterpret_cast<unsigned long long>(base) - start);  // NOLINT
}

absl::StatusOr<void*> CudaNcclRuntime::OpenEventHandle(const std::string& handle) {
  cudaIpcEventHandle_t h;
  if (handle.size() != sizeof(h)) return absl::InvalidArgumentError("bad IPC event handle size");
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(cudaIpcOpenEventHandle(&event, h), "cudaIpcOpenEventHandle");
      !s.ok()) {
    return s;
  }
  return static_cast<void*>(event);
}

absl::StatusOr<void*> CudaNcclRuntime::CreateEvent() {
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags");
      !s.ok()) {
    return s;
  }
  return static_cast<void*>(event);
}

void CudaNcclRuntime::DestroyEvent(void* event) {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::Status CudaNcclRuntime::RecordEvent(void* event, void* stream) {
  return CudaStatus(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
      "cudaEventRecord");
}

absl::Status CudaNcclRuntime::StreamWaitEvent(void* stream, void* event) {
  return CudaStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
      "cudaStreamWaitEvent");
}

absl::StatusOr<bool> CudaNcclRuntime::EventDone(void* event) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return CudaStatus(err, "cudaEventQuery");
}

size_t CudaNcclRuntime::UniqueIdBytes() { return sizeof(ncclUniqueId); }

absl::StatusOr<std::string> CudaNcclRuntime::NewUniqueId() {
  ncclUniqueId id;
  if (absl::Status s = Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<void*> CudaNcclRuntime::CommInit(int nranks, const std::string& unique_id,
                                                int rank) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id)) return absl::InvalidArgumentError("bad NCCL unique id");
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return Nccl(r, "ncclCommInitRankConfig");
  return static_cast<void*>(comm);
}

absl::StatusOr<void*> CudaNcclRuntime::CommSplit(void* parent, int color, int key) {
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommSplit(static_cast<ncclComm_t>(parent),
                                 color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    return Nccl(r, "ncclCommSplit", static_cast<ncclComm_t>(parent));
  }
  return static_cast<void*>(comm);
}

absl::Status CudaNcclRuntime::PollComm(void* comm) {
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(static_cast<ncclComm_t>(comm), &async);
  if (r != ncclSuccess) return Nccl(r, "ncclCommGetAsyncError", static_cast<ncclComm_t>(comm));
  if (async == ncclSuccess) DestroyDeferredOps(comm);
  return Nccl(async, "NCCL", static_cast<ncclComm_t>(comm));
}

void CudaNcclRuntime::DestroyDeferredOps(void* comm) {
  std::vector<int> ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = deferred_ops_.find(comm);
    if (it == deferred_ops_.end()) return;
    ops = std::move(it->second);
    deferred_ops_.erase(it);
  }
  for (int op : ops) ncclRedOpDestroy(static_cast<ncclRedOp_t>(op), static_cast<ncclComm_t>(comm));
}

void CudaNcclRuntime::DropDeferredOps(void* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  deferred_ops_.erase(comm);
}

void CudaNcclRuntime::AbortComm(void* comm) {
  DropDeferredOps(comm);  // the abort frees them
  ncclCommAbort(static_cast<ncclComm_t>(comm));
}

void CudaNcclRuntime::DestroyComm(void* comm) {
  // Ops of a launch whose completion was never polled: destroying them now
  // would be a call on a communicator still in progress; the destroy (or
  // abort) below frees them with it.
  DropDeferredOps(comm);
  // Finalize flushes outstanding work (non-blocking: poll it, bounded);
  // a communicator that does not finalize in time is aborted instead.
  ncclComm_t c = static_cast<ncclComm_t>(comm);
  ncclResult_t r = ncclCommFinalize(c);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  ncclResult_t async = r;
  while (async == ncclInProgress && absl::Now() < deadline) {
    if (ncclCommGetAsyncError(c, &async) != ncclSuccess) break;
    if (async == ncclInProgress) absl::SleepFor(absl::Microseconds(100));
  }
  if (async != ncclSuccess) {
    ncclCommAbort(c);
    return;
  }
  ncclCommDestroy(c);
}

absl::Status CudaNcclRuntime::Launch(void* comm_ptr, const std::vector<NcclPrimitive>& primitives,
                                     void* stream_ptr) {
  ncclComm_t comm = static_cast<ncclComm_t>(comm_ptr);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  std::vector<ncclRedOp_t> created_ops;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return Nccl(r, "ncclGroupStart", comm);
  ncclResult_t first_error = ncclSuccess;
  for (const NcclPrimitive& p : primitives) {
    ncclDataType_t type = static_cast<ncclDataType_t>(p.type);
    ncclRedOp_t op = static_cast<ncclRedOp_t>(p.op);
    if (p.premul_sum) {
      alignas(8) unsigned char scalar[8];
      EncodePremulScalar(type, p.scale, scalar);
      r = ncclRedOpCreatePreMulSum(&op, scalar, type, ncclScalarHostImmediate, comm);
      if (r != ncclSuccess && r != ncclInProgress) {
        first_error = r;
        break;
      }
      created_ops.push_back(op);
    }
    switch (p.kind) {
      case NcclPrimitive::kAllReduce:
        r = ncclAllReduce(p.send, p.recv, p.count, type, op, comm, stream);
        break;
      case NcclPrimitive::kBroadcast:
        r = ncclBroadcast(p.send, p.recv, p.count, type, p.root, comm, stream);
        break;
      case NcclPrimitive::kReduce:
        r = ncclReduce(p.send, p.recv, p.count, type, op, p.root, comm, stream);
        break;
      case NcclPrimitive::kAllGather:
        r = ncclAllGather(p.send, p.recv, p.count, type, comm, stream);
        break;
      case NcclPrimitive::kReduceScatter:
        r = ncclReduceScatter(p.send, p.recv, p.count, type, op, comm, stream);
        break;
      case NcclPrimitive::kSend:
        r = ncclSend(p.send, p.count, type, p.root, comm, stream);
        break;
      case NcclPrimitive::kRecv:
        r = ncclRecv(p.recv, p.count, type, p.root, comm, stream);
        break;
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      first_error = r;
      break;
    }
  }
  r = ncclGroupEnd();
  if (r == ncclInProgress && first_error == ncclSuccess) {
    // Non-blocking: no NCCL call on `comm` until PollComm sees it done.
    if (!created_ops.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<int>& deferred = deferred_ops_[comm_ptr];
      for (ncclRedOp_t op : created_ops) deferred.push_back(static_cast<int>(op));
    }
    return absl::UnavailableError("in progress");
  }
  if (r == ncclSuccess) {
    for (ncclRedOp_t op : created_ops) ncclRedOpDestroy(op, comm);
  }
  // On an error the engine aborts the communicator, which frees the ops.
  if (first_error != ncclSuccess) return Nccl(first_error, "enqueueing NCCL operations", comm);
  if (r == ncclInProgress) return absl::UnavailableError("in progress");
  return Nccl(r, "ncclGroupEnd", comm);
}

}  // namespace muster
