#include "backends/nccl/nccl_info.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"

namespace muster {

GpuStackInfo QueryGpuStack() {
  GpuStackInfo info;
  ncclGetVersion(&info.nccl_version);
  cudaRuntimeGetVersion(&info.cuda_runtime_version);
  cudaError_t err = cudaGetDeviceCount(&info.device_count);
  if (err != cudaSuccess) {
    info.device_count = 0;
    info.device_error = cudaGetErrorString(err);
  }
  return info;
}

std::string FormatNcclVersion(int code) {
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return absl::StrCat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

}  // namespace muster
