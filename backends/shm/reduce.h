// Element types, reduce operations and the CPU reduction kernels that every
// muster collective uses. Semantics follow PyTorch (torch.distributed):
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

namespace muster {

enum class DType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
  kComplex64 = 9,
  kComplex128 = 10,
};
inline constexpr int kNumDTypes = 11;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
  kPremulSum = 8,
};
inline constexpr int kNumReduceOps = 9;

// Bytes per element (complex64: 8, complex128: 16, bool: 1).
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);     // "float32", "bfloat16", ...
const char* ReduceOpName(ReduceOp op);  // "SUM", "PREMUL_SUM", ...
// Parses "float32" / "fp32" / "int64" / ... (for tools); InvalidArgument otherwise.
absl::StatusOr<DType> ParseDType(const char* name);

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
