// How muster's dtypes and reduce ops map onto NCCL's types and ops
// (nccl.h's constants only: nothing here links NCCL or CUDA).
//
// Reductions follow PyTorch's NCCL backend: SUM/PRODUCT/MIN/MAX/AVG map to
// NCCL's ops; PREMUL_SUM uses a per-call NCCL op
// (ncclRedOpCreatePreMulSum); bool is reduced as uint8 (SUM/MAX are
// logical OR through ncclMax, PRODUCT/MIN logical AND through ncclMin);
// complex dtypes go through their real view (twice the elements) for
// SUM/AVG/PREMUL_SUM. NCCL has no bitwise reductions: BAND/BOR/BXOR are
// InvalidArgument. Data-movement collectives move bytes (ncclUint8), so
// every dtype works there.
//
// Stateless; thread-safe.
#ifndef MUSTER_BACKENDS_NCCL_NCCL_MAPPING_H_
#define MUSTER_BACKENDS_NCCL_NCCL_MAPPING_H_

#include <nccl.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/shm/reduce.h"

namespace muster {

// NCCL's element type for `dtype` in a reduction (complex: its real part's
// type; bool: uint8).
absl::StatusOr<ncclDataType_t> NcclReduceType(DType dtype);

// One reduction as NCCL runs it.
struct NcclReduction {
  ncclDataType_t type = ncclFloat32;
  size_t count = 0;          // elements of `type` (complex: 2 per element)
  ncclRedOp_t op = ncclSum;  // meaningless when premul_sum
  bool premul_sum = false;   // create the op per call with `scale`
  double scale = 1.0;
};

// Maps a reduction of `count` elements of `dtype`. InvalidArgument names the
// dtype and op when NCCL (or PyTorch) cannot do it.
absl::StatusOr<NcclReduction> MapReduction(DType dtype, ReduceOp op, size_t count, double scale);

// The premul scalar in NCCL's `type` (half/bfloat16/float/double), written
// to `storage` (at least 8 bytes); what ncclRedOpCreatePreMulSum reads.
void EncodePremulScalar(ncclDataType_t type, double scale, void* storage);

}  // namespace muster

#endif  // MUSTER_BACKENDS_NCCL_NCCL_MAPPING_H_
