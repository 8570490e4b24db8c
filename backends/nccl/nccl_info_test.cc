// Runs in CI without a GPU: proves NCCL and the CUDA runtime link and load.
#include "backends/nccl/nccl_info.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

TEST_CASE("NCCL 2.x and the CUDA 13 runtime are linked and answer without a GPU") {
  GpuStackInfo info = QueryGpuStack();
  CHECK(info.nccl_version / 10000 == 2);
  CHECK(info.cuda_runtime_version / 1000 >= 12);
  CHECK(info.device_count >= 0);
}

TEST_CASE("FormatNcclVersion spells major.minor.patch") {
  CHECK(FormatNcclVersion(22803) == "2.28.3");
}

}  // namespace
}  // namespace muster
