// musterd-fakegpu: musterd with FakeGpuRuntime instead of CUDA/NCCL, for
// tests of the GPU path on machines without a GPU (ranks use
// ShmCudaDriver). Test-only.
#include "daemon/gpu/fake_gpu_runtime.h"
#include "daemon/musterd_cli.h"

int main(int argc, char** argv) {
  return muster::RunMusterd(argc, argv, [](muster::DaemonOptions& options) {
    options.gpu_runtime = [] { return std::make_unique<muster::FakeGpuRuntime>(); };
  });
}
