// What the CUDA runtime and NCCL linked into this binary report: versions
// and visible devices. The only code outside //backends/nccl that may learn
// about the GPU stack is through this target's binary, never by linking it.
//
// Thread-safe (stateless).
#ifndef MUSTER_BACKENDS_NCCL_NCCL_INFO_H_
#define MUSTER_BACKENDS_NCCL_NCCL_INFO_H_

#include <string>

namespace muster {

struct GpuStackInfo {
  int nccl_version = 0;          // e.g. 22803 for 2.28.3
  int cuda_runtime_version = 0;  // e.g. 13000
  int device_count = 0;          // 0 when no device or no driver
  std::string device_error;      // why device_count is 0, if an error said so
};

GpuStackInfo QueryGpuStack();

// "2.28.3" from 22803.
std::string FormatNcclVersion(int code);

}  // namespace muster

#endif  // MUSTER_BACKENDS_NCCL_NCCL_INFO_H_
