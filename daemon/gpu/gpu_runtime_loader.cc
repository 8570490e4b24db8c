#include "daemon/gpu/gpu_runtime_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace muster {
namespace {

class NoGpuRuntime : public GpuRuntime {
 public:
  explicit NoGpuRuntime(std::string reason) : reason_(std::move(reason)) {}
  std::string Unavailable() override { return reason_; }
  absl::StatusOr<int> DeviceByPciBusId(const std::string&) override { return Error(); }
  absl::Status SetDevice(int) override { return Error(); }
  absl::StatusOr<void*> CreateStream() override { return Error(); }
  void DestroyStream(void*) override {}
  absl::Status StreamSynchronize(void*) override { return Error(); }
  absl::StatusOr<void*> DeviceAlloc(size_t) override { return Error(); }
  void DeviceFree(void*) override {}
  absl::StatusOr<void*> OpenMemHandle(const std::string&) override { return Error(); }
  void CloseMemHandle(void*) override {}
  absl::StatusOr<size_t> AllocationSize(void*) override { return Error(); }
  absl::StatusOr<void*> OpenEventHandle(const std::string&) override { return Error(); }
  absl::StatusOr<void*> CreateEvent() override { return Error(); }
  void DestroyEvent(void*) override {}
  absl::Status RecordEvent(void*, void*) override { return Error(); }
  absl::Status StreamWaitEvent(void*, void*) override { return Error(); }
  absl::StatusOr<bool> EventDone(void*) override { return Error(); }
  size_t UniqueIdBytes() override { return 0; }
  absl::StatusOr<std::string> NewUniqueId() override { return Error(); }
  absl::StatusOr<void*> CommInit(int, const std::string&, int) override { return Error(); }
  absl::StatusOr<void*> CommSplit(void*, int, int) override { return Error(); }
  absl::Status PollComm(void*) override { return Error(); }
  void AbortComm(void*) override {}
  void DestroyComm(void*) override {}
  absl::Status Launch(void*, const std::vector<NcclPrimitive>&, void*) override { return Error(); }

 private:
  absl::Status Error() const { return absl::FailedPreconditionError(reason_); }
  std::string reason_;
};

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> DefaultGpuPluginPaths() {
  const std::string dir = ExecutableDir();
  return {dir + "/libmuster_cuda.so", dir + "/../backends/nccl/libmuster_cuda.so",
          "/usr/lib/muster/libmuster_cuda.so"};
}

std::unique_ptr<GpuRuntime> UnavailableGpuRuntime(std::string reason) {
  return std::make_unique<NoGpuRuntime>(std::move(reason));
}

std::unique_ptr<GpuRuntime> LoadGpuRuntime(const std::string& path) {
  std::string chosen = path;
  if (chosen.empty()) {
    for (const std::string& candidate : DefaultGpuPluginPaths()) {
      if (::access(candidate.c_str(), R_OK) == 0) {
        chosen = candidate;
        break;
      }
    }
    if (chosen.empty()) {
      return UnavailableGpuRuntime(absl::StrCat(
          "musterd's GPU plugin libmuster_cuda.so was not found (looked next to musterd, in the "
          "Bazel output tree and /usr/lib/muster; --gpu-plugin names it)"));
    }
  }
  void* lib = ::dlopen(chosen.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return UnavailableGpuRuntime(
        absl::StrCat("cannot load musterd's GPU plugin ", chosen, ": ", ::dlerror()));
  }
  using Factory = GpuRuntime* (*)();
  auto factory = reinterpret_cast<Factory>(::dlsym(lib, "MusterCreateCudaRuntime"));
  if (factory == nullptr) {
    return UnavailableGpuRuntime(
        absl::StrCat(chosen, " is not musterd's GPU plugin (no MusterCreateCudaRuntime)"));
  }
  MLOG(INFO) << "GPU plugin " << chosen << " loaded";
  // The library stays loaded for the life of the process.
  return std::unique_ptr<GpuRuntime>(factory());
}

}  // namespace muster
