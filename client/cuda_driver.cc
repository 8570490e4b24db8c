#include "client/cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// The driver API's types and constants (cuda.h), declared here so that the
// SDK builds without CUDA's headers.
using CUresult = int;
using CUdeviceptr = unsigned long long;  // NOLINT: the driver's type
using CUcontext = void*;
using CUevent = void*;
using CUstream = void*;
using CUdevice = int;
struct CUipcHandle {
  char reserved[64];
};
constexpr int kAttributeContext = 1;        // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemoryTypeDevice = 2;   // CU_MEMORYTYPE_DEVICE
constexpr unsigned kEventDisableTiming = 0x2;
constexpr unsigned kEventInterprocess = 0x4;
constexpr CUresult kNotReady = 600;  // CUDA_ERROR_NOT_READY

class DlCudaDriver : public CudaDriver {
 public:
  absl::Status Load() {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA tensors need the CUDA driver: ", dlerror()));
    }
    bool ok = Bind(init_, "cuInit") && Bind(error_name_, "cuGetErrorName") &&
              Bind(pointer_attribute_, "cuPointerGetAttribute") &&
              Bind(address_range_, "cuMemGetAddressRange_v2") &&
              Bind(ipc_mem_handle_, "cuIpcGetMemHandle") && Bind(device_get_, "cuDeviceGet") &&
              Bind(pci_bus_id_, "cuDeviceGetPCIBusId") && Bind(event_create_, "cuEventCreate") &&
              Bind(event_destroy_, "cuEventDestroy_v2") &&
              Bind(ipc_event_handle_, "cuIpcGetEventHandle") &&
              Bind(event_record_, "cuEventRecord") &&
              Bind(stream_wait_event_, "cuStreamWaitEvent") && Bind(event_query_, "cuEventQuery") &&
              Bind(ctx_push_, "cuCtxPushCurrent_v2") && Bind(ctx_pop_, "cuCtxPopCurrent_v2");
    if (!ok) {
      return absl::FailedPreconditionError(
          absl::StrCat("the CUDA driver lacks a needed function: ", dlerror()));
    }
    return Check(init_(0), "cuInit");
  }

  absl::StatusOr<Allocation> FindAllocation(const void* ptr) override {
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
    unsigned memory_type = 0;
    if (pointer_attribute_(&memory_type, kAttributeMemoryType, p) != 0 ||
        memory_type != kMemoryTypeDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer at 0x", absl::Hex(p), " is not CUDA device memory (CUDA tensors must be)"));
    }
    Allocation a;
    if (absl::Status s =
            Check(pointer_attribute_(&a.context, kAttributeContext, p), "cuPointerGetAttribute");
        !s.ok()) {
      return s;
    }
    // cuMemGetAddressRange needs a current context (CUDA_ERROR_INVALID_CONTEXT
    // otherwise): the caller's thread may have none, or another device's.
    ContextScope scope(this, a.context);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (absl::Status s = Check(address_range_(&base, &size, p), "cuMemGetAddressRange"); !s.ok()) {
      return s;
    }
    a.base = base;
    a.size = size;
    int ordinal = 0;
    if (absl::Status s = Check(pointer_attribute_(&ordinal, kAttributeDeviceOrdinal, p),
                               "cuPointerGetAttribute");
        !s.ok()) {
      return s;
    }
    CUdevice device = 0;
    if (absl::Status s = Check(device_get_(&device, ordinal), "cuDeviceGet"); !s.ok()) return s;
    char bus[32] = {0};
    if (absl::Status s = Check(pci_bus_id_(bus, sizeof(bus), device), "cuDeviceGetPCIBusId");
        !s.ok()) {
      return s;
    }
    a.pci_bus_id = bus;
    return a;
  }

  absl::StatusOr<std::string> ExportAllocation(const Allocation& allocation) override {
    ContextScope scope(this, allocation.context);  // as for cuMemGetAddressRange
    CUipcHandle handle;
    if (absl::Status s = Check(ipc_mem_handle_(&handle, allocation.base),
                               "cuIpcGetMemHandle (allocations from cudaMallocAsync or "
                               "virtual memory pools cannot be shared this way)");
        !s.ok()) {
      return s;
    }
    return std::string(handle.reserved, sizeof(handle.reserved));
  }

  absl::StatusOr<void*> CreateIpcEvent(void* context, std::string* handle) override {
    ContextScope scope(this, context);
    CUevent event = nullptr;
    if (absl::Status s =
            Check(event_create_(&event, kEventDisableTiming | kEventInterprocess), "cuEventCreate");
        !s.ok()) {
      return s;
    }
    CUipcHandle h;
    if (absl::Status s = Check(ipc_event_handle_(&h, event), "cuIpcGetEventHandle"); !s.ok()) {
      event_destroy_(event);
      return s;
    }
    handle->assign(h.reserved, sizeof(h.reserved));
    return event;
  }

  absl::StatusOr<void*> CreateEvent(void* context) override {
    ContextScope scope(this, context);
    CUevent event = nullptr;
    if (absl::Status s = Check(event_create_(&event, kEventDisableTiming), "cuEventCreate");
        !s.ok()) {
      return s;
    }
    return event;
  }

  void DestroyEvent(void* event) override { event_destroy_(event); }

  absl::Status RecordEvent(void* event, void* stream, void* context) override {
    ContextScope scope(this, context);
    return Check(event_record_(event, stream), "cuEventRecord");
  }

  absl::Status StreamWaitEvent(void* stream, void* event, void* context) override {
    ContextScope scope(this, context);
    return Check(stream_wait_event_(stream, event, 0), "cuStreamWaitEvent");
  }

  absl::StatusOr<bool> EventDone(void* event) override {
    CUresult r = event_query_(event);
    if (r == 0) return true;
    if (r == kNotReady) return false;
    return Check(r, "cuEventQuery");
  }

 private:
  // Makes `context` current on this thread for the scope (the calling
  // thread may be one of muster's, where no context is current).
  class ContextScope {
   public:
    ContextScope(DlCudaDriver* driver, void* context) : driver_(driver), pushed_(false) {
      if (context != nullptr) pushed_ = driver_->ctx_push_(context) == 0;
    }
    ~ContextScope() {
      if (pushed_) {
        CUcontext popped;
        driver_->ctx_pop_(&popped);
      }
    }

   private:
    DlCudaDriver* driver_;
    bool pushed_;
  };

  template <typename F>
  bool Bind(F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(lib_, name));
    return fn != nullptr;
  }

  absl::Status Check(CUresult r, absl::string_view what) {
    if (r == 0) return absl::OkStatus();
    const char* name = nullptr;
    if (error_name_ != nullptr) error_name_(r, &name);
    std::string error = name != nullptr ? name : absl::StrCat("CUDA error ", r);
    return absl::InternalError(absl::StrCat(what, ": ", error));
  }

  void* lib_ = nullptr;
  CUresult (*init_)(unsigned) = nullptr;
  CUresult (*error_name_)(CUresult, const char**) = nullptr;
  CUresult (*pointer_attribute_)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*address_range_)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*ipc_mem_handle_)(CUipcHandle*, CUdeviceptr) = nullptr;
  CUresult (*device_get_)(CUdevice*, int) = nullptr;
  CUresult (*pci_bus_id_)(char*, int, CUdevice) = nullptr;
  CUresult (*event_create_)(CUevent*, unsigned) = nullptr;
  CUresult (*event_destroy_)(CUevent) = nullptr;
  CUresult (*ipc_event_handle_)(CUipcHandle*, CUevent) = nullptr;
  CUresult (*event_record_)(CUevent, CUstream) = nullptr;
  CUresult (*stream_wait_event_)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*event_query_)(CUevent) = nullptr;
  CUresult (*ctx_push_)(CUcontext) = nullptr;
  CUresult (*ctx_pop_)(CUcontext*) = nullptr;
};

}  // namespace

namespace {
std::atomic<CudaDriver*> testing_driver{nullptr};
}  // namespace

void SetCudaDriverForTesting(CudaDriver* driver) { testing_driver = driver; }

absl::StatusOr<CudaDriver*> SystemCudaDriver() {
  if (CudaDriver* fake = testing_driver.load(); fake != nullptr) return fake;
  static std::once_flag once;
  static DlCudaDriver* driver = nullptr;
  static absl::Status* status = nullptr;
  std::call_once(once, [] {
    auto* d = new DlCudaDriver;
    absl::Status s = d->Load();
    if (s.ok()) {
      driver = d;
    } else {
      status = new absl::Status(s);  // the library stays loaded, if it was
    }
  });
  if (driver == nullptr) return *status;
  return driver;
}

}  // namespace muster
