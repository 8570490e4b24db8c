#include "backends/nccl/nccl_errors.h"

#include "absl/strings/str_cat.h"

namespace muster {

absl::Status NcclStatus(ncclResult_t result, absl::string_view what, absl::string_view detail) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  if (!detail.empty()) absl::StrAppend(&message, ": ", detail);
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
      return absl::AbortedError(message);
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInProgress:
      return absl::UnavailableError(message);
    case ncclUnhandledCudaError:
    case ncclInternalError:
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorMapBufferObjectFailed:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace muster
