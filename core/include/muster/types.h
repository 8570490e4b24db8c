// The value types every layer of muster shares: element types (DType) and
// reduce operations (ReduceOp), numbered as in the C API (muster.h) and the
// wire formats, with their names and sizes. Which op applies to which dtype
// (and the kernels) is backends/shm/reduce.h's business.
//
// Stateless; thread-safe.
#ifndef MUSTER_CORE_INCLUDE_MUSTER_TYPES_H_
#define MUSTER_CORE_INCLUDE_MUSTER_TYPES_H_

#include <cstddef>
#include <cstdint>

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

}  // namespace muster

#endif  // MUSTER_CORE_INCLUDE_MUSTER_TYPES_H_
