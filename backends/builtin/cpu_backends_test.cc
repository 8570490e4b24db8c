// The built-in CPU backends' factories: registered by name, and clear
// errors for groups they cannot serve. (They run collectives in every
// multi-process test: world_test, two_node_test, the Python suites.)
#include "backends/builtin/cpu_backends.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

BackendOptions Group(int size) {
  BackendOptions o;
  o.group_name = "g";
  o.group_rank = 0;
  o.group_size = size;
  for (int r = 0; r < size; ++r) o.global_ranks.push_back(r);
  o.device = "cpu";
  o.timeout = absl::Seconds(1);
  return o;
}

TEST_CASE("gloo and shm are registered for the cpu device") {
  RegisterBuiltinCpuBackends();
  RegisterBuiltinCpuBackends();  // idempotent
  auto& r = BackendRegistry::Global();
  CHECK(r.Devices("gloo") == std::vector<std::string>{"cpu"});
  CHECK(r.Devices("shm") == std::vector<std::string>{"cpu"});
}

TEST_CASE("shm refuses groups it cannot serve; gloo needs a store without shared memory") {
  RegisterBuiltinCpuBackends();
  auto& r = BackendRegistry::Global();
  auto no_segment = r.Create("shm", Group(2));
  CHECK(no_segment.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(no_segment.status().message().find("every member on one node") != std::string::npos);
  BackendOptions spanning = Group(4);
  spanning.shm_name = "/muster.test.none";
  spanning.shm_group_ranks = {0, 1};
  CHECK(r.Create("shm", spanning).status().code() == absl::StatusCode::kFailedPrecondition);
  auto no_store = r.Create("gloo", Group(2));
  CHECK(no_store.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(no_store.status().message().find("no store") != std::string::npos);
  // A segment musterd did not make cannot be opened: the error says so.
  BackendOptions local = Group(2);
  local.shm_name = "/muster.test.missing";
  CHECK_FALSE(r.Create("gloo", local).ok());
}

}  // namespace
}  // namespace muster
