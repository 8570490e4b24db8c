// Loading the GPU runtime plugin (libmuster_cuda.so, built from
// //backends/nccl:libmuster_cuda.so) into musterd. musterd links neither
// CUDA nor NCCL: the plugin does, and is loaded with dlopen when the daemon
// starts. Without the plugin or its libraries the daemon still runs, and
// every GPU request fails with FAILED_PRECONDITION naming what is missing.
//
// Thread-safe.
#ifndef MUSTER_DAEMON_GPU_GPU_RUNTIME_LOADER_H_
#define MUSTER_DAEMON_GPU_GPU_RUNTIME_LOADER_H_

#include <memory>
#include <string>
#include <vector>

#include "backends/nccl/gpu_runtime.h"

namespace muster {

// Where musterd looks for the plugin when --gpu-plugin is not given: next
// to the binary, the Bazel output tree, then /usr/lib/muster.
std::vector<std::string> DefaultGpuPluginPaths();

// Loads the plugin at `path` ("" = the first of DefaultGpuPluginPaths that
// exists). Never fails: if loading does not work, the runtime returned
// reports why through Unavailable() and fails every call.
std::unique_ptr<GpuRuntime> LoadGpuRuntime(const std::string& path);

// A runtime that can do nothing, saying `reason`.
std::unique_ptr<GpuRuntime> UnavailableGpuRuntime(std::string reason);

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_GPU_RUNTIME_LOADER_H_
