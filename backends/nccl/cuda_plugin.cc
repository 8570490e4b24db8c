// libmuster_cuda.so: the CUDA/NCCL runtime as a plugin that musterd loads
// with dlopen, so that musterd itself links neither CUDA nor NCCL and runs
// on machines without them (GPU requests then fail saying why).
#include "backends/nccl/cuda_nccl_runtime.h"

extern "C" {

// The plugin's only entry point: a new runtime, owned by the caller.
__attribute__((visibility("default"))) muster::GpuRuntime* MusterCreateCudaRuntime() {
  return new muster::CudaNcclRuntime();
}

}  // extern "C"
