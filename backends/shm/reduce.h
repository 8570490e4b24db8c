// The CPU reduction kernels that every muster collective uses, over the
// element types and reduce operations of muster/types.h. Semantics follow
// PyTorch (torch.distributed):
//  - SUM, PRODUCT, MIN, MAX on every numeric dtype; on bool SUM/MAX are
//    logical OR and PRODUCT/MIN logical AND.
//  - BAND, BOR, BXOR on integer dtypes and bool only.
//  - AVG: the sum divided by the number of contributions; floating point
//    only (PyTorch rejects AVG on integers).
//  - PREMUL_SUM: each contribution is multiplied by `scale` before the sum;
//    floating point only.
//  - float16 and bfloat16 accumulate element by element in contribution
//    order, converting each partial result back to the 16-bit type (what
//    PyTorch's CPU/gloo path does); other types accumulate natively.
//  - complex64/complex128 are reduced through their real view (2 floats or
//    doubles per element) for SUM, AVG and PREMUL_SUM; other ops on complex
//    are an error.
// Anything else is InvalidArgument naming the dtype and the op.
//
// Stateless; thread-safe.
#ifndef MUSTER_BACKENDS_SHM_REDUCE_H_
#define MUSTER_BACKENDS_SHM_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muster/types.h"

namespace muster {

// OK if `op` applies to `dtype`, else InvalidArgument such as
// "reduce op BXOR does not support dtype float32".
absl::Status CheckReduce(DType dtype, ReduceOp op);

// A reduction over contributions c_0, c_1, ..., c_{n-1} (in that order) of
// `count` elements each is computed as
//   ReduceInit(acc, c_0); ReduceInto(acc, c_1); ...; ReduceFinish(acc, n)
// which leaves the result in `acc`. `acc` may alias c_0 for ReduceInit.
// Callers must have checked CheckReduce(dtype, op).
void ReduceInit(void* acc, const void* first, size_t count, DType dtype, ReduceOp op, double scale);
void ReduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op, double scale);
void ReduceFinish(void* acc, size_t count, DType dtype, ReduceOp op, int contributions);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_REDUCE_H_
