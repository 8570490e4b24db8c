#include "muster/types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace muster {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kComplex64:
      return 8;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
    case DType::kComplex128:
      return 16;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kComplex64:
      return "complex64";
    case DType::kComplex128:
      return "complex128";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kBand:
      return "BAND";
    case ReduceOp::kBor:
      return "BOR";
    case ReduceOp::kBxor:
      return "BXOR";
    case ReduceOp::kPremulSum:
      return "PREMUL_SUM";
  }
  return "UNKNOWN";
}

absl::StatusOr<DType> ParseDType(const char* name) {
  struct Alias {
    const char* name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float16", DType::kFloat16},     {"fp16", DType::kFloat16},
      {"half", DType::kFloat16},        {"bfloat16", DType::kBFloat16},
      {"bf16", DType::kBFloat16},       {"float32", DType::kFloat32},
      {"fp32", DType::kFloat32},        {"float", DType::kFloat32},
      {"float64", DType::kFloat64},     {"fp64", DType::kFloat64},
      {"double", DType::kFloat64},      {"int8", DType::kInt8},
      {"uint8", DType::kUInt8},         {"int32", DType::kInt32},
      {"int", DType::kInt32},           {"int64", DType::kInt64},
      {"long", DType::kInt64},          {"bool", DType::kBool},
      {"complex64", DType::kComplex64}, {"complex128", DType::kComplex128},
  };
  if (name == nullptr) return absl::InvalidArgumentError("dtype name is null");
  const absl::string_view s(name);
  for (const Alias& alias : kAliases) {
    if (s == alias.name) return alias.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype \"", s,
      "\" (expected float16|fp16|half, bfloat16|bf16, float32|fp32|float, float64|fp64|double, "
      "int8, uint8, int32|int, int64|long, bool, complex64, complex128)"));
}

}  // namespace muster
