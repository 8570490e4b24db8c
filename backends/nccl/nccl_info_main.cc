// muster-gpu-info: prints the NCCL and CUDA runtime versions and the devices
// this machine exposes. Exit 0 always; it is a report, not a check.
#include <cstdio>

#include "backends/nccl/nccl_info.h"

int main() {
  muster::GpuStackInfo info = muster::QueryGpuStack();
  std::printf("nccl          %s\n", muster::FormatNcclVersion(info.nccl_version).c_str());
  std::printf("cuda runtime  %d.%d\n", info.cuda_runtime_version / 1000,
              (info.cuda_runtime_version % 1000) / 10);
  std::printf("devices       %d%s%s\n", info.device_count, info.device_error.empty() ? "" : "  ",
              info.device_error.c_str());
  return 0;
}
