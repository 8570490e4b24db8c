// How NCCL and CUDA error codes become absl::Status values naming what
// failed. Links NCCL and the CUDA runtime (for their error strings): only
// the CUDA runtime plugin and GPU tools use it.
//
// Stateless; thread-safe.
#ifndef MUSTER_BACKENDS_NCCL_NCCL_ERRORS_H_
#define MUSTER_BACKENDS_NCCL_NCCL_ERRORS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace muster {

// ncclSuccess -> OK. Otherwise a status whose code reflects the error
// (invalid usage/argument -> InvalidArgument, remote/system errors ->
// Aborted or Unavailable, in progress -> Unavailable) and whose message
// reads "<what>: <ncclGetErrorString>[: <detail>]".
absl::Status NcclStatus(ncclResult_t result, absl::string_view what, absl::string_view detail = "");

// cudaSuccess -> OK; otherwise "<what>: <cudaGetErrorName> (<string>)",
// FailedPrecondition for "no device / driver" errors, Internal otherwise.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace muster

#endif  // MUSTER_BACKENDS_NCCL_NCCL_ERRORS_H_
