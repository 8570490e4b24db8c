#include "backends/nccl/nccl_mapping.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace muster {

absl::StatusOr<ncclDataType_t> NcclReduceType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat32:
    case DType::kComplex64:
      return ncclFloat32;
    case DType::kFloat64:
    case DType::kComplex128:
      return ncclFloat64;
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
    case DType::kBool:
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", static_cast<int>(dtype), " has no NCCL type"));
}

absl::StatusOr<NcclReduction> MapReduction(DType dtype, ReduceOp op, size_t count, double scale) {
  if (static_cast<int>(dtype) >= kNumDTypes || static_cast<int>(op) >= kNumReduceOps) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype),
                                                   " or reduce op ", static_cast<int>(op)));
  }
  // The semantic rules are muster's (PyTorch's), whatever the backend.
  if (absl::Status s = CheckReduce(dtype, op); !s.ok()) return s;
  if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    return absl::InvalidArgumentError(absl::StrCat("reduce op ", ReduceOpName(op), " on ",
                                                   DTypeName(dtype),
                                                   ": NCCL has no bitwise reductions"));
  }
  NcclReduction r;
  auto type = NcclReduceType(dtype);
  if (!type.ok()) return type.status();
  r.type = *type;
  r.count = (dtype == DType::kComplex64 || dtype == DType::kComplex128) ? 2 * count : count;
  r.scale = scale;
  const bool is_bool = dtype == DType::kBool;
  switch (op) {
    case ReduceOp::kSum:
      r.op = is_bool ? ncclMax : ncclSum;
      break;
    case ReduceOp::kAvg:
      r.op = ncclAvg;
      break;
    case ReduceOp::kProduct:
      r.op = is_bool ? ncclMin : ncclProd;
      break;
    case ReduceOp::kMin:
      r.op = ncclMin;
      break;
    case ReduceOp::kMax:
      r.op = ncclMax;
      break;
    case ReduceOp::kPremulSum:
      r.op = ncclSum;
      r.premul_sum = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("reduce op ", ReduceOpName(op), " is not supported by NCCL"));
  }
  return r;
}

void EncodePremulScalar(ncclDataType_t type, double scale, void* storage) {
  std::memset(storage, 0, 8);
  switch (type) {
    case ncclFloat16: {
      uint16_t h = FloatToHalf(static_cast<float>(scale));
      std::memcpy(storage, &h, sizeof(h));
      break;
    }
    case ncclBfloat16: {
      uint16_t b = FloatToBFloat16(static_cast<float>(scale));
      std::memcpy(storage, &b, sizeof(b));
      break;
    }
    case ncclFloat64:
      std::memcpy(storage, &scale, sizeof(scale));
      break;
    default: {
      float f = static_cast<float>(scale);
      std::memcpy(storage, &f, sizeof(f));
      break;
    }
  }
}

}  // namespace muster
