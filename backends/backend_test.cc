#include "backends/backend.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

// A third-party backend, registered by name like c10d's register_backend.
class EchoBackend : public Backend {
 public:
  explicit EchoBackend(BackendOptions options) : options_(std::move(options)) {}
  const std::string& name() const override { return name_; }
  const BackendOptions& options() const override { return options_; }

 private:
  std::string name_ = "echo";
  BackendOptions options_;
};

// Stand-ins for the names the SDK registers (backends/builtin, the GPU path).
void RegisterStandIns() {
  static bool done = [] {
    for (auto [name, device] :
         {std::pair<const char*, const char*>{"gloo", "cpu"}, {"shm", "cpu"}, {"nccl", "cuda"}}) {
      (void)BackendRegistry::Global().Register(
          name,
          [](const BackendOptions&) -> absl::StatusOr<std::unique_ptr<Backend>> {
            return absl::UnimplementedError("stand-in");
          },
          {device});
    }
    return true;
  }();
  (void)done;
}

TEST_CASE("backend configs parse to a device map") {
  RegisterStandIns();
  auto& r = BackendRegistry::Global();
  CHECK(*r.Parse("gloo") == BackendConfig{{"cpu", "gloo"}});
  CHECK(*r.Parse("NCCL") == BackendConfig{{"cuda", "nccl"}});
  CHECK(*r.Parse("cpu:gloo,cuda:nccl") == BackendConfig{{"cpu", "gloo"}, {"cuda", "nccl"}});
  CHECK(FormatBackendConfig(*r.Parse(" cuda:nccl , cpu:gloo")) == "cpu:gloo,cuda:nccl");
}

TEST_CASE("unknown names and malformed configs are clear errors") {
  RegisterStandIns();
  auto& r = BackendRegistry::Global();
  auto unknown = r.Parse("mpi");
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(unknown.status().message()).find("unknown backend 'mpi'") == 0);
  CHECK(std::string(r.Parse("cpu:").status().message()).find("malformed backend config") == 0);
  CHECK(std::string(r.Parse("cpu:gloo,,").status().message()).find("malformed") == 0);
  CHECK(std::string(r.Parse("tpu:gloo").status().message()).find("unknown device 'tpu'") == 0);
  CHECK(std::string(r.Parse("cuda:gloo").status().message()) ==
        "backend 'gloo' does not support device 'cuda'");
  CHECK(std::string(r.Parse("cpu:gloo,cpu:shm").status().message()).find("appears twice") !=
        std::string::npos);
  CHECK(r.Parse("").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a third party registers a backend by name and groups can use it") {
  RegisterStandIns();
  auto& r = BackendRegistry::Global();
  REQUIRE(RegisterBackend("echo",
                          [](const BackendOptions& o) -> absl::StatusOr<std::unique_ptr<Backend>> {
                            return std::make_unique<EchoBackend>(o);
                          },
                          {"cpu"})
              .ok());
  CHECK(*r.Parse("echo") == BackendConfig{{"cpu", "echo"}});
  CHECK(*r.Parse("cpu:echo,cuda:nccl") == BackendConfig{{"cpu", "echo"}, {"cuda", "nccl"}});
  BackendOptions options;
  options.group_name = "g";
  options.group_rank = 1;
  options.group_size = 3;
  auto backend = r.Create("echo", options);
  REQUIRE(backend.ok());
  CHECK((*backend)->name() == "echo");
  CHECK((*backend)->rank() == 1);
  CHECK((*backend)->size() == 3);
  CHECK(RegisterBackend("echo",
                        [](const BackendOptions&) -> absl::StatusOr<std::unique_ptr<Backend>> {
                          return absl::UnimplementedError("x");
                        },
                        {"cpu"})
            .code() == absl::StatusCode::kAlreadyExists);
  CHECK(RegisterBackend("bad name", nullptr, {"cpu"}).code() == absl::StatusCode::kInvalidArgument);
  // Built-in names are muster's even before the SDK registered them.
  CHECK(RegisterBackend("shm",
                        [](const BackendOptions&) -> absl::StatusOr<std::unique_ptr<Backend>> {
                          return absl::UnimplementedError("x");
                        },
                        {"cpu"})
            .code() == absl::StatusCode::kAlreadyExists);
  CHECK(RegisterBackend("tpuback",
                        [](const BackendOptions&) -> absl::StatusOr<std::unique_ptr<Backend>> {
                          return absl::UnimplementedError("x");
                        },
                        {"tpu"})
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.Create("nope", options).status().code() == absl::StatusCode::kNotFound);
  CHECK((*backend)->communicator() == nullptr);  // a backend may run no collectives
}

TEST_CASE("ParseSyntax accepts unregistered names but not malformed configs") {
  CHECK(FormatBackendConfig(*BackendRegistry::ParseSyntax("someone-elses")) == "someone-elses");
  CHECK(*BackendRegistry::ParseSyntax("cpu:x,cuda:y") ==
        BackendConfig{{"cpu", "x"}, {"cuda", "y"}});
  CHECK_FALSE(BackendRegistry::ParseSyntax("cpu:x,cpu:y").ok());
  CHECK_FALSE(BackendRegistry::ParseSyntax("tpu:x").ok());
  CHECK_FALSE(BackendRegistry::ParseSyntax("a b").ok());
  CHECK_FALSE(BackendRegistry::ParseSyntax("cpu:").ok());
}

}  // namespace
}  // namespace muster
