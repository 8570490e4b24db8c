// The dtype/op mapping onto NCCL (nccl_mapping) and the translation of
// NCCL/CUDA errors (nccl_errors).
#include "backends/nccl/nccl_mapping.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "backends/nccl/nccl_errors.h"

namespace muster {
namespace {

TEST_CASE("reductions map to NCCL ops the way PyTorch's NCCL backend does") {
  auto sum = MapReduction(DType::kFloat32, ReduceOp::kSum, 10, 1.0);
  REQUIRE(sum.ok());
  CHECK(sum->type == ncclFloat32);
  CHECK(sum->op == ncclSum);
  CHECK(sum->count == 10);
  CHECK_FALSE(sum->premul_sum);

  CHECK(MapReduction(DType::kFloat16, ReduceOp::kAvg, 1, 1)->op == ncclAvg);
  CHECK(MapReduction(DType::kFloat16, ReduceOp::kAvg, 1, 1)->type == ncclFloat16);
  CHECK(MapReduction(DType::kBFloat16, ReduceOp::kMax, 1, 1)->type == ncclBfloat16);
  CHECK(MapReduction(DType::kInt64, ReduceOp::kProduct, 1, 1)->op == ncclProd);
  CHECK(MapReduction(DType::kInt8, ReduceOp::kMin, 1, 1)->type == ncclInt8);
  CHECK(MapReduction(DType::kUInt8, ReduceOp::kMax, 1, 1)->type == ncclUint8);
  CHECK(MapReduction(DType::kInt32, ReduceOp::kSum, 1, 1)->type == ncclInt32);
  CHECK(MapReduction(DType::kFloat64, ReduceOp::kSum, 1, 1)->type == ncclFloat64);
}

TEST_CASE("bool reduces as uint8: SUM/MAX are OR (max), PRODUCT/MIN are AND (min)") {
  CHECK(MapReduction(DType::kBool, ReduceOp::kSum, 4, 1)->op == ncclMax);
  CHECK(MapReduction(DType::kBool, ReduceOp::kMax, 4, 1)->op == ncclMax);
  CHECK(MapReduction(DType::kBool, ReduceOp::kProduct, 4, 1)->op == ncclMin);
  CHECK(MapReduction(DType::kBool, ReduceOp::kMin, 4, 1)->op == ncclMin);
  CHECK(MapReduction(DType::kBool, ReduceOp::kSum, 4, 1)->type == ncclUint8);
}

TEST_CASE("complex reduces through its real view, doubling the element count") {
  auto c64 = MapReduction(DType::kComplex64, ReduceOp::kSum, 5, 1);
  REQUIRE(c64.ok());
  CHECK(c64->type == ncclFloat32);
  CHECK(c64->count == 10);
  auto c128 = MapReduction(DType::kComplex128, ReduceOp::kPremulSum, 3, 0.5);
  REQUIRE(c128.ok());
  CHECK(c128->type == ncclFloat64);
  CHECK(c128->count == 6);
  CHECK(c128->premul_sum);
  CHECK(c128->scale == 0.5);
  // MAX has no meaning on complex numbers (PyTorch rejects it too).
  auto bad = MapReduction(DType::kComplex64, ReduceOp::kMax, 1, 1);
  CHECK(absl::IsInvalidArgument(bad.status()));
}

TEST_CASE("bitwise reductions and bad combinations are InvalidArgument naming both") {
  auto band = MapReduction(DType::kInt32, ReduceOp::kBand, 1, 1);
  CHECK(absl::IsInvalidArgument(band.status()));
  CHECK(band.status().message().find("BAND") != std::string::npos);
  CHECK(band.status().message().find("bitwise") != std::string::npos);
  CHECK(absl::IsInvalidArgument(MapReduction(DType::kBool, ReduceOp::kBxor, 1, 1).status()));
  // AVG on integers: PyTorch's rule, whatever the backend.
  auto avg = MapReduction(DType::kInt32, ReduceOp::kAvg, 1, 1);
  CHECK(absl::IsInvalidArgument(avg.status()));
  CHECK(
      absl::IsInvalidArgument(MapReduction(static_cast<DType>(40), ReduceOp::kSum, 1, 1).status()));
}

TEST_CASE("the PREMUL_SUM scalar is encoded in the reduction's type") {
  unsigned char storage[8];
  EncodePremulScalar(ncclFloat32, 0.25, storage);
  float f;
  std::memcpy(&f, storage, 4);
  CHECK(f == 0.25f);
  EncodePremulScalar(ncclFloat64, 0.125, storage);
  double d;
  std::memcpy(&d, storage, 8);
  CHECK(d == 0.125);
  EncodePremulScalar(ncclFloat16, 2.0, storage);
  uint16_t h;
  std::memcpy(&h, storage, 2);
  CHECK(HalfToFloat(h) == 2.0f);
  EncodePremulScalar(ncclBfloat16, -3.0, storage);
  std::memcpy(&h, storage, 2);
  CHECK(BFloat16ToFloat(h) == -3.0f);
}

TEST_CASE("NCCL errors become statuses with NCCL's text and a matching code") {
  CHECK(NcclStatus(ncclSuccess, "x").ok());
  absl::Status usage = NcclStatus(ncclInvalidUsage, "ncclAllReduce", "count too large");
  CHECK(absl::IsInvalidArgument(usage));
  CHECK(usage.message().find("ncclAllReduce: ") == 0);
  CHECK(usage.message().find("count too large") != std::string::npos);
  CHECK(absl::IsAborted(NcclStatus(ncclRemoteError, "op")));
  CHECK(absl::IsUnavailable(NcclStatus(ncclSystemError, "op")));
  CHECK(absl::IsInternal(NcclStatus(ncclInternalError, "op")));
  CHECK(absl::IsUnavailable(NcclStatus(ncclInProgress, "op")));
}

TEST_CASE("CUDA errors become statuses naming the call and the error") {
  CHECK(CudaStatus(cudaSuccess, "x").ok());
  absl::Status none = CudaStatus(cudaErrorNoDevice, "cudaSetDevice");
  CHECK(absl::IsFailedPrecondition(none));
  CHECK(none.message().find("cudaSetDevice: cudaErrorNoDevice") == 0);
  CHECK(absl::IsInvalidArgument(CudaStatus(cudaErrorInvalidResourceHandle, "open")));
  CHECK(absl::IsInternal(CudaStatus(cudaErrorLaunchFailure, "launch")));
}

}  // namespace
}  // namespace muster
